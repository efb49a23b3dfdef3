r"""Experiment 3: depth (Liu et al. 2020 "Admin"; Wang et al. 2022 "DeepNet").

Post-LN, Pre-LN, Sandwich and DeepNorm LayerNorm models at increasing depth, trained with the
same AdamW settings (peak lr and a short linear warm-up, as Admin's failing runs had). Each run
logs, at every step,

* the model update :math:`u_s = \mathrm{RMS}_{b,t}\,\|f(x;\theta_s)_{bt} - f(x;\theta_0)_{bt}\|_2`
  on a fixed batch (DeepNet Fig. 3/5, Admin's output change);
* the mean squared entry :math:`E\|x\|^2/d` of every norm input (its growth over the first steps);

and the final validation loss or the divergence step. DeepNorm's constants come from
``jaxnorm.models.deepnorm_alpha_beta`` and are checked against the paper's formula.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments import claims as claims_lib

TITLE = "Depth: Post-LN, Pre-LN, Sandwich, DeepNorm (Liu et al. 2020; Wang et al. 2022)"
RAW_DATA = ('runs.json', 'final.csv')  # files the report links under the claims

WORSE_MARGIN = 0.1       # nats: Post-LN counts as failing if worse than Pre-LN by more than this
DEEP = 12                # Admin's failing depth
CONSTANT_RANGE = 2.0     # DeepNorm's early update "roughly constant": max/min over depths <= this


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the depth experiment.

  Attributes:
    depths: numbers of layers.
    positions: norm layouts to compare.
    steps: optimizer updates per run.
    update_steps: the "early" window in which the model update and norm-input growth are read.
    lr: peak learning rate.
    warmup: linear warm-up steps (default: steps // 10).
    seed: the training seed.
  """

  depths: tuple = (6, 12, 18)
  positions: tuple = ("post", "pre", "sandwich", "deepnorm")
  steps: int = 150
  update_steps: int = 8
  lr: float = 1e-3
  warmup: int | None = None
  seed: int = 0


def _warmup(cfg):
  return cfg.steps // 10 if cfg.warmup is None else cfg.warmup


def run(ctx, cfg: Config) -> dict:
  """Runs the depth experiment; returns its summary.

  Trains (or loads from the cache) one LayerNorm model per (layout, depth) with the model update
  and the norm-input norms logged at every step, checks DeepNorm's constants, and writes
  ``runs.json``, ``final.csv`` and the plots.

  Args:
    ctx: the suite's :class:`~experiments.suite.Context`.
    cfg: the experiment's :class:`Config`.

  Returns:
    ``claims`` (:func:`verdicts`), ``files`` (the PNGs), ``seeds``, ``table`` (per run: final val
    loss, divergence step, the model update after 1 and after ``update_steps`` steps, and the
    norm-input growth: mean ``E||x||^2/d`` at step ``update_steps`` over step 1),
    ``deepnorm_constants``, ``model`` and ``warmup_steps``.
  """
  runs = {}
  specs = [(pos, L) for L in cfg.depths for pos in cfg.positions]
  for pos, L in ctx.iterate(specs, desc="runs"):
    mc = ctx.model_config(n_layers=L, norm_position=pos, norm_type="layer_norm")
    tc = ctx.train_config(mc, steps=cfg.steps, lr=cfg.lr, warmup=_warmup(cfg), seed=cfg.seed,
                          log_update_size=True, log_residual_norms=True)
    r = ctx.train(tc, f"depth-{pos}-L{L}-lr{cfg.lr:g}-w{_warmup(cfg)}")
    rows = [m for m in r.metrics if "update_size" in m and "event" not in m]
    upd = [float(m["update_size"]) for m in rows]
    res = [np.asarray(m["residual_sq_norm"], np.float64) for m in rows if "residual_sq_norm" in m]
    growth = [float(np.mean(x)) for x in res]
    runs[f"{pos}/L{L}"] = {
        "position": pos, "n_layers": L, "run": r.path.name,
        "final_val_loss": r.summary.get("final_val_loss"), "diverged": r.summary.get("diverged"),
        "diverged_at": r.summary.get("diverged_at"), "val_curve": r.summary.get("val_curve"),
        "update_size": upd, "residual_mean": growth,
        "residual_max": [float(np.max(x)) for x in res],
        "update_early": upd[min(cfg.update_steps, len(upd)) - 1] if upd else float("nan"),
    }
  from jaxnorm.models import deepnorm_alpha_beta
  consts = {str(L): deepnorm_alpha_beta(L) for L in cfg.depths}
  claims = verdicts(runs, consts, cfg)
  ctx.save_json("runs.json", {"runs": runs, "deepnorm_constants": consts})
  ctx.save_csv("final.csv", ["position", "L", "final_val_loss", "diverged_at", "update_early"],
               ([r["position"], r["n_layers"], r["final_val_loss"], r["diverged_at"], r["update_early"]]
                for r in runs.values()))
  files = plot(ctx, runs, cfg)
  table = [{"key": k, "final": r["final_val_loss"], "diverged_at": r["diverged_at"],
            "update_1": r["update_size"][0] if r["update_size"] else None, "update_early": r["update_early"],
            "growth": (r["residual_mean"][min(cfg.update_steps, len(r["residual_mean"])) - 1] / r["residual_mean"][0]
                       if r["residual_mean"] else None)}
           for k, r in runs.items()]
  return {"claims": claims, "files": files, "seeds": [cfg.seed], "table": table,
          "deepnorm_constants": consts, "model": dict(ctx.preset["model"]), "warmup_steps": _warmup(cfg)}


