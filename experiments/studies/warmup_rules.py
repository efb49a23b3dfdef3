"""The verdict rules of the warm-up grid (:mod:`experiments.studies.warmup`): plain numbers in, claims out.

Every rule takes grid points (:func:`experiments.studies.seeds.point`, keyed ``(position, lr,
warmup)``) or the runs' curves and returns a claim dict (``id``, ``criterion``, ``ours``, ``holds``,
``per_seed``); none trains or imports JAX, so ``tests/test_verdicts.py`` feeds each one synthetic
results for yes, partly, no and "not testable".

**Testability first (issue 24).** Before any verdict each rule checks the conditions of its
claim's ``testable_when`` (:mod:`experiments.suite.claims`): the design's (the longest warm-up is
at most :data:`MAX_WARMUP_FRACTION` of the run; at least two seeds) and the data's (a judged rate:
Pre-LN left the plateau within the first third; no compared Post-LN run left it in the last third,
:data:`LATE_FRACTION`). Where one does not hold the verdict is "not testable" with the reason.
Comparisons are paired per seed: the same seed with and without warm-up (same data order and
init), a difference holds in a seed where it exceeds :data:`MARGIN`. History of these rules: the
report's "Rule changes" section (:mod:`experiments.suite.rule_changes`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from experiments.studies.seeds import STALL_NATS, format_finals, left_plateau_by, seed_points
from experiments.suite import claims as claims_lib


class Design(Protocol):
  """The sizes of the warm-up grid that the rules read: :class:`experiments.studies.warmup.Config` is one
  (the rules do not import the study, which imports them)."""

  steps: int
  warmups: tuple
  seeds: tuple


MARGIN = 0.05              # nats: a paired (same-seed) difference beyond this holds (eval noise ~0.03 nat)
FASTER = 0.9               # Pre-LN is "faster" if it needs <= this fraction of Post-LN's steps
MAX_WARMUP_FRACTION = 0.2  # the longest warm-up must be at most this fraction of the run
LATE_FRACTION = 2 / 3      # a run that leaves the plateau after this fraction of the run started late
MIN_SEEDS = 2              # a paired comparison needs at least this many seeds
MIN_EVALS = 4              # the speed claim needs at least this many evaluations per run


def plateau_ok(grid: dict, lr: float, first_third: int) -> bool:
  """Whether Pre-LN without warm-up at rate ``lr`` left the plateau within ``first_third`` steps in every seed."""
  p = grid.get(("pre", lr, 0))
  return p is not None and left_plateau_by(p, first_third)


def late(p: dict, steps: int) -> list[int]:
  r"""The plateau-leaving steps of the seeds of ``p`` that came after :data:`LATE_FRACTION` of the run.

  .. math:: \text{late} = \{ s_i : s_i > \tfrac{2}{3} T \}
  """
  return [s for s in p.get("left_plateau", []) if s is not None and s > LATE_FRACTION * steps]


def describe(p: dict) -> str:
  """Seed mean ± half-range where every seed trained; else each seed's own result."""
  if not any(p["failures"]):
    return f"{p['mean']:.3f} ± {p['spread'] / 2:.3f}"
  return format_finals(p)


def paired(a: dict, b: dict) -> list[float]:
  r"""Per-seed differences ``a - b`` of two points trained with the same seeds (the paired comparison).

  .. math:: \Delta_i = L_a^{(i)} - L_b^{(i)}
  """
  return [x - y for x, y in zip(a["values"], b["values"])]


def _fmt_diffs(d: list[float]) -> str:
  return "(" + ", ".join(f"{x:+.3f}" for x in d) + ")"


def design_reasons(cfg: Design, n_seeds: int, warmup_fraction: bool) -> list[str]:
  """The design conditions of the grid's claims that the preset does not meet (empty: all met)."""
  reasons = []
  if n_seeds < MIN_SEEDS:
    reasons.append(f"{n_seeds} seed(s), a paired comparison needs >= {MIN_SEEDS}")
  long_ = max(cfg.warmups)
  if warmup_fraction and long_ > MAX_WARMUP_FRACTION * cfg.steps:
    reasons.append(f"the longest warm-up ({long_} of {cfg.steps} steps, {long_ / cfg.steps:.0%}) is more than "
                   f"{MAX_WARMUP_FRACTION:.0%} of the run, not a small fraction of training; needs longer runs "
                   "(`--preset gpu`)")
  return reasons


