r"""Experiment 3: depth (Liu et al. 2020 "Admin"; Wang et al. 2022 "DeepNet").

Post-LN, Pre-LN, Sandwich and DeepNorm LayerNorm models at increasing depth, trained with the
same AdamW settings for several seeds, at the preset's ``lr`` (fixed in the preset before
anything runs; since issue 24 the warm-up grid's telling rate is no longer read, since it was
picked from a gap inside the seeds' spread) with a long warm-up (Admin's failing runs had a
long warm-up too) and the grid's decay timescale. Reported per layout and depth: the final
validation loss (seed mean and spread) or the divergence step, and, from a separate short probe,

* DeepNet's model update :math:`\|F(x;\theta_t) - F(x;\theta_0)\| / \|F(x;\theta_0)\|` of the
  final hidden state (the head's input) on a fixed batch after each of the first
  ``update_steps`` steps (:func:`experiments.harness.probes.model_update_size`).

**Training length (rule).** ``steps`` must take Pre-LN at least :data:`PAST_PLATEAU` (0.5
nats) below the unigram baseline at every depth; the experiment checks it and a depth where
Pre-LN did not get there is not judged ("not testable" if no depth is). The ``cpu`` length came from one probe run
(Pre-LN, 24 layers, the cpu grid's third rate, 40 warm-up steps; ``docs/experiments.md``).

**Fails** means only: diverged, or stalled within ``STALL_NATS`` of the unigram baseline while
Pre-LN at that depth trained past the plateau, and some layout left the plateau within the first
third of the run (else the run is *too short* to tell a failure from a slow start). The ``cpu``
length is therefore at least three times the step at which the grid's Pre-LN with the long
warm-up left the plateau at the telling rate (step 40 of the cpu grid: 120 steps).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.studies.depth_rules import PAST_PLATEAU, verdicts
from experiments.studies.seeds import failed, format_finals, format_rises, late_counts_as_stalled, point, set_rises
from experiments.suite.runs import regime_tag
from experiments.suite.study import Unit, train_unit
from experiments.studies.flagship_answer import depth_answer as answer  # noqa: F401 (the study protocol's answer)
from experiments.studies.summary_lines import depth_instabilities as instabilities  # noqa: F401 (the protocol's)

TITLE = "Depth: deep Post-LN against Pre-LN, and DeepNet's model update (Liu et al. 2020; Wang et al. 2022)"
RAW_DATA = ('runs.json', 'final.csv', 'update.json')  # files the report links under the claims
HEADLINE = ("depth_final.png", "update_vs_depth.png")


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the depth experiment.

  Attributes:
    depths: numbers of layers of the training runs.
    positions: norm layouts to compare.
    steps: optimizer updates per run.
    seeds: training seeds.
    lr: peak learning rate of every run (fixed in the preset, not read from another study).
    warmup: linear warm-up steps (the grid's long warm-up).
    decay_timescale: ``tau`` of the inverse-sqrt decay (the grid's).
    update_depths: depths of the model-update probe (default: ``depths``).
    update_steps: the model update is read after each of the first this many steps.
    train_positions: the layouts trained (default: ``positions``); the update probe runs every
      layout of ``positions`` (issue 31: DeepNorm's training runs judge no claim, its probe does).
    update_seeds: seeds of the update probe (default: ``seeds``).
    shallow_positions: the layouts trained at the shallowest depth (default: the trained
      layouts); the depth rule reads only Post-LN there (issue 31: Pre-LN's shallow runs were
      shown, never judged, and cut for the budget).
  """

  depths: tuple = (6, 12, 24)
  positions: tuple = ("post", "pre", "sandwich", "deepnorm")
  steps: int = 150
  seeds: tuple = (0, 1)
  lr: float = 1e-3
  warmup: int = 40
  decay_timescale: int = 40
  update_depths: tuple | None = None
  update_steps: int = 4
  train_positions: tuple | None = None
  update_seeds: tuple | None = None
  shallow_positions: tuple | None = None

  def __post_init__(self):
    if not self.seeds:
      raise ValueError("seeds must name at least one seed.")
    extra = set(self.train_positions or ()) - set(self.positions)
    if extra:
      raise ValueError(f"train_positions must be layouts of positions {self.positions!r}, got {sorted(extra)!r}.")
    if isinstance(self.update_steps, bool) or not isinstance(self.update_steps, int) or self.update_steps < 1:
      raise ValueError(f"update_steps must be an int >= 1, got {self.update_steps!r}.")


