r"""The verdict rules of the warm-up grid (:mod:`experiments.studies.warmup`): plain numbers in, claims out.

Every rule takes grid points (:func:`experiments.studies.seeds.point`, keyed ``(position, lr,
warmup)``) and returns a claim dict (``id``, ``criterion``, ``ours``, ``holds``, ``per_seed``);
none trains or imports JAX, so ``tests/experiments/test_verdicts.py`` feeds each one synthetic results for
yes, partly, no and "not testable". The rules of issue 31 were frozen before the report's run
(the commit is named in the report); the pilots that chose the design (seeds >= 100) and the
report at 87da7be had been seen (the report's "Rule changes" section).

**Testability first.** Before any verdict each rule checks its claim's ``testable_when``
(:mod:`experiments.suite.claims`): the design's (the longest warm-up is at most
:data:`MAX_WARMUP_FRACTION` of the run; at least :data:`MIN_SEEDS` seeds) and the data's (a
*judged* rate: Pre-LN without warm-up left the plateau within the first third of the run in
every seed). Unmet conditions give "not testable" with the reason.

**Every run alike.** A run still on the plateau at :data:`~experiments.studies.seeds.LATE_FRACTION`
of the run (it left late, or never) counts as *stalled* (issue 44: before, a comparison that read a
late run was not judged, which dropped the very rate where warm-up mattered); its late exit is
listed beside the verdict. A diverged run and a stalled one both *fail*; a run *trains* otherwise.

**The warm-up claim's natural statistic (issue 44).** Per seed, the highest grid rate at which
Post-LN trains, without and with the long warm-up (Xiong et al.'s Fig. 2 reading: warm-up lets
Post-LN train at larger peak rates), on the judged rates; the paired loss gain per rate stays
beside it.

**Paired, per seed, robust.** Runs with the same seed share data order and init, so every
difference is taken per seed and holds in a seed beyond :data:`MARGIN`. Every rule is run on the
pooled seeds, on each seed alone (:func:`robust`; where seeds disagree the verdict says so) and
with each single (rate, seed) left out: "yes" needs every seed alone and every leave-one-out to
say "yes", else it is at most "partly".
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from experiments.studies.seeds import LATE_FRACTION, STALL_NATS, format_finals, seed_points, subset
from experiments.suite import claims as claims_lib


class Design(Protocol):
  """The sizes of the warm-up grid that the rules read: :class:`experiments.studies.warmup.Config` is one
  (the rules do not import the study, which imports them)."""

  steps: int
  warmups: tuple
  seeds: tuple


MARGIN = 0.05              # nats: a paired (same-seed) difference beyond this holds (eval noise ~0.03 nat)
FASTER = 0.9               # Pre-LN is "faster" if it needs <= this fraction of Post-LN's steps
TARGET_BELOW = 0.5         # nats: the speed target, this far below the unigram plateau (both layouts can miss it)
MAX_WARMUP_FRACTION = 0.2  # the longest warm-up must be at most this fraction of the run
MIN_SEEDS = 3              # a paired comparison needs at least this many seeds
MIN_EVALS = 4              # the speed claim needs at least this many evaluations per run


def describe(p: dict) -> str:
  """Seed mean ± half-range where every seed trained; else each seed's own result."""
  if not any(p["failures"]):
    return f"{p['mean']:z.3f} ± {p['spread'] / 2:z.3f}"
  return format_finals(p)


def paired(a: dict, b: dict) -> list[float]:
  r"""Per-seed differences ``a - b`` of two points trained with the same seeds (the paired comparison).

  .. math:: \Delta_i = L_a^{(i)} - L_b^{(i)}
  """
  return [x - y for x, y in zip(a["values"], b["values"])]


def _fmt_diffs(d: list[float]) -> str:
  return "(" + ", ".join(f"{x:+z.3f}" for x in d) + ")"


def design_reasons(cfg: Design, n_seeds: int, warmup_fraction: bool) -> list[str]:
  """The design conditions of the grid's claims that the preset does not meet (empty: all met)."""
  reasons = []
  if n_seeds < MIN_SEEDS:
    reasons.append(f"{n_seeds} seed(s), a paired comparison needs >= {MIN_SEEDS}")
  long_ = max(cfg.warmups)
  if warmup_fraction and long_ > MAX_WARMUP_FRACTION * cfg.steps:
    reasons.append(f"the longest warm-up ({long_} of {cfg.steps} steps, {long_ / cfg.steps:z.0%}) is more than "
                   f"{MAX_WARMUP_FRACTION:z.0%} of the run, not a small fraction of training")
  return reasons


