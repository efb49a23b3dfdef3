r"""Experiment 6: the custom VJP vs autodiff in real training.

The same Pre-LN and Post-LN runs (same seed, same batches) with ``norm_impl="jaxnorm"`` (the
hand-derived backward) and ``norm_impl="flax"`` (Flax's LayerNorm/RMSNorm differentiated by
JAX). If the derived backward is right, the two loss curves agree to float rounding at first
and drift apart only as slowly as float32 reordering differences are amplified by training.

Criteria (issue 17; :func:`run`): what is deterministic is judged to round-off (step-1 loss, the
early steps); the long curve of a chaotic run (Post-LN) is judged against a chaos baseline measured
in the same run (the Flax run again with its input scaled by one float32 ulp), not against a fixed
tolerance that a chaotic run crosses by chance.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.studies.vjp_rules import claim, judge_pair
from experiments.suite.runs import train_run
from experiments.suite.study import train_unit

TITLE = "Custom VJP vs autodiff in training (jaxnorm vs Flax norms)"
RAW_DATA = ('pairs.json', 'diff.csv')  # files the report links under the claims

ULP = 2.0 ** -23     # the chaos baseline scales the model input by 1 + ULP (one float32 ulp of 1)
_KEEP = ("train_curve", "val_curve", "final_val_loss", "diverged", "diverged_at", "tokens_per_s")


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the VJP experiment.

  Attributes:
    n_layers: model depth.
    steps: optimizer updates per run.
    positions: norm layouts.
    norm_types: LayerNorm and/or RMSNorm.
    lr: peak learning rate (no warm-up: the same runs as the warm-up experiment's).
    seed: the one training seed of every run (issue 63: the fresh-seed confirmation runs seed 50).
  """

  n_layers: int = 6
  steps: int = 300
  positions: tuple = ("pre", "post")
  norm_types: tuple = ("layer_norm", "rms_norm")
  lr: float = 1e-3
  seed: int = 0


def compare(a: dict, b: dict) -> dict:
  """Differences of two runs' training and validation curves."""
  ta = {int(s): float(v) for s, v in a["train_curve"]}
  tb = {int(s): float(v) for s, v in b["train_curve"]}
  steps = sorted(set(ta) & set(tb))
  diff = np.array([abs(ta[s] - tb[s]) for s in steps])
  va = {int(s): float(v) for s, v in a["val_curve"]}
  vb = {int(s): float(v) for s, v in b["val_curve"]}
  vsteps = sorted(set(va) & set(vb))
  vdiff = [abs(va[s] - vb[s]) for s in vsteps]
  return {"steps": steps, "abs_diff": diff.tolist(),
          "step1": float(diff[0]) if len(diff) else float("nan"),
          "max": float(diff.max()) if len(diff) else float("nan"),
          "argmax": int(steps[int(diff.argmax())]) if len(diff) else None,
          "val_max": float(max(vdiff)) if vdiff else float("nan"),
          "final_val": float(vdiff[-1]) if vdiff else float("nan")}


def _pair_runs(ctx, cfg: Config, pos: str, norm: str) -> dict:
  """The jaxnorm run, the Flax run and the chaos baseline (Flax, input scaled by 1 + 2^-23)."""
  res = {}
  for impl in ("jaxnorm", "flax"):
    spec = {"norm_position": pos, "norm_type": norm, "init": "xavier", "lr": cfg.lr, "warmup": 0}
    if impl == "flax":
      spec["norm_impl"] = "flax"
    r = train_run(ctx, spec, cfg.n_layers, cfg.steps, seed=cfg.seed)
    res[impl] = {k: r.summary.get(k) for k in _KEEP}
    res[impl]["run"] = r.path.name
  mc = ctx.model_config(n_layers=cfg.n_layers, norm_position=pos, norm_type=norm, norm_impl="flax",
                        embed_scale=1.0 + ULP)
  r = ctx.train(ctx.train_config(mc, steps=cfg.steps, lr=cfg.lr, warmup=0, seed=cfg.seed),
                f"vjp-chaos-{pos}-{norm}-L{cfg.n_layers}")
  res["flax_ulp"] = {**{k: r.summary.get(k) for k in _KEEP}, "run": r.path.name}
  return res