def needs_warmup(grid: dict, lrs: list[float], long_: int, steps: int) -> tuple[str, str]:
  """``xiong_postln_needs_warmup`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  parts, helped, strict = [], [], []
  for lr in lrs:
    p0, pw, pre0 = grid[("post", lr, 0)], grid[("post", lr, long_)], grid[("pre", lr, 0)]
    if not pre0["trains"]:
      parts.append(f"lr {lr:g}: Pre-LN without warm-up fails too ({describe(pre0)}; not judged)")
      continue
    lt = late(p0, steps) + late(pw, steps)
    gain = paired(p0, pw)
    helps = [g > MARGIN for g in gain]
    hurts = sum(g < -MARGIN for g in gain)
    text = (f"lr {lr:g}: Post-LN {describe(p0)} without vs {describe(pw)} with warm-up {long_}; paired gain "
            f"{_fmt_diffs(gain)}: helps beyond {MARGIN} in {sum(helps)}/{len(helps)} seeds"
            + (f", hurts in {hurts}" if hurts else "") + f"; Pre-LN without {describe(pre0)}")
    if lt:
      parts.append(text + f" (a Post-LN run left the plateau late, at step {max(lt)} of {steps}: not judged)")
      continue
    helped += helps
    strict.append(p0["fails"] and pw["trains"] and all(helps))
    parts.append(text)
  if not strict:
    return claims_lib.not_testable(["no rate where Pre-LN trains and the Post-LN runs left the plateau in time: "
                                    + ("; ".join(parts) or "no judged rate")])
  return ("yes" if any(strict) else ("partly" if any(helped) else "no")), "; ".join(parts)


def lr_sensitive(grid: dict, lrs: list[float], warmups, steps: int) -> tuple[str, str]:
  """``xiong_postln_lr_sensitive`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  if len(lrs) < 2:
    return claims_lib.not_testable([f"{len(lrs)} judged rate(s), a rate sensitivity needs >= 2"])
  parts, oks = [], []
  for w in warmups:
    post_ok = [lr for lr in lrs if grid[("post", lr, w)]["trains"]]
    pre_ok = [lr for lr in lrs if grid[("pre", lr, w)]["trains"]]
    if not post_ok:
      parts.append(f"warm-up {w}: Post-LN fails outright (survives no rate; not evidence either way)")
      continue
    breaks = [lr for lr in pre_ok if lr > min(post_ok) and not grid[("post", lr, w)]["trains"]]
    fragile = [lr for lr in breaks if late(grid[("post", lr, w)], steps)]
    breaks = [lr for lr in breaks if lr not in fragile]
    oks.append(bool(breaks))
    parts.append(f"warm-up {w}: Post-LN survives {', '.join(f'{x:g}' for x in post_ok)}, Pre-LN "
                 f"{', '.join(f'{x:g}' for x in pre_ok) or 'none'}: "
                 + (f"Post-LN breaks at {', '.join(f'{x:g}' for x in breaks)} where Pre-LN trains" if breaks
                    else "no larger rate breaks Post-LN alone")
                 + (f" (not counted, left the plateau late: {', '.join(f'{x:g}' for x in fragile)})"
                    if fragile else ""))
  if not oks:
    return "n/a", "; ".join(parts) + " (Post-LN fails outright at every warm-up)"
  return claims_lib.verdict(oks), "; ".join(parts)


def preln_no_warmup(grid: dict, lrs: list[float], long_: int) -> tuple[str, str]:
  """``xiong_preln_no_warmup`` on the judged rates ``lrs`` (see :func:`verdicts`)."""
  parts, oks = [], []
  for lr in lrs:
    post_w, pre0 = grid[("post", lr, long_)], grid[("pre", lr, 0)]
    if not post_w["trains"]:
      continue
    diff = paired(pre0, post_w)
    oks.append(not all(x > MARGIN for x in diff))
    parts.append(f"lr {lr:g}: {describe(pre0)} vs {describe(post_w)}, paired Pre - Post {_fmt_diffs(diff)}")
  if not oks:
    return claims_lib.not_testable([f"Post-LN with warm-up {long_} trained in every seed at no judged rate"])
  return claims_lib.verdict(oks), "Pre-LN without vs Post-LN with warm-up: " + "; ".join(parts)


def _with_seeds(fn, grid: dict, n_seeds: int, *args) -> dict:
  """Runs a rule on the grid and on every seed alone; ``yes`` only if the seeds agree."""
  holds, ours = fn(grid, *args)
  per = [fn(seed_points(grid, i), *args)[0] for i in range(n_seeds)]
  return {"ours": ours + f"; each seed alone: {', '.join(per)}", "per_seed": per,
          "holds": claims_lib.seeds_agree(holds, per)}


def judged_rates(grid: dict, lrs: list[float], steps: int) -> list[float]:
  """The rates at which Pre-LN without warm-up left the plateau within the first third of the run in every seed."""
  return [lr for lr in lrs if plateau_ok(grid, lr, steps // 3)]


def verdicts(grid: dict, lrs: list[float], cfg: Design, unigram: float) -> tuple[list[dict], dict]:
  """The claims of the grid (LayerNorm, Xavier).

  ``grid[(pos, lr, warmup)]`` is a :func:`~experiments.studies.seeds.point`.

  **Testability.** The design must pair at least :data:`MIN_SEEDS` seeds, and for the warm-up
  claim the longest warm-up must be at most :data:`MAX_WARMUP_FRACTION` of the run. A rate is
  judged only if Pre-LN without warm-up left the plateau (val loss below ``unigram -
  STALL_NATS``) within the first third of the run in every seed; otherwise "fails" could just
  mean "not yet off the plateau". A Post-LN run that left the plateau only in the last third
  (:data:`LATE_FRACTION`) makes "stalled at the end" fragile: its comparison is not judged.
  Unmet conditions give "not testable" with the reason.

  **Paired comparisons.** Runs with the same seed share the data order and the init, so each
  difference is taken per seed; it holds in a seed beyond :data:`MARGIN`. Every rule is also
  run on each seed alone; ``yes`` needs every seed's ``yes``.

  * ``xiong_postln_needs_warmup`` (long warm-up vs none, per judged rate where Pre-LN without
    warm-up trains): yes if at some rate Post-LN without warm-up fails in every seed, with the
    long warm-up trains in every seed and is better beyond the margin in every seed; partly if
    warm-up helps in some (rate, seed); no if in none. Where warm-up hurts it says so.
  * ``xiong_postln_lr_sensitive``, per warm-up: a Post-LN that survives no rate *fails
    outright* (not judged); otherwise it is rate-sensitive there if at a rate above one it
    survives Pre-LN trains and Post-LN does not (a late-leaving Post-LN run not counted).
    yes/partly/no = all/some/none of the judged warm-ups; n/a if Post-LN fails outright at every
    warm-up.
  * ``xiong_preln_no_warmup``: at each judged rate where Post-LN with the long warm-up trains,
    Pre-LN without warm-up is not worse beyond the margin in every seed; yes/partly/no =
    all/some/none; not testable if there is no such rate.

  Returns:
    ``(claims, extra)``: claim dicts (``id``, ``criterion``, ``ours``, ``holds``, ``per_seed``)
    and ``extra`` with ``max_surviving`` ``{pos: {warmup: lr or None}}`` and ``judged_lrs``.
  """
  long_, n = max(cfg.warmups), len(cfg.seeds)
  judged = judged_rates(grid, lrs, cfg.steps)
  third = cfg.steps // 3
  short_text = (f"too short: Pre-LN without warm-up did not leave the plateau within the first third ({third} "
                "steps) at " + ", ".join(f"{lr:g}" for lr in lrs if lr not in judged)) if len(judged) < len(lrs) else ""
  crits = {
      "xiong_postln_needs_warmup": f"per judged rate where Pre-LN without warm-up trains: yes if Post-LN without "
      f"warm-up fails (diverges or ends within {STALL_NATS} nats of unigram) in every seed while with warm-up "
      f"{long_} it trains and is better by more than {MARGIN} nats in every seed (paired per seed); partly if "
      "warm-up helps beyond that in some seeds/rates only; no if nowhere",
      "xiong_postln_lr_sensitive": "per warm-up: Post-LN is rate-sensitive if above a rate it survives there is one "
      "where Pre-LN trains and Post-LN does not; a Post-LN that survives no rate fails outright and is not "
      "judged; yes/partly/no = all/some/none of the judged warm-ups",
      "xiong_preln_no_warmup": f"at each judged rate where Post-LN with warm-up {long_} trains, Pre-LN without "
      f"warm-up is not worse by more than {MARGIN} nats in every seed (paired); yes/partly/no = all/some/none",
  }
  rules = {"xiong_postln_needs_warmup": (needs_warmup, (long_, cfg.steps), True),
           "xiong_postln_lr_sensitive": (lr_sensitive, (cfg.warmups, cfg.steps), False),
           "xiong_preln_no_warmup": (preln_no_warmup, (long_,), False)}
  claims = []
  for cid, (fn, args, frac) in rules.items():
    crit = crits[cid] + f"; judged only at rates where Pre-LN without warm-up left the plateau by step {third}"
    design = design_reasons(cfg, n, frac)
    if not judged:
      design.append(short_text)
    if not judged:
      holds, ours = claims_lib.not_testable(design)
      claims.append({"id": cid, "criterion": crit, "ours": ours, "holds": holds})
      continue
    c = _with_seeds(fn, grid, n, judged, *args)
    if short_text:
      c["ours"] += f" ({short_text})"
    if design:
      c["holds"], reason = claims_lib.not_testable(design)
      c["ours"] = reason + ". Measured: " + c["ours"]
    claims.append({"id": cid, "criterion": crit, **c})
  surv = {pos: {w: max([lr for lr in lrs if grid[(pos, lr, w)]["trains"]], default=None)
                for w in cfg.warmups} for pos in ("post", "pre")}
  return claims, {"max_surviving": {p: {str(w): v for w, v in d.items()} for p, d in surv.items()},
                  "judged_lrs": judged}


def steps_to_reach(val_steps, val, target):
  """First evaluation step at which ``val <= target`` (None if never)."""
  for s, v in zip(val_steps, val):
    if np.isfinite(v) and v <= target:
      return int(s)
  return None


def _curve(runs_by_seed, seed=None):
  """The seed-mean validation curve (``seed=None``; None if a seed diverged) or one seed's curve."""
  rs = runs_by_seed if seed is None else [runs_by_seed[seed]]
  curves = [r["val_curve"] for r in rs if r["val_curve"] and not r["diverged"]]
  if not curves or len(curves) < len(rs):
    return None
  n = min(len(c) for c in curves)
  steps = [s for s, _ in curves[0][:n]]
  vals = np.mean([[float(v) for _, v in c[:n]] for c in curves], axis=0)
  return steps, vals


def _compare(pre_runs, post_runs, seed=None):
  """Steps for Pre-LN to reach Post-LN's final val loss, and for Post-LN itself; None where undecided.

  The target is Post-LN's own final (seed-mean, or the seed's) val loss: the paper's "reaches
  Post-LN's validation loss in fewer updates". Post-LN's steps are the first evaluation at which
  its curve is at its final loss (usually the last).
  """
  pre, post = _curve(pre_runs, seed), _curve(post_runs, seed)
  if pre is None or post is None:
    return None
  target = float(post[1][-1])
  return steps_to_reach(pre[0], pre[1], target), steps_to_reach(post[0], post[1], target), target


def _faster_core(runs, grid, lrs, long_, seed=None):
  """The same-rate and best-rate comparisons of :func:`faster_claim` (one seed, or the seed means)."""
  def fmt(s):
    return "never" if s is None else f"step {s}"
  oks, parts = [], []
  trained = [lr for lr in lrs if grid[("post", lr, long_)]["trains"]]
  post_best = min(trained, key=lambda lr: grid[("post", lr, long_)]["mean"]) if trained else None
  pre_best = min(lrs, key=lambda lr: grid[("pre", lr, 0)]["mean"])
  pairs = [(f"lr {lr:g}", lr, lr) for lr in trained]
  if post_best is not None:
    pairs.append((f"each at its best rate (Pre-LN {pre_best:g}, Post-LN {post_best:g})", pre_best, post_best))
  for name, lr_pre, lr_post in pairs:
    c = _compare(runs[("pre", lr_pre, 0)], runs[("post", lr_post, long_)], seed)
    if c is None:
      parts.append(f"{name}: a run diverged (not judged)")
      continue
    s_pre, s_post, target = c
    ok = s_pre is not None and s_post is not None and s_pre <= FASTER * s_post
    oks.append(ok)
    parts.append(f"{name}: Post-LN's final {target:.3f} reached by Pre-LN at {fmt(s_pre)}, by Post-LN at {fmt(s_post)}")
  if not oks:
    return claims_lib.not_testable([f"Post-LN with warm-up {long_} trained in every seed at no judged rate (no "
                                    "target)"])
  return claims_lib.verdict(oks), "; ".join(parts)


def faster_claim(runs: dict, grid: dict, lrs: list[float], cfg: Design, eval_every: int, unigram: float) -> dict:
  """``xiong_preln_faster``: Pre-LN without warm-up vs Post-LN with the long warm-up.

  The paper's definition: Pre-LN reaches Post-LN's validation loss in fewer updates. The target
  is Post-LN's own final val loss (seed mean; per seed, that seed's), so the claim measures speed,
  not final loss. Compared (a) at the same peak rate, at every judged rate (:func:`judged_rates`)
  where Post-LN with the long warm-up trains in every seed, and (b) each at its best rate (lowest
  seed-mean final loss; Post-LN's among the rates where it trains). Pre-LN is faster in a
  comparison if its first evaluation at or below the target comes at ``<= FASTER`` (0.9) of
  Post-LN's. yes/partly/no = all/some/none. **Not testable** with fewer than :data:`MIN_SEEDS`
  seeds, fewer than :data:`MIN_EVALS` evaluations per run, no judged rate, or no judged rate where
  Post-LN with warm-up trains. Each seed alone is judged on its own curves; ``yes`` needs every
  seed's ``yes``.
  """
  long_ = max(cfg.warmups)
  crit = (f"Pre-LN without warm-up vs Post-LN with warm-up {long_}: the evaluation (every {eval_every} steps) at "
          f"which each first reaches Post-LN's final val loss, at the same peak rate and each at its best rate; "
          f"faster = <= {FASTER:.0%} of Post-LN's steps; yes/partly/no = all/some/none of the comparisons")
  judged = judged_rates(grid, lrs, cfg.steps)
  reasons = design_reasons(cfg, len(cfg.seeds), False)
  if cfg.steps // eval_every < MIN_EVALS:
    reasons.append(f"{cfg.steps // eval_every} evaluations per run, a speed needs >= {MIN_EVALS}")
  if not judged:
    reasons.append(f"too short: Pre-LN did not leave the plateau by step {cfg.steps // 3} at any rate")
  if reasons and not judged:
    holds, ours = claims_lib.not_testable(reasons)
    return {"id": "xiong_preln_faster", "criterion": crit, "holds": holds, "ours": ours}
  holds, ours = _faster_core(runs, grid, judged, long_)
  per = [_faster_core(runs, seed_points(grid, i), judged, long_, seed=i)[0] for i in range(len(cfg.seeds))]
  out = {"id": "xiong_preln_faster", "criterion": crit, "per_seed": per,
         "ours": f"seed-mean curves, {ours}; each seed alone: {', '.join(per)}",
         "holds": claims_lib.seeds_agree(holds, per)}
  if reasons:
    out["holds"], reason = claims_lib.not_testable(reasons)
    out["ours"] = reason + ". Measured: " + out["ours"]
  return out
