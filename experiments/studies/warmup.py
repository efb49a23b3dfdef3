r"""Experiment 2: a learning-rate x warm-up grid (Xiong et al. 2020, Sec. 3.2 and Fig. 2).

Post-LN LayerNorm models at every warm-up length of the grid and Pre-LN without warm-up, trained
with AdamW(0.9, 0.98) and the inverse-square-root schedule at every peak learning rate of the
grid, for every seed (:func:`grid_layouts`: the claims compare Pre-LN without warm-up with
Post-LN, so since issue 31 Pre-LN with warm-up is not trained). Every run decays on the same
timescale ``tau`` (``decay_timescale``), so with/without warm-up runs differ only in the warm-up.
Optionally RMSNorm and GPT-2's small init at the grid's telling rate (observations; off in the
``cpu`` preset).

**The design (issue 31).** The ``cpu`` preset's sizes (300 steps of 16 x 32 tokens, warm-ups 0
and 60 = 1/5 of the run, rates ``c / d`` for ``c`` in 0.0632, 0.2, 0.632, seeds 0-2) were chosen
from pilot runs on seeds 100-102 that the report never uses
(``experiments/results/pilots/README.md``): every plateau exit of the pilots fell by step 120
of 300, Post-LN trained in every pilot seed at the bottom rate and failed at the top one. The
rates are in units of :math:`1/d`: with Adam every step moves each weight by about the learning
rate, so a :math:`d \times d` matrix's output moves by about :math:`\eta\, d` relative to its size
(:data:`LR_TIMES_D` is the older four-rate range, still the default of :class:`Config`).
The report checks both ends (every layout trains at the bottom; Pre-LN is worse at the top than
at its best rate).

**Failure.** A run *fails* if it diverges (NaN/Inf or a loss above ``divergence_loss``) or is
*stalled*: validation loss within :data:`STALL_NATS` (0.1 nats) of the unigram plateau of the
validation batches (:meth:`experiments.suite.runs.RunsMixin.unigram`) at the end, or still at 2/3
of the run (:func:`experiments.studies.seeds.late_counts_as_stalled`, issue 44).

**The design (issue 44).** Five rates over the decade (a quarter decade apart), 200-step runs,
warm-ups 0 and 40, chosen on the pilot seeds 100-102 (preset ``cpu-pilot``); the report runs on
seeds 10-12.

**The telling rate (rule fixed before any verdict is read).** Among the grid rates at which
Pre-LN without warm-up trains in every seed, the one with the largest seed-mean gap "Post-LN
without warm-up minus Post-LN with the long warm-up" in final validation loss (a failed run
counts at the unigram plateau); ties go to the smaller rate. RMSNorm and the small init run at
it (observations only). Its uncertainty is reported beside it: the paired (same-seed) gaps at
the chosen rate and at the runner-up; since issue 24 the depth study does not reuse it (a rate
picked from a gap inside the seeds' spread would carry that noise into another study).

**Peaks and spikes.** Every run's largest training-loss rise above its running minimum
(:func:`experiments.studies.seeds.largest_rise`) is kept and shown per seed in the tables; a rise
above 1 nat is marked as a spike, so an instability that recovers is not hidden behind its final
loss.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from experiments.studies import warmup_figures
from experiments.studies.seeds import (STALL_NATS, eval_noise, format_finals, format_rises, late_counts_as_stalled,
                                      point, set_rises)
from experiments.studies.warmup_rules import MARGIN, describe, verdicts
from experiments.suite.runs import regime_tag, train_run
from experiments.suite.study import train_unit
from experiments.studies.flagship_answer import warmup_answer as answer  # noqa: F401 (the study protocol's answer)
from experiments.studies.summary_lines import warmup_instabilities as instabilities  # noqa: F401 (the protocol's)
from experiments.studies.summary_lines import warmup_noise_line as noise_line  # noqa: F401 (the protocol's)

TITLE = "Warm-up x learning-rate grid (Xiong et al. 2020, Sec. 3.2 / Fig. 2)"
RAW_DATA = ('runs.json', 'final.csv')  # files the report links under the claims
HEADLINE = ("final_vs_rate.png",)             # figures of the report's first screen

LR_TIMES_D = (0.0632, 0.2, 0.632, 2.0)  # peak lr x d_model: 1.5 decades (see the module docstring)


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the warm-up grid.

  Attributes:
    n_layers: depth of every model.
    steps: optimizer updates per run.
    lr_times_d: peak learning rates in units of ``1 / d_model`` (see the module docstring).
    warmups: warm-up lengths, increasing, the first 0 (none) and the last the long one the
      claims compare with none.
    decay_timescale: ``tau`` of the inverse-sqrt decay, the same for every run of the grid.
    seeds: training seeds (every grid point runs each).
    rms_norm: also run RMSNorm (Post/Pre, no and long warm-up) at the telling rate.
    small_init: also run GPT-2's small init (Post/Pre, no warm-up) at the telling rate.
  """

  n_layers: int = 6
  steps: int = 120
  lr_times_d: tuple = LR_TIMES_D
  warmups: tuple = (0, 10, 40)
  decay_timescale: int = 40
  seeds: tuple = (0, 1)
  rms_norm: bool = True
  small_init: bool = True

  def __post_init__(self):
    w = tuple(self.warmups)
    if len(w) < 2 or w[0] != 0 or any(a >= b for a, b in zip(w, w[1:])):
      raise ValueError(f"warmups must be (0, ..., long): >= 2 increasing lengths from 0, got {self.warmups!r}.")
    if not self.seeds:
      raise ValueError("seeds must name at least one seed.")