def verdicts(runs: dict, consts: dict, cfg: Config) -> list[dict]:
  """The claims of the depth experiment.

  * ``admin_deep_postln_fails``: at a depth ``>= DEEP`` (12), Post-LN fails if it diverges while
    Pre-LN does not, or if its final val loss exceeds Pre-LN's by more than ``WORSE_MARGIN``
    (0.1 nats). yes if it fails at every such depth, partly at some, no at none; n/a without such
    a depth or without both ``"post"`` and ``"pre"``.
  * ``deepnet_update_constant``: with spread = max/min over depths of the model update after
    ``update_steps`` steps, yes if DeepNorm's spread is ``<= CONSTANT_RANGE`` (2) and Post-LN's is
    larger, partly if one of the two, no otherwise; n/a with fewer than 2 depths or without
    ``"post"`` and ``"deepnorm"``.
  * ``deepnet_constants``: yes if every ``(alpha, beta)`` is ``((2N)^(1/4), (8N)^(-1/4))`` to 1e-12.

  Args:
    runs: per-run results of :func:`run`, keyed ``"<position>/L<depth>"``.
    consts: depth (a string) -> DeepNorm's ``(alpha, beta)``.
    cfg: the experiment's config.

  Returns:
    Claim dicts with ``id``, ``ours``, ``holds`` and, for most, ``note``.
  """
  claims = []
  deep = [L for L in cfg.depths if L >= DEEP]
  if "post" in cfg.positions and "pre" in cfg.positions and deep:
    parts, oks = [], []
    for L in deep:
      post, pre = runs[f"post/L{L}"], runs[f"pre/L{L}"]
      if post["diverged"]:
        parts.append(f"L={L}: Post-LN diverged at {post['diverged_at']}")
        oks.append(not pre["diverged"])
        continue
      pv, qv = float(post["final_val_loss"]), pre["final_val_loss"]
      qtxt = "diverged" if qv is None else f"{float(qv):.3f}"
      parts.append(f"L={L}: Post-LN {pv:.3f} vs Pre-LN {qtxt}")
      oks.append(qv is not None and pv > float(qv) + WORSE_MARGIN)
    claims.append({"id": "admin_deep_postln_fails", "ours": "final val loss; " + "; ".join(parts),
                   "holds": claims_lib.verdict(oks),
                   "note": f"fails = diverges or is worse than Pre-LN by > {WORSE_MARGIN} nats"})
  else:
    claims.append({"id": "admin_deep_postln_fails", "ours": f"no depth >= {DEEP} in this preset",
                   "holds": "n/a"})
  if len(cfg.depths) >= 2 and "post" in cfg.positions and "deepnorm" in cfg.positions:
    def spread(pos):
      v = [runs[f"{pos}/L{L}"]["update_early"] for L in cfg.depths]
      return v, max(v) / max(min(v), 1e-30)
    pv, ps = spread("post")
    dv, ds = spread("deepnorm")
    ok_deep, ok_rel = ds <= CONSTANT_RANGE, ps > ds
    claims.append({
        "id": "deepnet_update_constant",
        "ours": (f"model update after {cfg.update_steps} steps at L={list(cfg.depths)}: Post-LN "
                 f"{', '.join(f'{v:.3g}' for v in pv)} (max/min {ps:.2f}); DeepNorm "
                 f"{', '.join(f'{v:.3g}' for v in dv)} (max/min {ds:.2f})"),
        "holds": "yes" if ok_deep and ok_rel else ("partly" if ok_deep or ok_rel else "no"),
        "note": f"yes = DeepNorm max/min <= {CONSTANT_RANGE} and Post-LN's spread larger",
    })
  else:
    claims.append({"id": "deepnet_update_constant", "ours": "needs >= 2 depths with post and deepnorm",
                   "holds": "n/a"})
  errs = [abs(a - (2 * int(L)) ** 0.25) + abs(b - (8 * int(L)) ** -0.25) for L, (a, b) in consts.items()]
  claims.append({"id": "deepnet_constants",
                 "ours": "; ".join(f"N={L}: alpha {a:.4f}, beta {b:.4f}" for L, (a, b) in consts.items()),
                 "holds": "yes" if max(errs) < 1e-12 else "no",
                 "note": "constants used by jaxnorm.models (checked against the formula)"})
  return claims


