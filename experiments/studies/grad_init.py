r"""Experiment 1: gradient norms at initialization (Xiong et al. 2020, Fig. 3 and Theorem 1).

For Post-LN and Pre-LN stacks of several depths :math:`L` (LayerNorm and RMSNorm), the
Frobenius norm of every layer's weight-matrix gradient (``attn_qkv``, ``attn_out``, ``mlp_in``,
``mlp_out``) of the language-modelling loss at initialization, averaged over batches and seeds
(``experiments.harness.probes.grad_norms_at_init``), plotted against the layer index. Derived numbers:

* the last/first-layer ratio of the ``mlp_out`` (:math:`W^{2}`) gradient norm; the theory says
  it grows with depth for Post-LN and is about 1 for Pre-LN;
* the slope of :math:`\log \|\partial \mathcal L / \partial W^{2,L}\|` against :math:`\log L`:
  0 for Post-LN, :math:`-1/2` for Pre-LN (:math:`O(d\sqrt{\ln d})` vs :math:`O(d\sqrt{\ln d / L})`);
* the mean squared entry :math:`E\|x_l\|^2/d` of every norm input, attention and FFN
  sub-layers reported separately (their Lemma 2: for Pre-LN each FFN sub-layer adds between
  1/2 and 3/2; Post-LN's FFN norm inputs are near 3/2, its attention norm inputs only bounded
  in [1, 2]).

Gradient norms are those of the *expected* gradient, :math:`\|E_\text{batch}\, g\|` (the
norm of the batch-mean gradient, as in Theorem 1), per seed, then averaged over seeds.

The paper's setting is Xavier initialization; its theory (Lemmas 1-2, Theorem 1) further
assumes ReLU, :math:`d_\text{ff} = d`, :math:`W^Q = W^K = 0` and a unit-variance input. That
*theory-faithful variant* (``theory``: ``activation="relu"``, ``d_ff = d_model``,
``qk_zero_init=True``, ``embed_scale = 2 ** -0.5`` so that token plus position embedding has
unit variance) is where the lemma checks are read; the GPT-2 "small" initialization is shown
beside them, because at small scale the initialization decides how different Post-LN and
Pre-LN look.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.suite.study import Unit

from experiments.studies.grad_init_rules import LEMMA2_INCREMENT, verdicts
from jaxnorm.models import WEIGHT_GROUPS

TITLE = "Gradient norms at initialization (Xiong et al. 2020, Fig. 3 / Theorem 1)"
RAW_DATA = ('data.json', 'grad_norms.csv')  # files the report links under the claims
HEADLINE = ("depth_scaling_and_residuals.png",)  # figures of the report's first screen


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the gradient-norm experiment.

  Attributes:
    depths: numbers of layers of the main (Xavier) grid.
    seeds: initialization seeds (each with its own batches); results are averaged.
    n_batches: batches per seed.
    norm_types: ``"layer_norm"`` and/or ``"rms_norm"`` for the main grid.
    small_init: also run GPT-2's small init (LayerNorm) at ``variant_depths``.
    theory: also run the theory-faithful variant (ReLU, d_ff = d, W^Q = W^K = 0, unit-variance
      input; Xavier, LayerNorm) at ``variant_depths``; the lemma checks are read there.
    variant_depths: depths of the small-init and W^Q = W^K = 0 runs (default: ``depths``).
  """

  depths: tuple = (6, 12, 24)
  seeds: tuple = (0, 1)
  n_batches: int = 2
  norm_types: tuple = ("layer_norm", "rms_norm")
  small_init: bool = True
  theory: bool = True
  variant_depths: tuple | None = None


def settings(cfg: Config) -> list[dict]:
  """Every (setting, position, norm, depth) to measure."""
  out = []
  for norm in cfg.norm_types:
    for L in cfg.depths:
      for pos in ("post", "pre"):
        out.append({"setting": "xavier", "norm_position": pos, "norm_type": norm, "n_layers": L,
                    "init": "xavier", "qk_zero_init": False})
  vdepths = cfg.variant_depths or cfg.depths
  for name, flag, init, qk in (("theory", cfg.theory, "xavier", True),
                               ("small", cfg.small_init, "small", False)):
    if not flag:
      continue
    for L in vdepths:
      for pos in ("post", "pre"):
        out.append({"setting": name, "norm_position": pos, "norm_type": "layer_norm", "n_layers": L,
                    "init": init, "qk_zero_init": qk})
  return out


