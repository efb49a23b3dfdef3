"""The warm-up grid's per-seed figures (issue 44, goal 6): nothing averaged away.

* ``final_vs_rate.png``: final validation loss against the peak rate, one panel per layout (Post-LN at
  each warm-up, Pre-LN without), every seed its own marker and line (Xiong et al.'s Fig. 2 read per
  seed). A failed run is an open marker at its own loss (a diverged one at the plateau).
* ``curves_grid.png``: validation curves of every seed at every grid point as small multiples (rows:
  layouts, columns: rates), with the plateau and the stall line.

Both read the grid points of :func:`experiments.studies.seeds.point` (``values``, ``failures``,
``curves``) and draw through the suite's figure helpers (``ctx.subplots``, ``ctx.save_figure``).
"""

from __future__ import annotations

import numpy as np

from experiments.studies.seeds import STALL_NATS

__all__ = ["plot_curves_grid", "plot_final_vs_rate"]

_MARKERS = ("o", "s", "^", "D", "v", "P")


def _layouts(cfg) -> list[tuple[str, int, str]]:
  return [("post", w, f"Post-LN, warm-up {w}") for w in cfg.warmups] + [("pre", 0, "Pre-LN, no warm-up")]


def plot_final_vs_rate(ctx, grid: dict, lrs: list[float], cfg, unigram: float) -> str:
  """``final_vs_rate.png``; returns its file name."""
  lays = _layouts(cfg)
  fig, axes = ctx.subplots(1, len(lays), figsize=(3.4 * len(lays), 3.0), sharey=True, squeeze=False)
  lo = min(min(p["values"]) for p in grid.values())
  for ax, (pos, w, title) in zip(axes[0], lays):
    for i, seed in enumerate(cfg.seeds):
      xs, ys, failed = [], [], []
      for lr in lrs:
        p = grid.get((pos, lr, w))
        if p is None:
          continue
        xs.append(lr)
        ys.append(p["values"][i])
        failed.append(bool(p["failures"][i]))
      m = _MARKERS[i % len(_MARKERS)]
      ax.plot(xs, ys, "-", color=f"C{i}", lw=0.8, alpha=0.7)
      for x, y, f in zip(xs, ys, failed):
        ax.plot([x], [y], m, ms=5, color=f"C{i}", mfc="none" if f else f"C{i}",
                label=f"seed {seed}" if x == xs[0] else None)
    ax.axhline(unigram, color="k", lw=0.8, ls=":")
    ax.axhline(unigram - STALL_NATS, color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_xticks(lrs, [f"{x:z.2g}" for x in lrs], fontsize=6)
    ax.minorticks_off()
    ax.set_ylim(lo - 0.1, unigram + 0.15)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("peak lr", fontsize=8)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("final val loss (nats/byte)", fontsize=8)
  axes[0][0].legend(fontsize=6, loc="lower left")
  fig.suptitle(f"Final validation loss per seed (open marker: failed: diverged, or stalled = on the plateau at "
               f"2/3 of the run or at the end; dotted: plateau {unigram:z.2f}; dashed: stall line)", fontsize=8)
  return ctx.save_figure(fig, "final_vs_rate.png")


def plot_curves_grid(ctx, grid: dict, lrs: list[float], cfg, unigram: float) -> str:
  """``curves_grid.png``; returns its file name."""
  lays = _layouts(cfg)
  fig, axes = ctx.subplots(len(lays), len(lrs), figsize=(2.1 * len(lrs), 1.8 * len(lays)), sharex=True,
                           sharey=True, squeeze=False)
  lo = min(min(p["values"]) for p in grid.values())
  for r, (pos, w, title) in enumerate(lays):
    for c, lr in enumerate(lrs):
      ax = axes[r][c]
      p = grid.get((pos, lr, w))
      if p is not None:
        for i, curve in enumerate(p.get("curves") or []):
          if not curve:
            continue
          s, v = zip(*curve)
          v = np.minimum(np.asarray(v, dtype=float), unigram + 1.0)
          ax.plot(s, v, "-", color=f"C{i}", lw=0.9, label=f"seed {cfg.seeds[i]}" if (r, c) == (0, 0) else None)
      ax.axhline(unigram, color="k", lw=0.6, ls=":")
      ax.axhline(unigram - STALL_NATS, color="grey", lw=0.5, ls="--")
      ax.axvline(2 * cfg.steps / 3, color="grey", lw=0.5, ls=":")
      ax.set_ylim(lo - 0.1, unigram + 1.0)
      ax.tick_params(labelsize=6)
      if r == 0:
        ax.set_title(f"lr {lr:z.3g}", fontsize=8)
      if c == 0:
        ax.set_ylabel(title, fontsize=7)
  axes[0][0].legend(fontsize=5)
  fig.suptitle("Validation loss per seed at every grid point (clipped at plateau + 1; dotted: plateau; dashed: "
               "stall line; vertical: 2/3 of the run)", fontsize=8)
  return ctx.save_figure(fig, "curves_grid.png")