def judged_rates(grid: dict, lrs: list[float], steps: int) -> list[float]:
  """The rates at which Pre-LN without warm-up left the plateau within the first third of the run in
  every seed (elsewhere a failure cannot be told from a slow start)."""
  def early(p):
    return p is not None and all(s is not None and s <= steps // 3 for s in p.get("left_plateau", [0]))
  return [lr for lr in lrs if early(grid.get(("pre", lr, 0)))]


def highest_trained(grid: dict, lrs: list[float], pos: str, w: int) -> list[float | None]:
  """Per seed, the highest of ``lrs`` at which the layout ``(pos, w)`` trains (None: at none of them)."""
  n = len(grid[(pos, lrs[0], w)]["failures"])
  return [max([lr for lr in lrs if not grid[(pos, lr, w)]["failures"][i]], default=None) for i in range(n)]


def _rate_text(rates: list[float | None]) -> str:
  return "(" + ", ".join("none" if r is None else f"{r:g}" for r in rates) + ")"


def needs_warmup(grid: dict, lrs: list[float], long_: int, steps: int) -> tuple[str, str]:
  """``xiong_postln_needs_warmup`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  del steps  # late runs are already stalled (seeds.late_counts_as_stalled)
  r0, rw = highest_trained(grid, lrs, "post", 0), highest_trained(grid, lrs, "post", long_)
  idx = {lr: k for k, lr in enumerate(lrs)}
  shift = [idx.get(b, -1) - idx.get(a, -1) for a, b in zip(r0, rw)]
  parts = [f"highest judged rate at which Post-LN trains, per seed: {_rate_text(r0)} without, {_rate_text(rw)} "
           f"with warm-up {long_}; warm-up moves it by {', '.join(f'{x:+d}' for x in shift)} grid step(s)"]
  helped = []
  for lr in lrs:
    p0, pw = grid[("post", lr, 0)], grid[("post", lr, long_)]
    gain = paired(p0, pw)
    helped += [g > MARGIN for g in gain]
    hurts = sum(g < -MARGIN for g in gain)
    parts.append(f"lr {lr:g}: Post-LN {describe(p0)} without vs {describe(pw)} with; paired gain "
                 f"{_fmt_diffs(gain)}" + (f", hurts in {hurts}" if hurts else ""))
  raised = [x >= 1 for x in shift]
  if all(raised):
    holds = "yes"
  elif any(raised) or any(helped):
    holds = "partly"
  else:
    holds = "no"
  if any(x < 0 for x in shift):
    parts.append("warm-up lowered the highest rate in some seed")
  return holds, "; ".join(parts)


def lr_sensitive(grid: dict, lrs: list[float], warmups, steps: int) -> tuple[str, str]:
  """``xiong_postln_lr_sensitive`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  del steps  # late runs are already stalled (seeds.late_counts_as_stalled)
  parts, oks = [], []
  for w in warmups:
    survives = [lr for lr in lrs if grid[("post", lr, w)]["trains"]]
    breaks = [lr for lr in lrs if survives and lr > min(survives) and grid[("pre", lr, 0)]["trains"]
              and grid[("post", lr, w)]["fails"]]
    if len(lrs) < 2:
      parts.append(f"warm-up {w}: {len(lrs)} judged rate(s), a sensitivity needs >= 2")
      continue
    if not survives:
      parts.append(f"warm-up {w}: Post-LN trains in every seed at no judged rate (fails outright: not judged)")
      continue
    oks.append(bool(breaks))
    parts.append(f"warm-up {w}: Post-LN trains in every seed at {', '.join(f'{x:g}' for x in survives)}; "
                 + (f"fails in every seed at {', '.join(f'{x:g}' for x in breaks)} where Pre-LN without warm-up "
                    "trains" if breaks else "no larger rate where it fails in every seed while Pre-LN trains"))
  if not oks:
    return claims_lib.not_testable(["no warm-up with two judged rates at which Post-LN trains at one: "
                                    + "; ".join(parts)])
  return claims_lib.verdict(oks), "; ".join(parts)


def preln_no_warmup(grid: dict, lrs: list[float], long_: int, steps: int) -> tuple[str, str]:
  """``xiong_preln_no_warmup`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  parts, oks = [], []
  for lr in lrs:
    post_w, pre0 = grid[("post", lr, long_)], grid[("pre", lr, 0)]
    if not post_w["trains"]:
      continue
    diff = paired(pre0, post_w)
    text = f"lr {lr:g}: {describe(pre0)} vs {describe(post_w)}, paired Pre - Post {_fmt_diffs(diff)}"
    oks.append(all(x <= MARGIN for x in diff))
    parts.append(text)
  if not oks:
    return claims_lib.not_testable([f"Post-LN with warm-up {long_} trained in every seed, with no run left late, "
                                    "at no judged rate" + (": " + "; ".join(parts) if parts else "")])
  return claims_lib.verdict(oks), "Pre-LN without vs Post-LN with warm-up: " + "; ".join(parts)


def steps_to_reach(curve, target):
  """First evaluation step of ``curve`` (``[(step, loss)]``) at which the loss is ``<= target`` (None if never)."""
  for s, v in curve:
    if np.isfinite(v) and v <= target:
      return int(s)
  return None


def faster(grid: dict, lrs: list[float], long_: int, steps: int, target: float) -> tuple[str, str]:
  """``xiong_preln_faster`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  def fmt(s):
    return "never" if s is None else f"step {s}"
  trained = [lr for lr in lrs if grid[("post", lr, long_)]["trains"]]
  pairs = [(f"lr {lr:g}", lr, lr) for lr in trained]
  if trained:
    post_best = min(trained, key=lambda lr: grid[("post", lr, long_)]["mean"])
    pre_best = min(lrs, key=lambda lr: grid[("pre", lr, 0)]["mean"])
    if (pre_best, post_best) != (post_best, post_best):
      pairs.append((f"each at its best rate (Pre-LN {pre_best:g}, Post-LN {post_best:g})", pre_best, post_best))
  oks, parts = [], []
  for name, lr_pre, lr_post in pairs:
    pre, post = grid[("pre", lr_pre, 0)], grid[("post", lr_post, long_)]
    seeds_txt = []
    for c_pre, c_post in zip(pre["curves"], post["curves"]):
      s_pre, s_post = steps_to_reach(c_pre, target), steps_to_reach(c_post, target)
      seeds_txt.append(f"Pre-LN {fmt(s_pre)} / Post-LN {fmt(s_post)}")
      if s_pre is None and s_post is None:
        continue                               # both missed the target: this seed says nothing
      # Post-LN never reaching the target means its step is beyond the run: Pre-LN is faster for
      # sure only if it reached it by FASTER of the run.
      oks.append(s_pre is not None and s_pre <= FASTER * (steps if s_post is None else s_post))
    parts.append(f"{name}: " + ", ".join(seeds_txt))
  if not oks:
    return claims_lib.not_testable([f"no judged comparison where either layout reached the target {target:z.3f} "
                                    "and no compared run left late" + (": " + "; ".join(parts) if parts else "")])
  return claims_lib.verdict(oks), f"first evaluation at or below {target:z.3f}: " + "; ".join(parts)


def drop_run(grid: dict, lr: float, i: int) -> dict:
  """The grid with seed ``i`` left out of every point at rate ``lr`` (a paired run pair is left out)."""
  return {k: (subset(p, [j for j in range(len(p["values"])) if j != i]) if k[1] == lr else p)
          for k, p in grid.items()}


def robust(fn: Callable, grid: dict, lrs: list[float], n_seeds: int, *args, leave_one_out: bool = True) -> dict:
  """Runs the rule ``fn(grid, lrs, *args) -> (holds, text)`` pooled, per seed and leave-one-out.

  ``yes`` stays ``yes`` only if every seed alone and every grid with one (rate, seed) left out
  (:func:`drop_run`) also say ``yes``; otherwise it becomes ``partly`` and the text says which
  seed or which left-out run changed it. Where the seeds disagree the text says so whatever the
  verdict.

  Returns:
    ``{"holds", "ours", "per_seed", "leave_one_out"}``; ``leave_one_out`` lists the ``(lr, seed
    index, verdict)`` that were not ``yes`` (checked only for a pooled ``yes``).
  """
  holds, ours = fn(grid, lrs, *args)
  per = [fn(seed_points(grid, i), lrs, *args)[0] for i in range(n_seeds)]
  flips = []
  if holds == "yes" and n_seeds > 1 and leave_one_out:
    for lr in lrs:
      for i in range(n_seeds):
        v = fn(drop_run(grid, lr, i), lrs, *args)[0]
        if v != "yes":
          flips.append((lr, i, v))
  notes = [f"each seed alone: {', '.join(per)}" + (" (the seeds disagree)" if len(set(per)) > 1 else "")]
  final = holds
  if holds == "yes" and any(v != "yes" for v in per):
    final = "partly"
  if flips:
    final = "partly"
    notes.append("not robust: leaving out " + "; ".join(f"seed #{i} at lr {lr:g} gives {v}" for lr, i, v in flips))
  elif holds == "yes" and n_seeds > 1 and leave_one_out:
    notes.append("yes with any one (rate, seed) left out")
  return {"holds": final, "ours": ours + "; " + "; ".join(notes), "per_seed": per, "leave_one_out": flips}


def _criteria(cfg: Design, eval_every: int, target: float) -> dict[str, str]:
  """The criterion text of each claim of :func:`verdicts` (``{claim id: text}``), stated with the
  design's longest warm-up, the evaluation interval and the speed ``target``."""
  long_ = max(cfg.warmups)
  late = (f"; a run that diverged, or was still within {STALL_NATS} nats of the unigram plateau at "
          f"{LATE_FRACTION:z.0%} of the run (left late or never), or ends there, fails (stalled); late exits are "
          "listed")
  return {
      "xiong_postln_needs_warmup": f"per seed, the highest judged rate at which Post-LN trains, without and with "
      f"warm-up {long_} (judged rates: Pre-LN without warm-up left the plateau within the first third in every "
      "seed): yes if warm-up raises it by at least one grid step in every seed; partly if in some seeds, or if "
      f"warm-up improves the paired final loss by more than {MARGIN} nats at some (rate, seed); no otherwise; "
      "the paired loss gain per rate is shown beside it" + late,
      "xiong_postln_lr_sensitive": "per Post-LN warm-up, against Pre-LN without warm-up: rate-sensitive if above a "
      "rate where Post-LN trains in every seed there is one where it fails in every seed while Pre-LN trains in "
      "every seed; a warm-up where Post-LN trains at no rate fails outright and is not judged; yes/partly/no = "
      "all/some/none of the judged warm-ups" + late,
      "xiong_preln_no_warmup": f"at each judged rate where Post-LN with warm-up {long_} trains in every seed, Pre-LN "
      f"without warm-up is worse by more than {MARGIN} nats in no seed (paired); yes/partly/no = all/some/none of "
      "these rates" + late,
      "xiong_preln_faster": f"Pre-LN without warm-up vs Post-LN with warm-up {long_}, at each judged rate where "
      "Post-LN trains and each at its best rate: per seed, the first evaluation (every "
      f"{eval_every} steps) at or below a target {TARGET_BELOW} nats under the unigram plateau ({target:z.3f}), "
      f"which either can miss; faster = <= {FASTER:z.0%} of Post-LN's steps (of the run where Post-LN never gets "
      "there); a seed where "
      "neither reaches it is not judged; yes/partly/no = all/some/none of the (comparison, seed) cases" + late,
  }


def verdicts(grid: dict, lrs: list[float], cfg: Design, unigram: float, eval_every: int) -> tuple[list[dict], dict]:
  """The claims of the grid (LayerNorm, Xavier).

  ``grid[(pos, lr, warmup)]`` is a :func:`~experiments.studies.seeds.point` with ``curves``; the
  grid holds Post-LN at every warm-up and Pre-LN without warm-up at every rate. ``unigram`` is
  the plateau of the runs' validation batches.

  * ``xiong_postln_needs_warmup`` (long warm-up vs none, issue 44): per seed, the highest judged
    rate at which Post-LN trains without and with the long warm-up (:func:`highest_trained`). yes
    if warm-up raises it by at least one grid step in every seed; partly if in some seeds, or if
    the paired final loss gains more than :data:`MARGIN` at some (rate, seed); no otherwise. Where
    warm-up lowers it, it says so.
  * ``xiong_postln_lr_sensitive``, per Post-LN warm-up against Pre-LN without warm-up: among the
    usable judged rates, Post-LN *survives* a rate if it trains in every seed and *breaks* at a
    larger one if it fails in every seed while Pre-LN trains in every seed (both read with the
    same late filter). Sensitive at that warm-up if it breaks somewhere above a rate it
    survives; a warm-up where it survives nothing fails outright (not judged). yes/partly/no =
    all/some/none of the judged warm-ups.
  * ``xiong_preln_no_warmup``: at each judged rate where Post-LN with the long warm-up trains in
    every seed, Pre-LN without warm-up is no worse than it beyond the margin in any seed;
    yes/partly/no = all/some/none of these rates.
  * ``xiong_preln_faster``: the target is :data:`TARGET_BELOW` nats below the plateau, one loss
    that either layout can miss (the paper's "reaches the validation loss in fewer updates" with
    a target fixed in advance, not Post-LN's own final loss, which it reaches by construction).
    At each judged rate where Post-LN with warm-up trains, and each at its best rate: per seed,
    the first evaluation at or below the target; a seed where neither reaches it says nothing;
    Pre-LN is faster in a seed if it reaches it at ``<= FASTER`` of Post-LN's step (where Post-LN
    never does, at ``<= FASTER`` of the run). yes/partly/no = all/some/none of the (comparison,
    seed) cases.

  Every claim is then made robust (:func:`robust`): per seed and with each (rate, seed) left out.

  Returns:
    ``(claims, extra)``: claim dicts (``id``, ``criterion``, ``ours``, ``holds``, ``per_seed``)
    and ``extra`` with ``max_surviving`` ``{pos: {warmup: lr or None}}`` (Post-LN at each warm-up,
    Pre-LN without), ``judged_lrs`` and ``target``.
  """
  long_, n = max(cfg.warmups), len(cfg.seeds)
  judged = judged_rates(grid, lrs, cfg.steps)
  third = cfg.steps // 3
  target = unigram - TARGET_BELOW
  crits = _criteria(cfg, eval_every, target)
  rules = {"xiong_postln_needs_warmup": (needs_warmup, (long_, cfg.steps), True),
           "xiong_postln_lr_sensitive": (lr_sensitive, (cfg.warmups, cfg.steps), False),
           "xiong_preln_no_warmup": (preln_no_warmup, (long_, cfg.steps), False),
           "xiong_preln_faster": (faster, (long_, cfg.steps, target), False)}
  unjudged = [lr for lr in lrs if lr not in judged]
  short_text = (f"Pre-LN without warm-up did not leave the plateau by step {third} at "
                + ", ".join(f"{lr:g}" for lr in unjudged) + " (those rates not judged)") if unjudged else ""
  claims = []
  for cid, (fn, args, frac) in rules.items():
    crit = crits[cid] + f"; judged only at rates where Pre-LN without warm-up left the plateau by step {third}"
    design = design_reasons(cfg, n, frac)
    if cid == "xiong_preln_faster" and cfg.steps // eval_every < MIN_EVALS:
      design.append(f"{cfg.steps // eval_every} evaluations per run, a speed needs >= {MIN_EVALS}")
    if not judged:
      design.append("too short: " + short_text)
      holds, ours = claims_lib.not_testable(design)
      claims.append({"id": cid, "criterion": crit, "ours": ours, "holds": holds})
      continue
    # A per-seed statistic across rates (needs_warmup) has no (rate, seed) to leave out: its robustness
    # is every seed alone.
    c = robust(fn, grid, judged, n, *args, leave_one_out=cid != "xiong_postln_needs_warmup")
    if short_text:
      c["ours"] += f" ({short_text})"
    if design:
      c["holds"], reason = claims_lib.not_testable(design)
      c["ours"] = reason + ". Measured: " + c["ours"]
    claims.append({"id": cid, "criterion": crit, **c})
  surv = {"post": {w: max([lr for lr in lrs if grid[("post", lr, w)]["trains"]], default=None) for w in cfg.warmups},
          "pre": {0: max([lr for lr in lrs if grid[("pre", lr, 0)]["trains"]], default=None)}}
  per_seed = {f"post|{w}": highest_trained(grid, judged or lrs, "post", w) for w in cfg.warmups}
  per_seed["pre|0"] = highest_trained(grid, lrs, "pre", 0)
  return claims, {"max_surviving": {p: {str(w): v for w, v in d.items()} for p, d in surv.items()},
                  "highest_trained_per_seed": per_seed,
                  "judged_lrs": judged, "target": target}