def trained(cfg: Config) -> tuple:
  """The layouts whose training runs the study makes (``train_positions``, default ``positions``)."""
  return tuple(cfg.train_positions or cfg.positions)


def trained_at(cfg: Config, n_layers: int) -> tuple:
  """The layouts trained at depth ``n_layers``: ``shallow_positions`` at the shallowest depth (where
  set), :func:`trained` elsewhere."""
  if cfg.shallow_positions is not None and n_layers == min(cfg.depths):
    return tuple(p for p in trained(cfg) if p in cfg.shallow_positions)
  return trained(cfg)


def _gpu_design(summary: dict) -> str:
  """Where the summary is the committed gpu run's own (:func:`experiments.studies.gpu_reference.is_self`), what its
  design was and was not piloted on; else empty."""
  from experiments.studies import gpu_reference
  return f". {gpu_reference.DESIGN_SOURCE}" if gpu_reference.is_self(gpu_reference.load(), summary) else ""


def update_label(cfg) -> str:
  """How the model-update probe's numbers are aggregated, for its table, figure and caption: ``"seed mean"``
  over several probe seeds, ``"seed 0 only"`` over one (``cfg``: the study's config or its summary's dict; its
  ``update_seeds``, or ``seeds`` where those are None)."""
  get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
  seeds = list(get("update_seeds") or get("seeds"))  # None: the probe runs every seed
  return "seed mean" if len(seeds) > 1 else f"seed {seeds[0]} only"


def study_lr(cfg: Config) -> tuple[float, str]:
  """The peak rate of every depth run and where it came from: the preset, fixed before running."""
  return float(cfg.lr), ("the preset's rate, fixed before running from pilot runs on seeds the report never uses, "
                         "where Post-LN at the shallowest depth trained in every pilot seed "
                         "(experiments/results/pilots/flagship-44/README.md); not read from the warm-up grid's results")


def units(cfg: Config) -> list:
  """The training runs, then the model-update probes of :func:`run`, in its order (for the planner).

  A probe's train step is the depth runs' (the same compile key)."""
  lr = study_lr(cfg)[0]
  out = [train_unit("depth", f"depth-{pos}-L{L}-s{seed}", L, cfg.steps, pos,
                    run_key=("run", L, pos, "layer_norm", "xavier", lr, cfg.warmup, cfg.decay_timescale, cfg.steps,
                             seed))
         for L in cfg.depths for pos in trained_at(cfg, L) for seed in cfg.seeds]
  out += [Unit("depth", f"update-{pos}-L{L}-s{seed}", L, cfg.update_steps, ("train", L, pos, "layer_norm", "jaxnorm"),
               "update") for L in (cfg.update_depths or cfg.depths) for pos in cfg.positions
          for seed in (cfg.update_seeds or cfg.seeds)]
  return out


