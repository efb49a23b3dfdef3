"""The warm-up grid's per-seed figures (issue 44, goal 6): nothing averaged away.

* ``final_vs_rate.png``: final validation loss against the peak rate, one panel per layout (Post-LN at
  each warm-up, Pre-LN without), every seed its own marker and line (Xiong et al.'s Fig. 2 read per
  seed). A failed run is an open marker at its own loss (a diverged one at the plateau).
* ``heatmap.png`` and ``curves_telling_rate.png`` (:func:`plot`, which draws all four): the seed-mean heat maps
  per layout and the loss curves at the telling rate.
* ``curves_grid.png``: validation curves of every seed at every grid point as small multiples (rows:
  layouts, columns: rates), with the plateau and the stall line.

Both read the grid points of :func:`experiments.studies.seeds.point` (``values``, ``failures``,
``curves``) and draw through the suite's figure helpers (``ctx.subplots``, ``ctx.save_figure``).
"""

from __future__ import annotations

import numpy as np

from experiments.studies.seeds import STALL_NATS

__all__ = ["plot", "plot_curves_grid", "plot_final_vs_rate", "redraw", "section_figures"]

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


def plot(ctx, runs: dict, grid: dict, lrs: list[float], cfg, unigram: float,
         telling: float, extra_points: dict) -> list[str]:
  """Draws the heat maps (one per layout) and the loss curves at the telling rate.

  ``heatmap.png``: rows = warm-up, columns = peak lr, colour and number = seed-mean final
  validation loss, "div"/"stall" (with the number of seeds) where runs failed; one panel per
  layout (Post-LN, Pre-LN with LayerNorm; RMSNorm at the telling rate where run).
  ``curves_telling_rate.png``: validation loss (seed mean, min-max band) at the telling rate.

  Returns:
    The PNG file names.
  """
  return [_plot_heatmap(ctx, grid, lrs, cfg, unigram, telling, extra_points),
          _plot_curves(ctx, runs, grid, cfg, unigram, telling),
          plot_final_vs_rate(ctx, grid, lrs, cfg, unigram),
          plot_curves_grid(ctx, grid, lrs, cfg, unigram)]


def _plot_heatmap(ctx, grid: dict, lrs: list[float], cfg, unigram: float, telling: float,
                  extra_points: dict) -> str:
  """``heatmap.png`` of :func:`plot`; returns its file name."""
  layouts = [("post", "layer_norm", "Post-LN (LayerNorm)"), ("pre", "layer_norm", "Pre-LN (LayerNorm)")]
  if any(k[3] == "rms_norm" for k in extra_points):
    layouts += [("post", "rms_norm", "Post-LN (RMSNorm)"), ("pre", "rms_norm", "Pre-LN (RMSNorm)")]
  fig, axes = ctx.subplots(1, len(layouts), figsize=(3.6 * len(layouts), 2.9), squeeze=False)
  all_means = [p["mean"] for p in grid.values()]
  vmin, vmax = min(all_means), unigram
  for ax, (pos, norm, title) in zip(axes[0], layouts):
    mat = np.full((len(cfg.warmups), len(lrs)), np.nan)
    for i, w in enumerate(cfg.warmups):
      for j, lr in enumerate(lrs):
        p = grid.get((pos, lr, w)) if norm == "layer_norm" else extra_points.get((pos, lr, w, norm))
        if p is None:
          continue
        mat[i, j] = p["mean"]
        fails = [f for f in p["failures"] if f]
        tag = f"\n{sorted(set(fails))[0][:5]} {len(fails)}/{len(p['failures'])}" if fails else ""
        text = f"{p['mean']:z.2f}{tag}"
        ax.text(j, i, text, ha="center", va="center", fontsize=7,
                color="white" if fails else "black", fontweight="bold" if fails else "normal")
    im = ax.imshow(mat, cmap="viridis_r", vmin=vmin, vmax=vmax, aspect="auto")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).set_label("final val loss (nats/byte)", fontsize=7)
    ax.set_xticks(range(len(lrs)), [f"{lr:z.2g}" for lr in lrs], fontsize=7)
    ax.set_yticks(range(len(cfg.warmups)), [str(w) for w in cfg.warmups], fontsize=7)
    ax.set_xlabel("peak lr (red: telling rate)", fontsize=8)
    ax.set_ylabel("warm-up steps", fontsize=8)
    ax.set_title(title, fontsize=9)
    if telling in lrs:
      ax.get_xticklabels()[lrs.index(telling)].set_color("red")
  fig.suptitle(f"Final val loss, mean of {len(cfg.seeds)} seeds (unigram {unigram:z.2f}; "
               f"div = diverged, stall = within {STALL_NATS} of unigram; red tick = telling rate)", fontsize=8)
  return ctx.save_figure(fig, "heatmap.png")