class GridKey(NamedTuple):
  """A grid point as labelled in ``done.json``: ``position|lr|warmup``, and ``|variant`` for the
  points at the telling rate (``rms_norm``, ``small_init``); see :func:`label`."""
  position: str
  lr: float
  warmup: int
  variant: str = "layer_norm"

  @classmethod
  def parse(cls, text: str) -> GridKey:
    """The key of a label written by :func:`label`."""
    position, lr, warmup, *variant = text.split("|")
    return cls(position, float(lr), int(warmup), *variant)


def label(key: tuple) -> str:
  """The ``|``-joined label of a grid point's or a run's key (``(position, lr, warmup[, ...])``)."""
  return "|".join(map(str, key))


def grid_lrs(cfg: Config, d_model: int) -> list[float]:
  r"""The peak learning rates of the grid: :math:`\eta_k = c_k / d` (rounded to 4 digits)."""
  return [float(f"{c / d_model:z.4g}") for c in cfg.lr_times_d]


def grid_layouts(cfg: Config) -> list[tuple[str, int]]:
  """The (position, warm-up) pairs trained at every rate: Post-LN at every warm-up, Pre-LN without
  (the claims compare Pre-LN without warm-up with Post-LN; Pre-LN with warm-up is not read by any
  rule since issue 31, and leaving it out pays for a third seed)."""
  return [("post", w) for w in cfg.warmups] + [("pre", 0)]


def _spec(pos, lr, w, norm="layer_norm", init="xavier"):
  return {"norm_position": pos, "norm_type": norm, "init": init, "lr": lr, "warmup": w}


def telling_rate(grid: dict, lrs: list[float], long_w: int) -> float:
  """The telling rate of the module docstring's rule, from the LayerNorm grid points."""
  best, best_gap = None, -np.inf
  for lr in lrs:
    if not grid[("pre", lr, 0)]["trains"]:
      continue
    gap = grid[("post", lr, 0)]["mean"] - grid[("post", lr, long_w)]["mean"]
    if gap > best_gap + 1e-12:
      best, best_gap = lr, gap
  return best if best is not None else lrs[0]