def units(cfg: Config) -> list:
  """The training runs of :func:`run`: per (norm, layout) jaxnorm, Flax and the chaos baseline
  (the Flax run again with its input scaled by 1 + 2^-23)."""
  out = []
  for norm in cfg.norm_types:
    for pos in cfg.positions:
      out += [train_unit("vjp", f"{pos}-{norm}-{impl}", cfg.n_layers, cfg.steps, pos, norm, impl=impl)
              for impl in ("jaxnorm", "flax")]
      out.append(train_unit("vjp", f"chaos-{pos}-{norm}", cfg.n_layers, cfg.steps, pos, norm, impl="flax"))
  return out


def run(ctx, cfg: Config) -> dict:
  """Runs the VJP experiment; returns its summary.

  For every (position, norm type) trains the same model (cached, seed ``cfg.seed``, no warm-up) with
  jaxnorm's and with Flax's norms, and a *chaos baseline*: the Flax run again with the model input
  scaled by ``1 + 2^-23`` (one float32 ulp), i.e. how far round-off alone drifts this model's
  training in this run. A pair agrees (:func:`judge_pair`) if

  * deterministic part: the step-1 training losses differ by ``<= STEP1_TOL`` (1e-5), and over the
    early steps (before the chaos baseline itself drifts past ``EARLY_TOL``, 1e-4) the curves
    differ by ``<= EARLY_TOL``;
  * long curve: the largest training-loss difference is at most ``max(EARLY_TOL, CHAOS_FACTOR x``
    the chaos baseline's) and so is the largest validation difference (``CHAOS_FACTOR`` = 3: the
    two drifts are two samples of the same amplification of round-off, not equal numbers);
  * both runs diverge or neither.

  Claim ``vjp_matches_autodiff``: yes if every pair agrees, partly if some do, no otherwise (one
  seed: the per-seed verdict is the verdict).

  Args:
    ctx: the suite's :class:`~experiments.suite.runner.Context`.
    cfg: the experiment's :class:`Config`.

  Returns:
    ``claims``, ``files``, ``seeds``, ``table`` (per pair: the differences of :func:`compare`,
    the chaos baseline's and both final val losses) and ``model``.
  """
  pairs = {}
  for pos, norm in ctx.iterate([(p, n) for n in cfg.norm_types for p in cfg.positions], desc="pairs"):
    res = _pair_runs(ctx, cfg, pos, norm)
    res["diff"] = compare(res["jaxnorm"], res["flax"])
    res["chaos"] = compare(res["flax_ulp"], res["flax"])
    pairs[f"{pos}/{norm}"] = res
  ctx.save_json("pairs.json", pairs)
  ctx.save_csv("diff.csv", ["pair", "step", "abs_loss_diff", "chaos_abs_loss_diff"],
               ([k, s, d, c] for k, p in pairs.items()
                for s, d, c in zip(p["diff"]["steps"], p["diff"]["abs_diff"], p["chaos"]["abs_diff"])))
  claims = [claim({k: judge_pair(p["diff"], p["chaos"], {i: p[i]["diverged_at"] if p[i]["diverged"] else None
                                                         for i in ("jaxnorm", "flax")})
                    for k, p in pairs.items()})]
  files = plot(ctx, pairs, cfg)
  table = [{"pair": k, **{kk: p["diff"][kk] for kk in ("step1", "max", "argmax", "val_max", "final_val")},
            "chaos_max": p["chaos"]["max"], "chaos_val_max": p["chaos"]["val_max"],
            "final_jaxnorm": p["jaxnorm"]["final_val_loss"], "final_flax": p["flax"]["final_val_loss"]}
           for k, p in pairs.items()]
  return {"claims": claims, "files": files, "seeds": [cfg.seed], "table": table, "model": dict(ctx.preset["model"])}