def model_fields(s: dict, d_model: int) -> dict:
  """The :class:`~jaxnorm.models.TransformerConfig` fields of a :func:`settings` entry."""
  out = {"norm_position": s["norm_position"], "norm_type": s["norm_type"], "n_layers": s["n_layers"],
         "init": s["init"], "qk_zero_init": s["qk_zero_init"]}
  if s["setting"] == "theory":
    out.update(activation="relu", d_ff=d_model, embed_scale=2 ** -0.5)
  return out


def key(s: dict) -> str:
  """The key of a :func:`settings` entry: ``"<setting>/<position>/<norm>/L<depth>"``."""
  return f"{s['setting']}/{s['norm_position']}/{s['norm_type']}/L{s['n_layers']}"


def measure(ctx, cfg: Config) -> dict:
  """Runs grad_norms_at_init for every setting and seed; returns seed-averaged results.

  Each (setting, seed) is one cached unit (:meth:`~experiments.suite.context.Context.cached`),
  so a cut run resumes at the first setting and seed it had not finished.
  """
  from experiments.harness import probes
  corpus = ctx.corpus()
  tcfg = ctx.preset["train"]
  results = {}
  for s in ctx.iterate(settings(cfg), desc="settings"):
    mc = ctx.model_config(**model_fields(s, ctx.preset["model"]["d_model"]))
    per_seed = []
    for seed in cfg.seeds:
      kw = dict(batch_size=tcfg["batch_size"], seq_len=tcfg["seq_len"], seed=seed,
                n_batches=cfg.n_batches)
      per_seed.append(ctx.cached(f"{key(s)}/s{seed}", {"model": mc, "data": ctx.preset.get("data"), **kw},
                                 lambda mc=mc, kw=kw: probes.grad_norms_at_init(mc, corpus, **kw)))
    mean = {k: np.mean([np.asarray(r[k], np.float64) for r in per_seed], axis=0).tolist()
            for k in (*WEIGHT_GROUPS, "residual_sq_norm", "grad_norm")}
    mean["ratio_per_seed"] = [float(r["mlp_out"][-1] / r["mlp_out"][0]) for r in per_seed]
    mean["last_per_seed"] = [float(r["mlp_out"][-1]) for r in per_seed]
    results[key(s)] = {**s, **mean}
  return results


def ratio(r: dict, group: str = "mlp_out") -> float:
  """Last/first-layer gradient-norm ratio of the seed-averaged norms."""
  return float(r[group][-1] / r[group][0])


def _slope(depths, values) -> float:
  if len(depths) < 2:
    return float("nan")
  return float(np.polyfit(np.log(depths), np.log(values), 1)[0])