def telling_uncertainty(grid: dict, lrs: list[float], long_w: int, telling: float) -> str:
  r"""The telling rate's gap with its paired per-seed gaps, beside the runner-up's.

  .. math:: g_i(\eta) = L_{\text{Post, no warm-up}}^{(i)}(\eta) - L_{\text{Post, warm-up}}^{(i)}(\eta)

  The choice is *clear* only if every seed's gap at the telling rate exceeds every seed's gap at
  the runner-up; otherwise it is within the seeds' spread.
  """
  def gaps(lr):
    return [a - b for a, b in zip(grid[("post", lr, 0)]["values"], grid[("post", lr, long_w)]["values"])]
  cands = [lr for lr in lrs if grid[("pre", lr, 0)]["trains"] and lr != telling]
  g = gaps(telling)
  text = (f"telling rate {telling:g}: gap {np.mean(g):+z.3f} nats (per seed "
          + ", ".join(f"{x:+z.3f}" for x in g) + ")")
  if not cands:
    return text + "; no other rate where Pre-LN trains"
  runner = max(cands, key=lambda lr: np.mean(gaps(lr)))
  r = gaps(runner)
  clear = min(g) > max(r)
  return (text + f"; runner-up {runner:g}: {np.mean(r):+z.3f} (per seed " + ", ".join(f"{x:+z.3f}" for x in r)
          + ") -> " + ("clear" if clear else "within the seeds' spread: the choice is not robust"))


def units(cfg: Config) -> list:
  """The training runs of :func:`run`, in its order (for the planner): the grid, then the
  RMSNorm and small-init runs at the telling rate."""
  out = [train_unit("warmup", f"{pos}-lr{i}-w{wu}-s{seed}", cfg.n_layers, cfg.steps, pos,
                    run_key=("run", cfg.n_layers, pos, "layer_norm", "xavier", ("lr/d", c), wu, cfg.decay_timescale,
                             cfg.steps, seed))
         for i, c in enumerate(cfg.lr_times_d) for pos, wu in grid_layouts(cfg) for seed in cfg.seeds]
  extra = []
  if cfg.rms_norm:
    extra += [(pos, wu, "rms_norm", "xavier") for pos, wu in grid_layouts(cfg) if wu in (0, cfg.warmups[-1])]
  if cfg.small_init:
    extra += [(pos, 0, "layer_norm", "small") for pos in ("post", "pre")]
  out += [train_unit("warmup", f"{pos}-{norm}-{init}-telling-w{wu}-s{seed}", cfg.n_layers, cfg.steps, pos, norm)
          for pos, wu, norm, init in extra for seed in cfg.seeds]
  return out


def _train_points(ctx, cfg: Config, specs: list[dict], extra_kw: dict) -> dict:
  """Trains (or loads from the cache) every spec of ``specs`` for every seed of ``cfg``.

  Returns:
    ``{(norm_position, lr, warmup, norm_type, init): [run dict per seed]}``, each run dict with
    ``spec``, ``seed``, ``run`` (its folder name) and the summary's final losses, divergence
    and curves.
  """
  out = {}
  for spec, seed in ctx.iterate([(s, seed) for s in specs for seed in cfg.seeds], desc="runs"):
    r = train_run(ctx, spec, cfg.n_layers, cfg.steps, seed=seed, **extra_kw)
    key = (spec["norm_position"], spec["lr"], spec["warmup"], spec["norm_type"], spec["init"])
    out.setdefault(key, []).append({
        "spec": spec, "seed": seed, "run": r.path.name,
        **{k: r.summary.get(k) for k in ("final_val_loss", "final_val_loss_alt", "diverged", "diverged_at",
                                         "val_curve")},
        "train_curve": r.summary.get("train_curve")})
  return out


def _save_raw(ctx, all_runs: dict, unigram: float, steps: int) -> None:
  """Writes ``runs.json`` (every run, by point label) and ``final.csv`` (one row per run: its
  point, seed, final validation loss, divergence step and failure by the report's definition:
  diverged, stalled at the end, or still on the plateau at 2/3 of the run, issue 50)."""
  ser = {label(k): v for k, v in all_runs.items()}
  ctx.save_json("runs.json", ser)
  rows = []
  for k, v in all_runs.items():
    fails = late_counts_as_stalled(point(v, unigram), steps)["failures"]
    for r, f in zip(v, fails):
      rows.append([label(k), r["seed"], r["final_val_loss"], r["diverged_at"], f or ""])
  ctx.save_csv("final.csv", ["point", "seed", "final_val_loss", "diverged_at", "failure"], rows)