def plot(ctx, runs: dict, cfg: Config) -> list[str]:
  """Draws the figures of the depth experiment into its folder.

  ``depth_runs.png``: per run, the model update per step, the mean norm-input ``E||x||^2/d``
  relative to step 1 (first ``5 * update_steps`` steps) and the validation loss with divergence
  steps marked; ``update_vs_depth.png``: the update after ``update_steps`` steps against depth.

  Args:
    ctx: the suite context (saves the figures).
    runs: per-run results of :func:`run`.
    cfg: the experiment's config.

  Returns:
    The PNG file names.
  """
  colors = {"post": "C3", "pre": "C0", "sandwich": "C2", "deepnorm": "C4"}
  styles = ["-", "--", ":", "-."]
  fig, axes = ctx.subplots(1, 3, figsize=(16, 4))
  for pos in cfg.positions:
    for di, L in enumerate(cfg.depths):
      r = runs[f"{pos}/L{L}"]
      ls = styles[di % len(styles)]
      if r["update_size"]:
        axes[0].plot(np.arange(1, len(r["update_size"]) + 1), r["update_size"], ls, color=colors[pos], lw=1,
                     label=f"{pos} L={L}")
      if r["residual_mean"]:
        g = np.asarray(r["residual_mean"]) / r["residual_mean"][0]
        n = min(len(g), 5 * cfg.update_steps)
        axes[1].plot(np.arange(1, n + 1), g[:n], ls, color=colors[pos], lw=1, label=f"{pos} L={L}")
      if r["val_curve"]:
        s, v = zip(*r["val_curve"])
        axes[2].plot(s, [float(x) for x in v], ls, color=colors[pos], marker="o", ms=2, lw=1, label=f"{pos} L={L}")
      if r["diverged"]:
        axes[2].axvline(r["diverged_at"], color=colors[pos], ls=ls, lw=0.8)
  axes[0].set_yscale("log")
  axes[0].set_xscale("log")
  axes[0].axvline(cfg.update_steps, color="grey", ls=":", lw=1)
  axes[0].set_title("model update ||f(x; theta_t) - f(x; theta_0)||", fontsize=10)
  axes[0].set_xlabel("step")
  axes[1].set_title("mean E||x||^2/d of the norm inputs, relative to step 1", fontsize=10)
  axes[1].set_xlabel("step")
  axes[1].set_yscale("log")
  axes[2].set_title("validation loss (vertical lines: divergence)", fontsize=10)
  axes[2].set_xlabel("step")
  for ax in axes:
    ax.grid(alpha=0.3, which="both")
  axes[2].legend(fontsize=6, ncol=2)
  fig.suptitle(f"Depth (LayerNorm, lr {cfg.lr:g}, warm-up {_warmup(cfg)}; line style = depth)", fontsize=10,
               y=1.03)
  files = [ctx.save_figure(fig, "depth_runs.png")]

  fig, ax = ctx.subplots(figsize=(6, 4))
  for pos in cfg.positions:
    v = [runs[f"{pos}/L{L}"]["update_early"] for L in cfg.depths]
    ax.plot(cfg.depths, v, "o-", color=colors[pos], label=pos)
  ax.set_yscale("log")
  ax.set_xlabel("number of layers N")
  ax.set_ylabel(f"model update after {cfg.update_steps} steps")
  ax.set_title("Early model update vs depth (DeepNet: DeepNorm about constant)", fontsize=10)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  files.append(ctx.save_figure(fig, "update_vs_depth.png"))
  return files


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the depth experiment: the setup, the two plots, the per-run table.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.report`.
  """
  cfg = summary["config"]
  lines = [
      f"Setup: LayerNorm byte-level LMs of width {summary['model']['d_model']}, depths {cfg['depths']}, "
      f"{cfg['steps']} steps of AdamW at peak lr {cfg['lr']:g} with {summary['warmup_steps']} warm-up steps, "
      f"seed {cfg['seed']}. Admin's failures are 12-18-layer encoder-decoders on WMT14 trained for "
      "hundreds of thousands of steps; this measures the early phase at a small scale.", "",
      f"![depth runs]({rel}/depth_runs.png)", "",
      f"![update vs depth]({rel}/update_vs_depth.png)", "",
      "| layout / depth | final val loss | diverged at | update after 1 step | "
      f"update after {cfg['update_steps']} steps | norm-input growth (step {cfg['update_steps']} / step 1) |",
      "|---|---|---|---|---|---|"]
  for r in summary["table"]:
    f = "-" if r["final"] is None else f"{float(r['final']):.4f}"
    u1 = "-" if r["update_1"] is None else f"{float(r['update_1']):.3g}"
    g = "-" if r["growth"] is None else f"{float(r['growth']):.3g}"
    lines.append(f"| {r['key']} | {f} | {r['diverged_at'] or '-'} | {u1} | {float(r['update_early']):.3g} | {g} |")
  lines.append("")
  return "\n".join(lines)