def plot(ctx, pairs: dict, cfg: Config) -> list[str]:
  """Draws ``vjp_vs_autodiff.png``: the training curves of every pair and their difference.

  The absolute loss difference per step is drawn on a log scale (dots) beside the chaos
  baseline's (thin lines; exact zeros at 1e-9).

  Args:
    ctx: the suite context (saves the figure).
    pairs: the pairs of :func:`run`, keyed ``"<position>/<norm>"``.
    cfg: the experiment's config (unused).

  Returns:
    The PNG file names.
  """
  fig, axes = ctx.subplots(1, 2, figsize=(11, 3.8))
  for i, (k, p) in enumerate(pairs.items()):
    for impl, ls in (("jaxnorm", "-"), ("flax", "--")):
      if p[impl]["train_curve"]:
        s, v = zip(*p[impl]["train_curve"])
        axes[0].plot(s, [float(x) for x in v], ls, color=f"C{i}", lw=0.8, label=f"{k} {impl}")
    d = p["diff"]
    axes[1].semilogy(d["steps"], np.maximum(d["abs_diff"], 1e-9), ".", color=f"C{i}", ms=3, label=k)
  axes[0].set_xlabel("step")
  axes[0].set_ylabel("training loss")
  axes[0].set_title("jaxnorm (solid) vs Flax (dashed) norms", fontsize=10)
  axes[0].legend(fontsize=6)
  for i, (k, p) in enumerate(pairs.items()):
    c = p["chaos"]
    axes[1].semilogy(c["steps"], np.maximum(c["abs_diff"], 1e-9), "-", color=f"C{i}", lw=0.6, alpha=0.6,
                     label=f"{k}: chaos baseline (1-ulp input)")
  axes[1].set_xlabel("step")
  axes[1].set_ylabel("|loss difference| (nats)")
  axes[1].set_title("difference of the training losses (exact zeros drawn at 1e-9)", fontsize=10)
  axes[1].legend(fontsize=7)
  for ax in axes:
    ax.grid(alpha=0.3)
  return [ctx.save_figure(fig, "vjp_vs_autodiff.png")]


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the VJP experiment: the setup, the plot, the per-pair table of differences.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.suite.report`.
  """
  cfg = summary["config"]
  lines = [
      f"Setup: {cfg['n_layers']}-layer models, {cfg['steps']} steps at lr {cfg['lr']:g} without warm-up, "
      "the same seed and batches; only the norm implementation differs. Chaos baseline: the Flax run again with "
      "its input scaled by 1 + 2^-23 (one float32 ulp).", "",
      f"![vjp vs autodiff]({rel}/vjp_vs_autodiff.png)", "",
      "*Left: the training-loss curves of jaxnorm and Flax for every pair. Right: |loss(jaxnorm) - loss(Flax)| "
      "per step (log "
      "scale) beside the chaos baseline, a Flax run whose input differs by one float32 ulp.*", "",
      "| pair | step-1 diff | max diff (step) | chaos baseline max | max val diff | final val jaxnorm | "
      "final val Flax |", "|---|---|---|---|---|---|---|"]
  for r in summary["table"]:
    fj = "-" if r["final_jaxnorm"] is None else f"{float(r['final_jaxnorm']):z.5f}"
    ff = "-" if r["final_flax"] is None else f"{float(r['final_flax']):z.5f}"
    chaos = "-" if "chaos_max" not in r else f"{r['chaos_max']:z.1e}"
    lines.append(f"| {r['pair']} | {r['step1']:z.1e} | {r['max']:z.1e} ({r['argmax']}) | {chaos} | {r['val_max']:z.1e} "
                 f"| {fj} | {ff} |")
  lines.append("")
  return "\n".join(lines)