def run(ctx, cfg: Config) -> dict:
  """Runs the depth experiment; returns its summary.

  Trains (or loads from the cache) one LayerNorm model per (layout, depth, seed), probes the
  model update of the first ``update_steps`` steps per (layout, update depth, seed), checks
  DeepNorm's constants, and writes ``runs.json``, ``final.csv``, ``update.json`` and the plots.

  Returns:
    ``claims`` (:func:`verdicts`), ``files``, ``seeds``, ``lr`` and ``lr_source``, ``schedule``,
    ``points`` (per ``"<position>/L<depth>"``: seed mean, spread, values, failures),
    ``update`` (per ``"<position>/L<depth>"``: the per-step update, seed mean and per seed),
    ``deepnorm_constants``, ``unigram_nats`` and ``model``.
  """
  from experiments.harness import probes
  from experiments.harness.train_config import describe_schedule
  unigram = ctx.unigram()
  lr, lr_source = study_lr(cfg)
  runs, points = {}, {}
  specs = [(pos, L, seed) for L in cfg.depths for pos in trained_at(cfg, L) for seed in cfg.seeds]
  tc = None
  for pos, L, seed in ctx.iterate(specs, desc="runs"):
    mc = ctx.model_config(n_layers=L, norm_position=pos, norm_type="layer_norm")
    tc = ctx.train_config(mc, steps=cfg.steps, lr=lr, warmup=cfg.warmup, seed=seed,
                          decay_timescale=cfg.decay_timescale)
    r = ctx.train(tc, f"depth-{pos}-L{L}-lr{lr:g}-w{cfg.warmup}-s{seed}")
    runs.setdefault(f"{pos}/L{L}", []).append({
        "position": pos, "n_layers": L, "seed": seed, "run": r.path.name,
        **{k: r.summary.get(k) for k in ("final_val_loss", "diverged", "diverged_at", "val_curve")},
        "train_curve": r.summary.get("train_curve")})
  set_rises(runs)
  for k, v in runs.items():
    points[k] = late_counts_as_stalled(point(v, unigram), cfg.steps)
  update = {}
  udepths = cfg.update_depths or cfg.depths
  uspecs = [(pos, L, seed) for L in udepths for pos in cfg.positions for seed in (cfg.update_seeds or cfg.seeds)]
  for pos, L, seed in ctx.iterate(uspecs, desc="model update"):
    mc = ctx.model_config(n_layers=L, norm_position=pos, norm_type="layer_norm")
    utc = ctx.train_config(mc, steps=cfg.steps, lr=lr, warmup=cfg.warmup, seed=seed,
                           decay_timescale=cfg.decay_timescale)
    sizes = ctx.cached(f"update-{pos}-L{L}-s{seed}", {"train": utc, "steps": cfg.update_steps},
                       lambda mc=mc, utc=utc: probes.model_update_size(mc, utc, ctx.corpus(),
                                                                       steps=cfg.update_steps))
    update.setdefault(f"{pos}/L{L}", {"per_seed": []})["per_seed"].append(sizes)
  for u in update.values():
    u["mean"] = np.mean(u["per_seed"], axis=0).tolist()
  from jaxnorm.models import deepnorm_alpha_beta
  consts = {str(L): deepnorm_alpha_beta(L) for L in sorted(set(cfg.depths) | set(udepths))}
  claims = probe_seeds(verdicts(points, update, consts, cfg, unigram), cfg)
  tag = regime_tag(ctx, max(cfg.depths), cfg.steps)
  claims = [{**c, "ours": f"{tag} {c['ours']}"} if c["id"] == "admin_deep_postln_fails" else c for c in claims]
  ctx.save_json("runs.json", {"runs": runs, "points": points})
  ctx.save_json("update.json", update)
  ctx.save_csv("final.csv", ["position", "L", "seed", "final_val_loss", "diverged_at", "failure"],
               ([r["position"], r["n_layers"], r["seed"], r["final_val_loss"], r["diverged_at"],
                 failed(r, unigram) or ""] for v in runs.values() for r in v))
  files = plot(ctx, runs, points, update, cfg, unigram, lr)
  return {"claims": claims, "files": files, "seeds": list(cfg.seeds), "lr": lr, "lr_source": lr_source,
          "schedule": describe_schedule(tc) if tc is not None else "", "points": points, "update": update,
          "deepnorm_constants": consts, "unigram_nats": unigram, "model": dict(ctx.preset["model"])}


def plot(ctx, runs: dict, points: dict, update: dict, cfg: Config, unigram: float, lr: float) -> list[str]:
  """Draws the figures of the depth experiment into its folder.

  ``depth_final.png``: final validation loss (seed mean, min-max bars; failures marked) against
  depth per layout, with the unigram baseline and the "past the plateau" line;
  ``depth_curves.png``: the validation curves of every seed (marker = seed); ``update_vs_depth.png``:
  the model update of the final hidden state after each of the first steps against depth.

  Returns:
    The PNG file names.
  """
  return [_plot_final(ctx, points, cfg, unigram, lr), _plot_curves(ctx, runs, cfg, unigram),
          _plot_update(ctx, update, cfg)]


_COLORS = {"post": "C3", "pre": "C0", "sandwich": "C2", "deepnorm": "C4"}  # one colour per layout


