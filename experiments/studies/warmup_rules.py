r"""The verdict rules of the warm-up grid (:mod:`experiments.studies.warmup`): plain numbers in, claims out.

Every rule takes grid points (:func:`experiments.studies.seeds.point`, keyed ``(position, lr,
warmup)``) and returns a claim dict (``id``, ``criterion``, ``ours``, ``holds``, ``per_seed``);
none trains or imports JAX, so ``tests/test_verdicts.py`` feeds each one synthetic results for
yes, partly, no and "not testable". The rules of issue 31 were frozen before the report's run
(the commit is named in the report); the pilots that chose the design (seeds >= 100) and the
report at 87da7be had been seen (the report's "Rule changes" section).

**Testability first.** Before any verdict each rule checks its claim's ``testable_when``
(:mod:`experiments.suite.claims`): the design's (the longest warm-up is at most
:data:`MAX_WARMUP_FRACTION` of the run; at least :data:`MIN_SEEDS` seeds) and the data's (a
*judged* rate: Pre-LN without warm-up left the plateau within the first third of the run in
every seed). Unmet conditions give "not testable" with the reason.

**Every run alike.** A run that left the plateau after :data:`LATE_FRACTION` of the run *left
late*: whether it ends stalled is fragile. The filter applies to every run a rule reads, on both
sides of a comparison: a comparison that reads a late run is not judged, whichever side it is
on. A diverged run and a stalled one both *fail*; a run *trains* otherwise.

**Paired, per seed, robust.** Runs with the same seed share data order and init, so every
difference is taken per seed and holds in a seed beyond :data:`MARGIN`. Every rule is run on the
pooled seeds, on each seed alone (:func:`robust`; where seeds disagree the verdict says so) and
with each single (rate, seed) left out: "yes" needs every seed alone and every leave-one-out to
say "yes", else it is at most "partly".
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from experiments.studies.seeds import STALL_NATS, format_finals, seed_points, subset
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
LATE_FRACTION = 2 / 3      # a run that leaves the plateau after this fraction of the run left late
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


def late_steps(p: dict, steps: int) -> list[int]:
  r"""The plateau-leaving steps of the seeds of ``p`` that came after :data:`LATE_FRACTION` of the run.

  .. math:: \text{late} = \{ s_i : s_i > \tfrac{2}{3} T \}
  """
  return [s for s in p.get("left_plateau", []) if s is not None and s > LATE_FRACTION * steps]


def late_note(points: list[dict], steps: int) -> str:
  """``""`` if no run of ``points`` left late, else the clause that says which steps (not judged)."""
  lt = [s for p in points for s in late_steps(p, steps)]
  return f"a compared run left the plateau late (step {max(lt)} of {steps}): not judged" if lt else ""


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


def needs_warmup(grid: dict, lrs: list[float], long_: int, steps: int) -> tuple[str, str]:
  """``xiong_postln_needs_warmup`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  parts, helped, strict = [], [], []
  for lr in lrs:
    p0, pw, pre0 = grid[("post", lr, 0)], grid[("post", lr, long_)], grid[("pre", lr, 0)]
    gain = paired(p0, pw)
    helps = [g > MARGIN for g in gain]
    hurts = sum(g < -MARGIN for g in gain)
    text = (f"lr {lr:g}: Post-LN {describe(p0)} without vs {describe(pw)} with warm-up {long_}; paired gain "
            f"{_fmt_diffs(gain)}: helps beyond {MARGIN} in {sum(helps)}/{len(helps)} seeds"
            + (f", hurts in {hurts}" if hurts else "") + f"; Pre-LN without {describe(pre0)}")
    if not pre0["trains"]:
      parts.append(text + " (Pre-LN without warm-up fails too: not judged)")
      continue
    note = late_note([p0, pw, pre0], steps)
    if note:
      parts.append(f"{text} ({note})")
      continue
    helped += helps
    strict.append(p0["fails"] and pw["trains"] and all(helps))
    parts.append(text)
  if not strict:
    return claims_lib.not_testable(["no judged rate where Pre-LN trains and no compared run left the plateau "
                                    "late: " + ("; ".join(parts) or "no judged rate")])
  return ("yes" if any(strict) else ("partly" if any(helped) else "no")), "; ".join(parts)


def lr_sensitive(grid: dict, lrs: list[float], warmups, steps: int) -> tuple[str, str]:
  """``xiong_postln_lr_sensitive`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  parts, oks = [], []
  for w in warmups:
    usable, late_lrs = [], []
    for lr in lrs:
      (late_lrs if late_note([grid[("post", lr, w)], grid[("pre", lr, 0)]], steps) else usable).append(lr)
    survives = [lr for lr in usable if grid[("post", lr, w)]["trains"]]
    breaks = [lr for lr in usable if survives and lr > min(survives) and grid[("pre", lr, 0)]["trains"]
              and grid[("post", lr, w)]["fails"]]
    skipped = f" (not read, a run left the plateau late: {', '.join(f'{x:g}' for x in late_lrs)})" if late_lrs else ""
    if len(usable) < 2:
      parts.append(f"warm-up {w}: {len(usable)} usable rate(s), a sensitivity needs >= 2{skipped}")
      continue
    if not survives:
      parts.append(f"warm-up {w}: Post-LN trains in every seed at no usable rate (fails outright: not "
                   f"judged){skipped}")
      continue
    oks.append(bool(breaks))
    parts.append(f"warm-up {w}: Post-LN trains in every seed at {', '.join(f'{x:g}' for x in survives)}; "
                 + (f"fails in every seed at {', '.join(f'{x:g}' for x in breaks)} where Pre-LN without warm-up "
                    "trains" if breaks else "no larger rate where it fails in every seed while Pre-LN trains")
                 + skipped)
  if not oks:
    return claims_lib.not_testable(["no warm-up with two usable rates at which Post-LN trains at one: "
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
    note = late_note([post_w, pre0], steps)
    if note:
      parts.append(f"{text} ({note})")
      continue
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
    note = late_note([pre, post], steps)
    if note:
      parts.append(f"{name}: {note}")
      continue
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


def robust(fn: Callable, grid: dict, lrs: list[float], n_seeds: int, *args) -> dict:
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
  if holds == "yes" and n_seeds > 1:
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
  elif holds == "yes" and n_seeds > 1:
    notes.append("yes with any one (rate, seed) left out")
  return {"holds": final, "ours": ours + "; " + "; ".join(notes), "per_seed": per, "leave_one_out": flips}


def _criteria(cfg: Design, eval_every: int, target: float) -> dict[str, str]:
  """The criterion text of each claim of :func:`verdicts` (``{claim id: text}``), stated with the
  design's longest warm-up, the evaluation interval and the speed ``target``."""
  long_ = max(cfg.warmups)
  late = f"; a comparison that reads a run that left the plateau after {LATE_FRACTION:z.0%} of the run is not judged"
  return {
      "xiong_postln_needs_warmup": f"per judged rate where Pre-LN without warm-up trains: yes if Post-LN without "
      f"warm-up fails (diverges or ends within {STALL_NATS} nats of the unigram plateau) in every seed while with "
      f"warm-up {long_} it trains and is better by more than {MARGIN} nats in every seed (paired per seed); partly "
      "if warm-up helps beyond that in some seeds/rates only; no if nowhere" + late,
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

  * ``xiong_postln_needs_warmup`` (long warm-up vs none): at a judged rate where Pre-LN without
    warm-up trains, *strict* if Post-LN without warm-up fails in every seed while with the long
    warm-up it trains and is better beyond :data:`MARGIN` in every seed (paired). yes if strict at
    some rate; partly if warm-up helps beyond the margin in some (rate, seed); no if in none.
    Where warm-up hurts it says so.
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
    c = robust(fn, grid, judged, n, *args)
    if short_text:
      c["ours"] += f" ({short_text})"
    if design:
      c["holds"], reason = claims_lib.not_testable(design)
      c["ours"] = reason + ". Measured: " + c["ours"]
    claims.append({"id": cid, "criterion": crit, **c})
  surv = {"post": {w: max([lr for lr in lrs if grid[("post", lr, w)]["trains"]], default=None) for w in cfg.warmups},
          "pre": {0: max([lr for lr in lrs if grid[("pre", lr, 0)]["trains"]], default=None)}}
  return claims, {"max_surviving": {p: {str(w): v for w, v in d.items()} for p, d in surv.items()},
                  "judged_lrs": judged, "target": target}