def run(ctx, cfg: Config) -> dict:
  """Runs the grid; returns its summary.

  Trains (or loads from the cache) every LayerNorm grid point for every seed, picks the telling
  rate, then the RMSNorm and small-init runs there; judges the claims and writes ``runs.json``,
  ``final.csv`` and the plots.

  Returns:
    ``claims``, ``files``, ``seeds``, ``lrs``, ``telling_lr``, ``grid`` (per point: mean,
    spread, values, failures), ``extra_points`` (RMSNorm, small init), ``max_surviving``,
    ``range_check``, ``schedule``, ``unigram_nats`` and ``model``.
  """
  from experiments.harness.train_config import describe_schedule
  unigram = ctx.unigram()
  d = ctx.preset["model"]["d_model"]
  lrs = grid_lrs(cfg, d)
  extra_kw = {"decay_timescale": cfg.decay_timescale}

  specs = [_spec(pos, lr, w) for lr in lrs for pos, w in grid_layouts(cfg)]
  all_runs = _train_points(ctx, cfg, specs, extra_kw)
  shared = set_rises(all_runs)
  runs = {(k[0], k[1], k[2]): v for k, v in all_runs.items()}
  grid = {k: late_counts_as_stalled(point(v, unigram), cfg.steps) for k, v in runs.items()}
  long_ = cfg.warmups[-1]
  telling = telling_rate(grid, lrs, long_)
  telling_text = telling_uncertainty(grid, lrs, long_, telling)
  ctx.log(telling_text)
  extra_specs = []
  if cfg.rms_norm:
    extra_specs += [_spec(pos, telling, w, norm="rms_norm") for pos, w in grid_layouts(cfg) if w in (0, long_)]
  if cfg.small_init:
    extra_specs += [_spec(pos, telling, 0, init="small") for pos in ("post", "pre")]
  extra_runs = _train_points(ctx, cfg, extra_specs, extra_kw)
  set_rises(extra_runs, shared)
  all_runs.update(extra_runs)
  extra_points = {(k[0], k[1], k[2], k[3] if k[4] == "xavier" else "small_init"):
                  late_counts_as_stalled(point(v, unigram), cfg.steps) for k, v in extra_runs.items()}

  claims, extra = verdicts(grid, lrs, cfg, unigram, ctx.preset["train"]["eval_every"])
  tag = regime_tag(ctx, cfg.n_layers, cfg.steps)
  claims = [{**c, "ours": f"{tag} {c['ours']}"} if c.get("holds") != "obs" else c for c in claims]
  noise = eval_noise(runs, lrs, cfg.warmups[-1], grid)
  lo, hi = lrs[0], lrs[-1]
  bottom_ok = all(grid[(p, lo, w)]["trains"] for p, w in grid_layouts(cfg))
  best_pre = min(grid[("pre", lr, 0)]["mean"] for lr in lrs)
  top_ok = (not grid[("pre", hi, 0)]["trains"]) or grid[("pre", hi, 0)]["mean"] > best_pre + MARGIN
  range_check = {"bottom_every_layout_trains": bottom_ok, "top_pre_ln_degrades": top_ok,
                 "pre_ln_top": grid[("pre", hi, 0)]["mean"], "pre_ln_best": best_pre}
  obs = []
  for (pos, lr, w, var), p in extra_points.items():
    base = grid[(pos, lr, w)]
    obs.append(f"{'Post' if pos == 'post' else 'Pre'}-LN w{w} {var.replace('_', ' ')}: {describe(p)} "
               f"(LayerNorm Xavier {describe(base)})")
  if obs:
    claims.append({"id": "warmup_variants", "criterion": f"observation at the telling rate lr {telling:g}",
                   "ours": "; ".join(obs), "holds": "obs"})

  tc = ctx.train_config(ctx.model_config(n_layers=cfg.n_layers), steps=cfg.steps, lr=telling,
                        warmup=long_, **extra_kw)
  schedule = describe_schedule(tc).replace(f"peak {telling:g}", "peak lr").replace(
      f"warm-up {long_}", f"warm-up {'/'.join(map(str, cfg.warmups))}")
  _save_raw(ctx, all_runs, unigram, cfg.steps)
  files = warmup_figures.plot(ctx, runs, grid, lrs, cfg, unigram, telling, extra_points)
  return {"claims": claims, "files": files, "seeds": list(cfg.seeds), "lrs": lrs, "telling_lr": telling,
          "telling_text": telling_text,
          "grid": {label(k): v for k, v in grid.items()},
          "extra_points": {label(k): v for k, v in extra_points.items()},
          **extra, "range_check": range_check, "eval_noise": noise,
          "shared_rise_steps": {str(k): v for k, v in shared.items()}, "schedule": schedule, "unigram_nats": unigram,
          "model": dict(ctx.preset["model"])}