def _plot_final(ctx, points: dict, cfg: Config, unigram: float, lr: float) -> str:
  """``depth_final.png`` of :func:`plot`; returns its file name."""
  fig, ax = ctx.subplots(figsize=(6, 4))
  for i, pos in enumerate(trained(cfg)):
    ds = [L for L in cfg.depths if pos in trained_at(cfg, L)]
    x = np.asarray(ds, np.float64) * (1 + 0.03 * (i - 1.5))
    m = [points[f"{pos}/L{L}"]["mean"] for L in ds]
    lo = [m[j] - min(points[f"{pos}/L{L}"]["values"]) for j, L in enumerate(ds)]
    hi = [max(points[f"{pos}/L{L}"]["values"]) - m[j] for j, L in enumerate(ds)]
    ax.errorbar(x, m, yerr=[lo, hi], fmt="o-", color=_COLORS[pos], capsize=3, label=pos)
    for j, L in enumerate(ds):
      n = sum(1 for f in points[f"{pos}/L{L}"]["failures"] if f)
      if n:
        ax.annotate(f"fail {n}/{len(cfg.seeds)}", (x[j], m[j]), fontsize=7, color=_COLORS[pos],
                    xytext=(3, 5), textcoords="offset points")
  ax.axhline(unigram, color="k", ls=":", lw=1, label="unigram")
  ax.axhline(unigram - PAST_PLATEAU, color="grey", ls="--", lw=0.8, label=f"unigram - {PAST_PLATEAU}")
  ax.set_xscale("log")
  ax.set_xticks(list(cfg.depths), [str(L) for L in cfg.depths])
  ax.minorticks_off()
  ax.set_xlabel("number of layers")
  ax.set_ylabel("final validation loss")
  ax.set_title(f"Depth: final val loss (lr {lr:g}, warm-up {cfg.warmup}, {cfg.steps} steps, "
               f"{len(cfg.seeds)} seeds)", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return ctx.save_figure(fig, "depth_final.png")


def _plot_curves(ctx, runs: dict, cfg: Config, unigram: float) -> str:
  """``depth_curves.png`` of :func:`plot`; returns its file name."""
  styles = ["-", "--", ":", "-."]
  fig, ax = ctx.subplots(figsize=(6.5, 4))
  markers = "osd^v<>"
  for pos in trained(cfg):
    for di, L in enumerate(cfg.depths):
      for si, r in enumerate(runs.get(f"{pos}/L{L}", [])):
        if r["val_curve"]:
          s, v = zip(*r["val_curve"])
          ax.plot(s, [float(x) for x in v], styles[di % 4], color=_COLORS[pos], marker=markers[si % 7], ms=2,
                  lw=1, label=f"{pos} L={L}" if si == 0 else None)
        if r["diverged"]:
          ax.axvline(r["diverged_at"], color=_COLORS[pos], ls=styles[di % 4], lw=0.8)
  ax.axhline(unigram, color="k", ls=":", lw=1)
  top = unigram + 1.0
  n_clip, init_losses = 0, []
  for pos in trained(cfg):
    for L in cfg.depths:
      for r in runs.get(f"{pos}/L{L}", []):
        for s_, v in r["val_curve"] or []:
          if float(v) > top and int(s_) == 0:   # the initial loss, named once below (not one label per run)
            init_losses.append(float(v))
          elif float(v) > top:
            n_clip += 1
            ax.plot([s_], [top], marker="^", color=_COLORS[pos], ms=6, clip_on=False)
            ax.annotate(f"{float(v):z.2f}", (s_, top), fontsize=6, color=_COLORS[pos], textcoords="offset points",
                        xytext=(3, -8))
  ax.set_ylim(unigram - 1.2, top)
  if init_losses:
    ax.text(0.99, 0.97, f"step 0 (initial loss {min(init_losses):z.2f}-{max(init_losses):z.2f}) above the axis",
            transform=ax.transAxes, ha="right", va="top", fontsize=6)
  ax.set_title(f"Validation loss, every seed ({len(cfg.seeds)}; marker = seed, line style = depth)"
               + (f"; ^ = value above {top:z.2f}, clipped" if n_clip else ""), fontsize=8)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=6, ncol=2)
  return ctx.save_figure(fig, "depth_curves.png")


def probe_seeds(claims: list[dict], cfg) -> list[dict]:
  """``claims`` with the update probe's claim carrying the probe's own seeds (``update_seeds``, or ``seeds``
  where those are None) for the verdict table's seeds column, which otherwise shows the study's training seeds
  (issue 63: the gpu report listed [0, 1, 2] for a probe of seed 0)."""
  get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
  seeds = list(get("update_seeds") or get("seeds"))
  return [{**c, "seeds": seeds} if c["id"] == "deepnet_update_constant" else c for c in claims]


def redraw(ctx, cfg: Config, summary: dict) -> dict:
  """``update_vs_depth.png`` again from the summary's probe numbers (``reanalyse --figures``, issue 63: its title
  names how the probe's seeds are aggregated, :func:`update_label`), and the probe claim's seeds
  (:func:`probe_seeds`); no verdict changes."""
  out = {"claims": probe_seeds(summary.get("claims", []), cfg)}
  out["files"] = [_plot_update(ctx, summary["update"], cfg)] if summary.get("update") else []
  return out


