r"""Experiment 8: LayerNorm Scaling and Peri-LN against Pre-LN on hidden-state variance over depth.

Three layouts of the same depth: Pre-LN, Pre-LN with LayerNorm Scaling (``norm_scaling``: the
input norms of block :math:`l` output :math:`N(x)/\sqrt{l}`; Sun et al. 2025) and Sandwich, the
placement Kim et al. 2025 call Peri-LN (a norm before and after each sub-layer). For each, the
mean square :math:`m_l = \mathbb E\|x_l\|^2/d` of the residual stream entering every block and
leaving the last one, at initialization and after training. Both come from the same run
(``log_residual_norms``): the first step's statistics are computed on the initial parameters
(before its update), the last step's on the parameters after ``steps - 1`` updates.

The rules (fixed before the first run) and what was read of the two papers (their abstracts) are in
:mod:`experiments.studies.norm_scaling_rules`. Xavier init for all three: Sun et al. report that
scaled initialization diminishes LayerNorm Scaling's effect and recommend dropping it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.studies import norm_scaling_rules as rules
from experiments.suite.study import Unit

TITLE = "LayerNorm Scaling and Peri-LN: hidden-state variance over depth"
RAW_DATA = ("profiles.json", "profiles.csv")  # files the report links under the claims
HEADLINE = ("norm_scaling.png",)              # figures of the report's first screen

VARIANTS = {"pre": ("pre", False), "lns": ("pre", True), "sandwich": ("sandwich", False)}
NAMES = {"pre": "Pre-LN", "lns": "Pre-LN + LayerNorm Scaling", "sandwich": "Peri-LN (sandwich)"}


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the comparison.

  Attributes:
    n_layers: model depth.
    steps: optimizer updates per run.
    lr: peak learning rate.
    warmup: linear warm-up steps.
    seeds: training seeds.
  """

  n_layers: int = 12
  steps: int = 100
  lr: float = 0.003125
  warmup: int = 10
  seeds: tuple = (0,)


def label(variant: str, seed: int, cfg: Config) -> str:
  """Run label, e.g. ``"lns-lns-L12-s0"``."""
  return f"lns-{variant}-L{cfg.n_layers}-s{seed}"


def grid(cfg: Config) -> list[tuple]:
  """Every run as ``(variant, seed)``, in the order :func:`run` trains them."""
  return [(v, s) for v in VARIANTS for s in cfg.seeds]


def units(cfg: Config) -> list[Unit]:
  """The training runs of :func:`run` (one per :func:`grid` point), in its order (for the planner).

  Each variant is its own program (layout, LayerNorm Scaling); seeds share it.
  """
  return [Unit("norm_scaling", label(v, s, cfg), cfg.n_layers, cfg.steps,
               ("train", cfg.n_layers, VARIANTS[v][0], "layer_norm", "jaxnorm", v)) for v, s in grid(cfg)]


def _profiles(ctx, cfg: Config, variant: str, seed: int) -> dict:
  pos, scaling = VARIANTS[variant]
  mc = ctx.model_config(n_layers=cfg.n_layers, norm_position=pos, norm_type="layer_norm", init="xavier",
                        norm_scaling=scaling)
  tc = ctx.train_config(mc, steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup, seed=seed, log_residual_norms=True)
  r = ctx.train(tc, label(variant, seed, cfg))
  rows = [m for m in r.metrics if "residual_sq_norm" in m and "loss" in m]
  prof = lambda m: rules.block_input_profile(m["residual_sq_norm"], pos, cfg.n_layers)  # noqa: E731
  return {"init": prof(rows[0]), "trained": prof(rows[-1]), "trained_step": int(rows[-1]["step"]),
          "final_val_loss": r.summary.get("final_val_loss"), "diverged": bool(r.summary.get("diverged")),
          "run": r.path.name}


def run(ctx, cfg: Config) -> dict:
  """Trains the three layouts per seed; returns the summary (claims, files, seeds, table)."""
  prof = {}
  for variant, seed in ctx.iterate(grid(cfg), desc="runs"):
    prof[(variant, seed)] = _profiles(ctx, cfg, variant, seed)
  per = {(seed, phase): {v: rules.growth(prof[(v, seed)][phase]) for v in VARIANTS}
         for seed in cfg.seeds for phase in ("init", "trained")}
  ctx.save_json("profiles.json", [{"variant": v, "seed": s, **p} for (v, s), p in prof.items()])
  ctx.save_csv("profiles.csv", ["variant", "seed", "phase", "block", "mean_square"],
               ([v, s, ph, i + 1, m] for (v, s), p in prof.items() for ph in ("init", "trained")
                for i, m in enumerate(p[ph])))
  table = [{"seed": s, "phase": ph, **{v: g[v] for v in VARIANTS}} for (s, ph), g in per.items()]
  finals = {v: [prof[(v, s)]["final_val_loss"] for s in cfg.seeds] for v in VARIANTS}
  return {"claims": rules.claims(per), "files": plot(ctx, prof, cfg), "seeds": list(cfg.seeds), "table": table,
          "finals": finals, "model": dict(ctx.preset["model"])}


def plot(ctx, prof: dict, cfg: Config) -> list[str]:
  """Draws ``norm_scaling.png``: m_l against l at initialization and after training (log scale)."""
  fig, axes = ctx.subplots(1, 2, figsize=(11, 3.8), sharey=True)
  depth = np.arange(1, cfg.n_layers + 2)
  for ax, phase in zip(axes, ("init", "trained")):
    for i, v in enumerate(VARIANTS):
      for j, s in enumerate(cfg.seeds):
        ax.semilogy(depth, prof[(v, s)][phase], "-o", ms=2.5, lw=0.9, color=f"C{i}",
                    label=NAMES[v] if j == 0 else None, alpha=1.0 if j == 0 else 0.5)
    ax.set_xlabel("block l (L + 1: after the last block)")
    ax.set_title(f"{'at initialization' if phase == 'init' else f'after {cfg.steps} steps'}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  axes[0].set_ylabel("E||x_l||^2 / d of the residual stream")
  return [ctx.save_figure(fig, "norm_scaling.png")]


def report_section(summary: dict, rel: str) -> str:
  """Markdown section: setup, plot, growth table (the protocol is in :mod:`experiments.suite.report`)."""
  cfg = summary["config"]
  lines = [
      f"Setup: {cfg['n_layers']}-layer LayerNorm models (Xavier init), {cfg['steps']} steps at lr {cfg['lr']:g} with "
      f"{cfg['warmup']} warm-up steps, seeds {', '.join(map(str, cfg['seeds']))}. Growth = m_(L+1) / m_1, the mean "
      "square of the residual stream after the last block over the one entering the first.", "",
      f"![norm scaling]({rel}/norm_scaling.png)", "",
      "| seed | phase | " + " | ".join(NAMES.values()) + " |", "|---|---|" + "---|" * len(NAMES)]
  for r in summary["table"]:
    lines.append(f"| {r['seed']} | {r['phase']} | " + " | ".join(f"{float(r[v]):z.3g}" for v in NAMES) + " |")
  fin = summary.get("finals", {})
  if fin:
    lines += ["", "Final validation loss: " + "; ".join(
        f"{NAMES[v]} " + ", ".join("div." if x is None else f"{float(x):z.3f}" for x in xs) for v, xs in fin.items())]
  lines.append("")
  return "\n".join(lines)