def redraw(ctx, cfg: Config, summary: dict) -> dict:
  """What the summary holds beyond its verdicts, from the raw data again (``reanalyse --figures``, issue 63): the
  figures its grid holds the data of (:func:`warmup_figures.redraw`) and the measured noise from ``runs.json``
  (:func:`experiments.studies.seeds.eval_noise`, with the pairs where both runs trained). No verdict changes."""
  from experiments.suite.registry import read_json
  runs = {}
  for k, rs in read_json(ctx.exp_dir / "runs.json").items():   # "post|0.001|40|layer_norm|xavier"
    pos, lr, w, *rest = k.split("|")
    if rest == ["layer_norm", "xavier"]:
      runs[(pos, float(lr), int(w))] = rs
  grid = {(GridKey.parse(k).position, GridKey.parse(k).lr, GridKey.parse(k).warmup): v
          for k, v in summary["grid"].items()}
  return {"files": warmup_figures.redraw(ctx, cfg, summary),
          "eval_noise": eval_noise(runs, summary["lrs"], max(cfg.warmups), grid)}


def _shared_text(shared: dict | None) -> str:
  if not shared:
    return "not computed"
  return "; ".join(f"seed {k}: steps {', '.join(map(str, v)) or 'none'}" for k, v in shared.items())


def _noise_text(noise: dict | None) -> str:
  if not noise or not noise.get("single"):
    return "Evaluation noise: not measured in this run."
  s, p = noise["single"], noise.get("paired")
  return (f"Evaluation noise, measured (the same final model on a second set of validation windows): a run's loss "
          f"moves by median {s['median']:z.3f}, at most {s['max']:z.3f} nats over {s['n']} runs"
          + (f"; a paired warm-up gain moves by median {p['median']:z.3f}, at most {p['max']:z.3f} over {p['n']} pairs"
             if p else "")
          + (f"; a paired Pre-LN minus Post-LN difference by median {q['median']:z.3f}, at most {q['max']:z.3f} "
             f"over {q['n']} pairs" if (q := noise.get("pre_post")) else "")
          + f" (the rules' paired margin: {MARGIN} nats).")


def appendix_note(summary: dict) -> str | None:
  """A line the appendix prints above its verdict tables (a study hook, read by the report): for the committed
  gpu run, that its stored criteria are its commit's rules while the testable-when column is today's text
  (:data:`experiments.studies.gpu_reference.RULE_NOTE`; issue 63's second referee); None for any other run."""
  from experiments.studies import gpu_reference
  return f"{gpu_reference.RULE_NOTE}." if gpu_reference.is_self(gpu_reference.load(), summary) else None