def _plot_update(ctx, update: dict, cfg: Config) -> str:
  """``update_vs_depth.png`` of :func:`plot`; returns its file name."""
  import matplotlib.ticker
  udepths = sorted(cfg.update_depths or cfg.depths)
  fig, axes = ctx.subplots(1, cfg.update_steps, figsize=(3.2 * cfg.update_steps, 3.2), squeeze=False, sharey=True)
  for s in range(cfg.update_steps):
    ax = axes[0, s]
    for pos in cfg.positions:
      v = [update[f"{pos}/L{L}"]["mean"][s] for L in udepths]
      ax.plot(udepths, v, "o-", color=_COLORS[pos], label=pos)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(udepths, [str(L) for L in udepths])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"after step {s + 1}", fontsize=9)
    ax.set_xlabel("number of layers N")
    ax.grid(alpha=0.3, which="both")
  axes[0, 0].set_ylabel("||F(x;θ_t) - F(x;θ_0)|| / ||F(x;θ_0)||")
  axes[0, 0].legend(fontsize=7)
  fig.suptitle(f"DeepNet's model update of the final hidden state over the first steps ({update_label(cfg)})",
               fontsize=9)
  return ctx.save_figure(fig, "update_vs_depth.png")


_NAMES = {"post": "Post-LN", "pre": "Pre-LN", "sandwich": "Sandwich-LN", "deepnorm": "DeepNorm"}


def _names(positions) -> str:
  return ", ".join(_NAMES.get(p, p) for p in positions)


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the depth experiment: setup (rate and its source, schedule, length
  rule), the plots and the per-point table.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.suite.report`.
  """
  cfg = summary["config"]
  lines = [
      f"Setup: LayerNorm byte-level LMs of width {summary['model']['d_model']}, depths {cfg['depths']}, seeds "
      f"{cfg['seeds']}; trained: {_names(cfg.get('train_positions') or cfg['positions'])}; in the model-update "
      f"probe: {_names(cfg['positions'])}. Peak lr {summary['lr']:g} ({summary['lr_source']})"
      f"{_gpu_design(summary)}. Schedule of every run: "
      f"{summary['schedule']}. A depth is judged only where Pre-LN ends >= {PAST_PLATEAU} nats below the unigram "
      f"plateau of the validation batches ({summary['unigram_nats']:z.3f}) in every seed, and only if Post-LN trains "
      f"at "
      f"the shallowest depth in every seed (else depth is confounded with the rate). Admin's failures are "
      "12-18-layer encoder-decoders "
      "on WMT14 (RAdam, 8000 warm-up steps, lr 1e-3, fp16); this is a small decoder-only model.", "",
      f"![final loss vs depth]({rel}/depth_final.png)", "",
      "*Final validation loss against depth per layout: seed mean with min-max bars; 'fail k/n' marks failed "
      "seeds; dotted: unigram baseline, dashed: the 'past the plateau' line.*", "",
      f"![curves]({rel}/depth_curves.png)", "",
      "*Validation curves of every run (colour = layout, line style = depth, marker = seed); a value above the "
      "axis is marked by a triangle at the top edge with its value.*", "",
      f"![update vs depth]({rel}/update_vs_depth.png)", "",
      "*DeepNet's relative model update of the final hidden state after each of the first steps, against depth "
      f"(log-log, {update_label(cfg)}), every layout.*", "",
      "Mean ± half-range over seeds (a stalled run keeps its own loss, a diverged one counts at the unigram "
      "baseline); per seed: each run's own final val loss (marked stalled) or the step where it diverged; "
      "largest rise: each seed's largest training-loss rise above its running minimum over every step (the number "
      "the instability list reads; a **spike** above 1 nat); "
      "left plateau: each seed's first evaluation below the plateau minus 0.1.",
      "", "| layout / depth | final val loss (mean ± half-range) | per seed | failures | largest rise per seed | "
      "left plateau at |", "|---|---|---|---|---|---|"]
  for k, p in summary["points"].items():
    fails = ", ".join(f for f in p["failures"] if f) or "-"
    lines.append(f"| {k} | {p['mean']:z.3f} ± {p['spread'] / 2:z.3f} | {format_finals(p)} | {fails} | "
                 f"{format_rises(p)} | "
                 + ", ".join("never" if x is None else str(x) for x in p.get("left_plateau", [])) + " |")
  lines += ["", f"Model update of the final hidden state (relative, {update_label(cfg)}) after steps "
            f"1..{cfg['update_steps']}:",
            "", "| layout / depth | " + " | ".join(f"step {s + 1}" for s in range(cfg["update_steps"])) + " |",
            "|---|" + "---|" * cfg["update_steps"]]
  for k, u in summary["update"].items():
    lines.append(f"| {k} | " + " | ".join(f"{v:z.3g}" for v in u["mean"]) + " |")
  lines.append("")
  return "\n".join(lines)