def _plot_curves(ctx, runs: dict, grid: dict, cfg, unigram: float, telling: float) -> str:
  """``curves_telling_rate.png`` of :func:`plot`; returns its file name."""
  all_means = [p["mean"] for p in grid.values()]
  fig, ax = ctx.subplots(figsize=(6.5, 3.8))
  top = unigram + 0.6
  clipped, init_losses, clipped_at, labels = [], [], {}, {}
  for pos, color in (("post", "C3"), ("pre", "C0")):
    for w, ls in zip(cfg.warmups, ("-", "--", ":", "-.")):
      if (pos, telling, w) not in runs:
        continue
      rs = runs[(pos, telling, w)]
      curves = [[(s, float(v)) for s, v in r["val_curve"]] for r in rs if r["val_curve"]]
      if not curves:
        continue
      n = min(len(c) for c in curves)
      steps = [s for s, _ in curves[0][:n]]
      vals = np.array([[v for _, v in c[:n]] for c in curves])
      name = f"{'Post' if pos == 'post' else 'Pre'}-LN, warm-up {w}"
      ax.plot(steps, np.nanmean(vals, axis=0), ls, color=color, marker="o", ms=2.5, label=name)
      ax.fill_between(steps, np.nanmin(vals, axis=0), np.nanmax(vals, axis=0), color=color, alpha=0.12)
      for c in curves:
        for s_, v in c:
          if v > top and s_ == 0:      # the initial loss: every run starts there, named in the title
            init_losses.append(v)
          elif v > top:
            clipped.append((s_, v))
            here = [x for t, x in clipped_at.get((color, s_), [])]
            clipped_at.setdefault((color, s_), []).append((s_, v))
            if not here:      # one marker and one label per layout and step (the largest value)
              ax.plot([s_], [top], marker="^", color=color, ms=6, clip_on=False)
            labels[(color, s_)] = (max(here + [v]), len(here) + 1)
      for r in rs:
        if r["diverged"]:
          ax.axvline(r["diverged_at"], color=color, ls=ls, lw=0.8)
  for k, ((color, s_), (v, n)) in enumerate(sorted(labels.items(), key=lambda t: t[0][1])):
    ax.annotate(f"{v:z.2f}" + (f" ({n} seeds)" if n > 1 else ""), (s_, top), fontsize=6, color=color,
                textcoords="offset points", xytext=(3, -8 - 8 * (k % 2)))
  ax.axhline(unigram, color="k", lw=0.8, ls=":", label="unigram plateau")
  ax.set_ylim(min(all_means) - 0.2, top)
  ax.set_title(f"Validation loss at the telling rate lr {telling:g} (seed mean, min-max band)"
               + (f"; ^ = a seed's value above {top:z.2f}, clipped (value written)" if clipped else ""), fontsize=8)
  if init_losses:
    ax.text(0.99, 0.97, f"step 0 (initial loss {min(init_losses):z.2f}-{max(init_losses):z.2f}) above the axis",
            transform=ax.transAxes, ha="right", va="top", fontsize=6)
  ax.set_xlabel("step")
  ax.set_ylabel("validation loss (nats/byte)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return ctx.save_figure(fig, "curves_telling_rate.png")


_FIGURES = (
    ("heatmap.png", "heat maps", "Heat maps: final validation loss (seed mean; colour bar in nats/byte) of every grid "
     "point, one panel per layout; a failed point is written in bold white with its failure and how many seeds "
     "failed."),
    ("final_vs_rate.png", "final loss against the peak rate, every seed", "Final validation loss against the peak "
     "rate, one panel per layout, every seed its own marker (open: the run failed)."),
    ("curves_grid.png", "validation curves of every seed at every grid point", "Validation curves of every seed at "
     "every grid point (rows: layouts; columns: rates)."),
    ("curves_telling_rate.png", "curves at the telling rate", "Validation curves at the telling rate: seed mean "
     "(line) and min-max band over seeds, per layout and warm-up; a value above the axis is marked by a triangle at "
     "the top edge with its value written."))


def section_figures(summary: dict, rel: str) -> list[str]:
  """The section's figures with their captions: those the summary lists in ``files`` (issue 63: a figure the
  run did not write, or the folder does not hold, is not linked)."""
  files = set(summary.get("files") or ())
  out = []
  for name, alt, caption in _FIGURES:
    if name in files:
      out += [f"![{alt}]({rel}/{name})", "", f"*{caption}*", ""]
  return out


def redraw(ctx, cfg, summary: dict) -> list[str]:
  """Draws again, from the summary's grid (its per-seed finals, failures and curves), the figures that need
  nothing else: ``final_vs_rate.png`` and ``curves_grid.png`` (issue 63: the committed gpu report's run did
  not write them); returns their file names. No verdict is recomputed (:mod:`experiments.suite.reanalyse`,
  ``--figures``). A failure is the summary's, re-read under issue 44's stalled-run rule
  (:func:`experiments.studies.seeds.late_counts_as_stalled`), the rule the figures' captions state: a summary
  judged before that rule (the committed gpu run's) then draws a late exit as stalled, as its caption says; for
  one judged by it nothing changes."""
  from experiments.studies.seeds import late_counts_as_stalled
  grid = {}
  for k, v in summary["grid"].items():
    pos, lr, w = k.split("|")[:3]
    grid[(pos, float(lr), int(w))] = late_counts_as_stalled(v, cfg.steps)
  lrs, unigram = summary["lrs"], summary["unigram_nats"]
  return [plot_final_vs_rate(ctx, grid, lrs, cfg, unigram), plot_curves_grid(ctx, grid, lrs, cfg, unigram)]