def _design_source(summary: dict) -> str:
  """Where this grid's design came from: the committed gpu run's own words where the summary is that run's
  (:func:`experiments.studies.gpu_reference.is_self`), else the flagship pilots the cpu presets were chosen on."""
  from experiments.studies import gpu_reference
  if gpu_reference.is_self(gpu_reference.load(), summary):
    return f"{gpu_reference.DESIGN_SOURCE}. {gpu_reference.RULE_NOTE}"
  return ("Rates, length, warm-ups and seeds were chosen from pilot runs on seeds 100-102, which this report does "
          "not use (preset `cpu-pilot`, `experiments/results/pilots/flagship-44/`), and committed before this run")


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the grid: setup (range rule, schedule, failure definition, telling
  rate), the heat maps and curves, the range check and the per-point table.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.suite.report`.
  """
  cfg = summary["config"]
  rc = summary["range_check"]
  d = summary["model"]["d_model"]
  lines = [
      f"Setup: {cfg['n_layers']}-layer byte-level LMs (width {d}), AdamW(0.9, 0.98), {cfg['steps']} steps, "
      f"seeds {cfg['seeds']} at every point. Schedule of every run: {summary['schedule']} (the same decay "
      f"timescale for every warm-up). Post-LN at warm-ups {list(cfg['warmups'])}, Pre-LN without warm-up. Peak "
      f"lr = c / d for c in {list(cfg['lr_times_d'])} (lr {', '.join(f'{x:g}' for x in summary['lrs'])}; Adam "
      f"moves a d x d matrix's output by about lr x d). {_design_source(summary)}. A run fails if it diverges, or "
      f"is within {STALL_NATS} nats of the unigram plateau of the validation batches "
      f"({summary['unigram_nats']:z.3f} nats/byte: the byte-frequency model's loss on exactly those bytes) at the end "
      "or still at 2/3 of the run (a late exit counts as stalled and is listed). Telling rate (rule: largest seed-mean "
      "gap between "
      f"Post-LN without and with the long warm-up where Pre-LN trains): **{summary['telling_lr']:g}**; "
      f"{summary.get('telling_text', '')}. It picks where the curves and the RMSNorm / small-init "
      "observations are shown; no other study reuses it.", "",
      _noise_text(summary.get("eval_noise")), "",
      f"Range check: every layout trains at the bottom rate: {'yes' if rc['bottom_every_layout_trains'] else 'no'}; "
      f"Pre-LN (no warm-up) degrades at the top rate: {'yes' if rc['top_pre_ln_degrades'] else 'no'} "
      f"({rc['pre_ln_top']:z.3f} vs its best {rc['pre_ln_best']:z.3f}).", "",
      *warmup_figures.section_figures(summary, rel),
      "Mean ± half-range over seeds (a stalled run keeps its own loss, a diverged one counts at the unigram "
      "plateau); per seed: each run's own final val loss (marked stalled) or the step where it diverged; "
      "largest rise: each seed's largest training-loss rise above its running minimum over every step, the "
      "number the instability list reads (steps where most runs of a seed jump 0.3 nats together, hard batches: "
      f"{_shared_text(summary.get('shared_rise_steps'))}) (a **spike** if above "
      "1 nat, with its peak and step); left plateau: each seed's first evaluation below the plateau - "
      f"{STALL_NATS}.", "",
      "| layout | peak lr | warm-up | final val loss (mean ± half-range) | per seed | failures | largest rise "
      "per seed | left plateau at |",
      "|---|---|---|---|---|---|---|---|"]
  for src in ("grid", "extra_points"):
    for k, p in summary[src].items():
      key = GridKey.parse(k)
      fails = ", ".join(f for f in p["failures"] if f) or "-"
      lines.append(f"| {key.position} {key.variant} | {key.lr:g} | {key.warmup} | "
                   f"{p['mean']:z.3f} ± {p['spread'] / 2:z.3f} | "
                   f"{format_finals(p)} | {fails} | {format_rises(p)} | "
                   + ", ".join("never" if x is None else str(x) for x in p.get("left_plateau", [])) + " |")
  lines.append("")
  return "\n".join(lines)