def analyse(results: dict, cfg: Config) -> dict:
  """Ratios, depth slopes and residual-norm statistics."""
  out = {"ratios": {}, "slopes": {}, "residual": {}}
  for k, r in results.items():
    out["ratios"][k] = {g: ratio(r, g) for g in WEIGHT_GROUPS}
    out["ratios"][k]["mlp_out_per_seed"] = r["ratio_per_seed"]
  combos = sorted({(r["setting"], r["norm_position"], r["norm_type"]) for r in results.values()})
  for setting, pos, norm in combos:
    rows = sorted((r for r in results.values()
                   if (r["setting"], r["norm_position"], r["norm_type"]) == (setting, pos, norm)),
                  key=lambda r: r["n_layers"])
    depths = [r["n_layers"] for r in rows]
    last = [r["mlp_out"][-1] for r in rows]
    per_seed = [r.get("last_per_seed") for r in rows]
    seed_slopes = ([_slope(depths, [p[i] for p in per_seed]) for i in range(len(per_seed[0]))]
                   if all(per_seed) else [])
    out["slopes"][f"{setting}/{pos}/{norm}"] = {"depths": depths, "last_layer": last,
                                                "slope": _slope(depths, last), "slope_per_seed": seed_slopes}
  for k, r in results.items():
    e = np.asarray(r["residual_sq_norm"])
    L = r["n_layers"]
    if r["norm_position"] == "pre":
      # Norm inputs: [attn_0, mlp_0, attn_1, ..., mlp_{L-1}, final]; the input of layer l is
      # entry 2l, the output of the last layer the final norm's input (entry 2L).
      layer_inputs = np.concatenate([e[0:2 * L:2], e[2 * L:2 * L + 1]])
      inc = np.diff(layer_inputs)
      attn_inc = e[1:2 * L:2] - e[0:2 * L:2]        # added by each attention sub-layer
      n = min(L, (len(e) - 1) // 2)                 # FFN sub-layers followed by a norm input
      ffn_inc = e[2:2 * n + 1:2] - e[1:2 * n:2]     # added by each FFN sub-layer
      out["residual"][k] = {"layer_inputs": layer_inputs.tolist(), "increments": inc.tolist(),
                            "mean_increment": float(inc.mean()),
                            "attn_increments": attn_inc.tolist(), "ffn_increments": ffn_inc.tolist(),
                            "mean_attn_increment": float(attn_inc.mean()),
                            "mean_ffn_increment": float(ffn_inc.mean()),
                            "frac_in_bounds": float(np.mean((ffn_inc >= LEMMA2_INCREMENT[0]) &
                                                            (ffn_inc <= LEMMA2_INCREMENT[1]))),
                            "frac_layers_in_bounds": float(np.mean((inc >= LEMMA2_INCREMENT[0]) &
                                                                   (inc <= LEMMA2_INCREMENT[1])))}
    elif r["norm_position"] == "post":
      attn, ffn = e[0::2], e[1::2]  # inputs of the attention and of the FFN norms
      out["residual"][k] = {"mean": float(e.mean()), "min": float(e.min()), "max": float(e.max()),
                            "attn_inputs": attn.tolist(), "ffn_inputs": ffn.tolist(),
                            "attn_mean": float(attn.mean()), "attn_min": float(attn.min()),
                            "attn_max": float(attn.max()), "ffn_mean": float(ffn.mean())}
  return out


_STYLES = {("post", "layer_norm"): ("C3", "-", "Post-LN (LN)"), ("pre", "layer_norm"): ("C0", "-", "Pre-LN (LN)"),
           ("post", "rms_norm"): ("C1", "--", "Post-LN (RMS)"), ("pre", "rms_norm"): ("C2", "--", "Pre-LN (RMS)")}


def _plot_per_layer(ctx, results: dict, cfg: Config) -> list[str]:
  """``grad_norms_xavier.png``: gradient norm per layer at each Xavier depth; see :func:`plot`."""
  files = []
  for group_set, fname in ((("mlp_out", "attn_qkv"), "grad_norms_xavier.png"),):
    fig, axes = ctx.subplots(len(group_set), len(cfg.depths), figsize=(4 * len(cfg.depths), 3.2 * len(group_set)),
                             squeeze=False)
    for gi, g in enumerate(group_set):
      for di, L in enumerate(cfg.depths):
        ax = axes[gi, di]
        for norm in cfg.norm_types:
          for pos in ("post", "pre"):
            r = results[f"xavier/{pos}/{norm}/L{L}"]
            c, ls, lab = _STYLES[(pos, norm)]
            ax.plot(np.arange(1, L + 1), r[g], ls, color=c, marker="o", ms=3, label=lab)
        ax.set_yscale("log")
        ax.set_title(f"{g} gradient norm, L={L}", fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Gradient norm per layer at initialization (Xavier; mean of {len(cfg.seeds)} seeds x "
                 f"{cfg.n_batches} batches) -- cf. Xiong et al. Fig. 3", fontsize=10)
    files.append(ctx.save_figure(fig, fname))

  return files


def _plot_init_comparison(ctx, results: dict, cfg: Config) -> list[str]:
  """``grad_norms_init_comparison.png`` if a variant ran (else nothing); see :func:`plot`."""
  files = []
  vdepths = cfg.variant_depths or cfg.depths
  variants = [("xavier", "Xavier"), *((("theory", "theory variant"),) if cfg.theory else ()),
              *((("small", "GPT-2 small init"),) if cfg.small_init else ())]
  if len(variants) > 1:
    fig, axes = ctx.subplots(1, len(vdepths), figsize=(4.5 * len(vdepths), 3.4), squeeze=False)
    for di, L in enumerate(vdepths):
      ax = axes[0, di]
      for vi, (setting, label) in enumerate(variants):
        for pos, ls in (("post", "-"), ("pre", "--")):
          k = f"{setting}/{pos}/layer_norm/L{L}"
          if k in results:
            ax.plot(np.arange(1, L + 1), results[k]["mlp_out"], ls, color=f"C{vi}", marker="o", ms=3,
                    label=f"{'Post' if pos == 'post' else 'Pre'}-LN, {label}")
      ax.set_yscale("log")
      ax.set_xlabel("layer")
      ax.set_title(f"mlp_out gradient norm, L={L}", fontsize=10)
      ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("The initialization changes the picture (LayerNorm; solid Post-LN, dashed Pre-LN)", fontsize=10)
    files.append(ctx.save_figure(fig, "grad_norms_init_comparison.png"))

  return files


def _plot_depth_scaling_and_residuals(ctx, results: dict, an: dict, cfg: Config) -> str:
  """``depth_scaling_and_residuals.png``; see :func:`plot`."""
  vdepths = cfg.variant_depths or cfg.depths
  fig, axes = ctx.subplots(1, 2, figsize=(11, 3.8))
  ax = axes[0]
  for name, s in an["slopes"].items():
    setting, pos, norm = name.split("/")
    if len(s["depths"]) < 2 or setting != "xavier":
      continue
    c, ls, lab = _STYLES[(pos, norm)]
    ax.loglog(s["depths"], s["last_layer"], ls, color=c, marker="o", label=f"{lab}: slope {s['slope']:+z.2f}")
  if len(cfg.depths) >= 2:
    d0 = np.asarray(cfg.depths, np.float64)
    ref = an["slopes"]["xavier/pre/layer_norm"]["last_layer"][0] if "xavier/pre/layer_norm" in an["slopes"] else 1.0
    ax.loglog(d0, ref * (d0 / d0[0]) ** -0.5, "k:", lw=1,
              label="L^-1/2 (slope of Theorem 1's upper bound, Pre-LN; not a prediction)")
  if len(cfg.depths) < 2:
    ax.text(0.5, 0.5, "one depth in this preset:\nno depth scaling", ha="center", va="center",
            transform=ax.transAxes)
  else:
    ax.legend(fontsize=7)
  ax.set_xlabel("number of layers L")
  ax.set_ylabel("last-layer W2 gradient norm")
  ax.set_title("Depth scaling of the last layer's gradient (Theorem 1)", fontsize=10)
  ax.grid(alpha=0.3, which="both")
  ax = axes[1]
  setting = "theory" if cfg.theory else "xavier"
  Lmax = max(vdepths if setting == "theory" else cfg.depths)
  pre = an["residual"].get(f"{setting}/pre/layer_norm/L{Lmax}")
  if pre:
    li = np.asarray(pre["layer_inputs"])
    ls_ = np.arange(len(li))
    ax.plot(ls_, li, "o-", color="C0", ms=3, label="Pre-LN: input of layer l")
    ax.fill_between(ls_, li[0] + ls_ / 2, li[0] + 3 * ls_ / 2, color="C0", alpha=0.15,
                    label="Lemma 2: +l/2 .. +3l/2")
  post = results.get(f"{setting}/post/layer_norm/L{Lmax}")
  if post:
    e = np.asarray(post["residual_sq_norm"])
    ax.plot(np.arange(0, len(e), 2) / 2, e[0::2], "s-", color="C1", ms=3, label="Post-LN: attention norm inputs")
    ax.plot(np.arange(1, len(e), 2) / 2, e[1::2], "s-", color="C3", ms=3, label="Post-LN: FFN norm inputs")
    ax.axhline(1.5, color="C3", ls=":", lw=1, label="3/2")
  ax.set_xlabel("layer l (Post-LN: two norm inputs per layer)")
  ax.set_ylabel("E||x||^2 / d")
  ax.set_title(f"Residual stream at init ({setting.replace('_', ' ')}, LN, L={Lmax})", fontsize=10)
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  return ctx.save_figure(fig, "depth_scaling_and_residuals.png")


def plot(ctx, results: dict, an: dict, cfg: Config) -> list[str]:
  """Draws the figures of the gradient-norm experiment into its folder.

  ``grad_norms_xavier.png``: ``mlp_out`` and ``attn_qkv`` gradient norm per layer at each Xavier
  depth (Post/Pre-LN, LayerNorm/RMSNorm); ``grad_norms_init_comparison.png`` (if a variant ran):
  ``mlp_out`` per layer under Xavier, W^Q = W^K = 0 and small init (LayerNorm);
  ``depth_scaling_and_residuals.png``: the last-layer W2 gradient norm against L with the
  ``L^-1/2`` reference, and ``E||x||^2/d`` of the norm inputs at the largest depth with Lemma 2's
  band and the 3/2 level.

  Args:
    ctx: the suite context (saves the figures).
    results: the seed-averaged measurements of :func:`measure`.
    an: the output of :func:`analyse`.
    cfg: the experiment's config.

  Returns:
    The PNG file names.
  """
  return [*_plot_per_layer(ctx, results, cfg), *_plot_init_comparison(ctx, results, cfg),
          _plot_depth_scaling_and_residuals(ctx, results, an, cfg)]


def units(cfg: Config) -> list:
  """The probe settings of :func:`run`, one per (setting, seed), in its order (for the planner)."""
  out = []
  for s in settings(cfg):
    for seed in cfg.seeds:
      program = "theory" if s["setting"] == "theory" else "xavier"  # small: the xavier program
      out.append(Unit("grad_init", f"{key(s)}/s{seed}", s["n_layers"], 0,
                      ("grad", s["n_layers"], program, s["norm_position"], s["norm_type"]), "grad"))
  return out


def run(ctx, cfg: Config) -> dict:
  """Runs the experiment; returns its summary."""
  results = measure(ctx, cfg)
  an = analyse(results, cfg)
  ctx.save_json("data.json", {"results": results, "analysis": an})
  rows = []
  for k, r in results.items():
    for g in WEIGHT_GROUPS:
      for li, v in enumerate(r[g]):
        rows.append([r["setting"], r["norm_position"], r["norm_type"], r["n_layers"], g, li + 1, v])
  ctx.save_csv("grad_norms.csv", ["setting", "position", "norm", "L", "group", "layer", "grad_norm"], rows)
  files = plot(ctx, results, an, cfg)
  table = []
  for k in results:
    ra = an["ratios"][k]
    table.append({"key": k, "mlp_out": ra["mlp_out"], "attn_qkv": ra["attn_qkv"],
                  "per_seed": ra["mlp_out_per_seed"]})
  return {"claims": verdicts(an, cfg), "files": files, "seeds": list(cfg.seeds),
          "ratio_table": table, "slopes": an["slopes"], "model": dict(ctx.preset["model"])}


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the gradient-norm experiment: the setup, the plots, the table of
  last/first-layer ratios.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.suite.report`.
  """
  cfg = summary["config"]
  lines = [
      f"Setup: byte-level LM of width {summary['model']['d_model']}, depths {cfg['depths']}, "
      f"gradient of the training loss at initialization, mean over seeds {cfg['seeds']} x "
      f"{cfg['n_batches']} batches. Xiong et al. analyse Xavier init and (for the theory) "
      "W^Q = W^K = 0; GPT-2's small init is shown beside them.", "",
      f"![gradient norms per layer]({rel}/grad_norms_xavier.png)", "",
      "*Per-layer gradient norm of each weight group at init (Xavier), Post-LN and Pre-LN, every depth: the "
      "claim reads the ratio of the last layer's W2 gradient norm to the first's.*", "",
  ]
  if "grad_norms_init_comparison.png" in summary["files"]:
    lines += [f"![init comparison]({rel}/grad_norms_init_comparison.png)", "",
              "*The same per-layer norms under Xavier and GPT-2's small init, side by side.*", ""]
  lines += [f"![depth scaling and residual norms]({rel}/depth_scaling_and_residuals.png)", "",
            "*Left: the last layer's W2 gradient norm against depth (log-log); the dotted L^-1/2 line is the "
            "slope of Theorem 1's upper bound for Pre-LN, not a prediction. Right: E||x||^2/d of the norm inputs "
            "at the largest depth against Lemma 2's band.*", "",
            "Last/first-layer gradient-norm ratio (seed-averaged norms; per-seed W2 ratios in the last column):", "",
            "| setting / position / norm / depth | W2 (mlp_out) | W^QKV | per seed |", "|---|---|---|---|"]
  for r in summary["ratio_table"]:
    lines.append(f"| {r['key']} | {r['mlp_out']:z.2f} | {r['attn_qkv']:z.2f} | "
                 f"{', '.join(f'{v:z.2f}' for v in r['per_seed'])} |")
  lines.append("")
  return "\n".join(lines)


def reanalyse(ctx, cfg: Config, summary: dict) -> dict:
  """The summary with its claims judged again from the analysis kept in the folder's ``data.json`` (no
  measuring; tables and figures kept; :mod:`experiments.suite.reanalyse`)."""
  from experiments.suite.registry import read_json
  return {**summary, "claims": verdicts(read_json(ctx.exp_dir / "data.json")["analysis"], cfg)}
