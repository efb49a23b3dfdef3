"""The verdict rules of the depth study (:mod:`experiments.studies.depth`): plain numbers in, claims out.

The rules take the study's seed statistics (:func:`experiments.studies.seeds.point` per
``"<position>/L<depth>"``), its model-update curves and DeepNorm's constants, and return claim
dicts (``id``, ``criterion``, ``ours``, ``holds``, ``per_seed``); none trains, so
``tests/experiments/test_verdicts.py`` feeds each one synthetic results for yes, partly and no.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from experiments.studies.seeds import LATE_FRACTION, STALL_NATS, format_finals, left_plateau_by, seed_points, subset
from experiments.suite import claims as claims_lib


class Design(Protocol):
  """The sizes of the depth study that the rules read: :class:`experiments.studies.depth.Config` is one
  (the rules do not import the study, which imports them)."""

  depths: tuple
  positions: tuple
  steps: int
  seeds: tuple
  update_depths: tuple | None


DEEP = 12                # Admin's failing depth
MIN_SEEDS = 3            # issue 31: at least three seeds, compared per seed
MIN_SPAN = 4             # the update probe's depths must span at least this factor
PAST_PLATEAU = 0.5       # nats below unigram Pre-LN must reach for a depth to be judged
SATURATED = 1.0          # a relative model update this large: the output moved by its own size
FLAT_EXPONENT = 0.25     # |log-log slope| of the update vs N within this counts as "about constant"
NAMES = {"pre": "Pre-LN", "sandwich": "Sandwich"}


def _admin_core(points: dict, cfg: Design, unigram: float) -> tuple[str, str]:
  """``admin_deep_postln_fails`` on one seed's, some seeds' or all seeds' points (see :func:`verdicts`)."""
  first_third = cfg.steps // 3
  parts, oks, some = [], [], []
  L0 = min(cfg.depths)
  shallow = points[f"post/L{L0}"]
  n_shallow = sum(1 for f in shallow["failures"] if f)
  if n_shallow:
    return claims_lib.not_testable([
        f"at this rate Post-LN fails at L={L0} too in {n_shallow}/{len(shallow['failures'])} seeds "
        f"({format_finals(shallow)}): the rate, not the depth, breaks it (depth confounded with the rate)"])
  for L in [L for L in cfg.depths if L >= DEEP]:
    post, pre = points[f"post/L{L}"], points[f"pre/L{L}"]
    desc = f"L={L}: Post-LN {format_finals(post)} vs Pre-LN {format_finals(pre)}"
    if not left_plateau_by(pre, first_third):
      parts.append(desc + f" (too short: Pre-LN did not leave the plateau by step {first_third}; not judged)")
    elif not (pre["trains"] and max(pre["values"]) <= unigram - PAST_PLATEAU):
      parts.append(desc + " (Pre-LN not past the plateau: not judged)")
    else:
      parts.append(desc)
      oks.append(post["fails"])
      some.append(any(post["failures"]))
  if not oks:
    return claims_lib.not_testable(["no depth >= 12 could be judged: " + "; ".join(parts)])
  holds = "yes" if all(oks) else ("partly" if any(oks) or any(some) else "no")
  return holds, "; ".join(parts)


def admin_claim(points: dict, cfg: Design, unigram: float) -> dict:
  """``admin_deep_postln_fails`` with each seed alone and each seed left out beside it (see :func:`verdicts`)."""
  crit = (f"at a rate fixed by the pilots where Post-LN trains at the shallowest depth: judged at depths >= {DEEP} "
          f"where Pre-LN left the plateau by step {cfg.steps // 3} and ends >= {PAST_PLATEAU} nats below the unigram "
          f"plateau in every seed; Post-LN fails = diverged, or within {STALL_NATS} nats of the plateau at the end or "
          f"still there at {LATE_FRACTION:z.0%} of the run (late exits are listed); yes if it fails "
          "in every seed at every judged depth, partly at some or in some seeds, no at none; yes also needs every "
          "seed alone and every one seed left out to say yes; not testable if shallow Post-LN fails in any seed")
  reasons = []
  if len(cfg.seeds) < MIN_SEEDS:
    reasons.append(f"{len(cfg.seeds)} seed(s), needs >= {MIN_SEEDS}")
  if not ("post" in cfg.positions and "pre" in cfg.positions and any(L >= DEEP for L in cfg.depths)
          and min(cfg.depths) <= 6):
    reasons.append(f"needs Post-LN and Pre-LN at a depth >= {DEEP} and at a shallowest depth <= 6; the preset has "
                   f"depths {list(cfg.depths)}, layouts {list(cfg.positions)}")
  if reasons:
    holds, ours = claims_lib.not_testable(reasons)
    return {"id": "admin_deep_postln_fails", "criterion": crit, "holds": holds, "ours": ours}
  holds, ours = _admin_core(points, cfg, unigram)
  n = len(cfg.seeds)
  per = [_admin_core(seed_points(points, i), cfg, unigram)[0] for i in range(n)]
  loo = [_admin_core({k: subset(p, [j for j in range(n) if j != i]) for k, p in points.items()}, cfg, unigram)[0]
         for i in range(n)]
  final = claims_lib.seeds_agree(holds, per)
  notes = f"each seed alone: {', '.join(per)}" + (" (the seeds disagree)" if len(set(per)) > 1 else "")
  if holds == "yes":
    flips = [f"seed #{i} left out gives {v}" for i, v in enumerate(loo) if v != "yes"]
    if flips:
      final = "partly"
      notes += "; not robust: " + "; ".join(flips)
  dn = [f"DeepNorm fails at L={L} in {sum(1 for f in points[f'deepnorm/L{L}']['failures'] if f)}/"
        f"{n} seeds ({format_finals(points[f'deepnorm/L{L}'])})"
        for L in cfg.depths if f"deepnorm/L{L}" in points and any(points[f"deepnorm/L{L}"]["failures"])]
  measured = (f"final val loss per seed; {ours.replace('not testable at this scale: ', '')}; {notes}"
              + ("; not part of the claim: " + "; ".join(dn) if dn else ""))
  if holds == claims_lib.NOT_TESTABLE:   # the reason first, then what was measured
    measured = ours + ". Measured: " + measured
  return {"id": "admin_deep_postln_fails", "criterion": crit, "per_seed": per, "ours": measured, "holds": final}


def _exponent(depths, values) -> float:
  """Slope of log(value) against log(depth)."""
  return float(np.polyfit(np.log(np.asarray(depths, np.float64)), np.log(np.asarray(values, np.float64)), 1)[0])


def update_claim(update: dict, cfg: Design) -> dict:
  """``deepnet_update_constant`` from the growth exponents (see :func:`verdicts`)."""
  udepths = sorted(cfg.update_depths or cfg.depths)
  crit = (f"growth exponent e = slope of log(update) vs log(N) over N = {udepths}, at each early step before "
          f"Post-LN saturates (its relative update < {SATURATED} at every depth): a step holds if Post-LN grows (e > "
          f"{FLAT_EXPONENT}) and DeepNorm is about constant (|e| <= {FLAT_EXPONENT}), the claim's contrast; "
          "yes/partly/no = every/some/no judged step; exponents of the seed mean, each seed's beside")
  if len(udepths) < 3 or udepths[-1] < MIN_SPAN * udepths[0] or "post" not in cfg.positions \
      or "deepnorm" not in cfg.positions:
    holds, ours = claims_lib.not_testable([
        f"needs >= 3 probe depths spanning a factor >= {MIN_SPAN} with Post-LN and DeepNorm; the preset has "
        f"depths {udepths}, layouts {list(cfg.positions)}"])
    return {"id": "deepnet_update_constant", "criterion": crit, "holds": holds, "ours": ours}
  n_steps = len(update[f"post/L{udepths[0]}"]["mean"])
  judged = [s for s in range(n_steps) if all(update[f"post/L{L}"]["mean"][s] < SATURATED for L in udepths)]
  parts, oks = [], []
  for s in range(n_steps):
    ep = _exponent(udepths, [update[f"post/L{L}"]["mean"][s] for L in udepths])
    ed = _exponent(udepths, [update[f"deepnorm/L{L}"]["mean"][s] for L in udepths])
    if s in judged:
      oks.append(ep > FLAT_EXPONENT and abs(ed) <= FLAT_EXPONENT)
    others = "".join(f", {NAMES.get(pos, pos)} e = "
                     f"{_exponent(udepths, [update[f'{pos}/L{L}']['mean'][s] for L in udepths]):+z.2f}"
                     for pos in cfg.positions if pos not in ("post", "deepnorm"))
    def per_seed(pos, s=s):
      runs = [update[f"{pos}/L{L}"].get("per_seed") or [] for L in udepths]
      n = min(len(r) for r in runs)
      if n < 2:
        return ""
      return " (per seed " + ", ".join(f"{_exponent(udepths, [runs[j][i][s] for j in range(len(udepths))]):+z.2f}"
                                       for i in range(n)) + ")"
    parts.append(f"step {s + 1}: Post-LN e = {ep:+z.2f}{per_seed('post')}, DeepNorm e = {ed:+z.2f}"
                 f"{per_seed('deepnorm')}{others}"
                 + ("" if s in judged else " (Post-LN saturated: not judged)"))
  hi = udepths[-1]
  tail = (f"; update at N={hi}, step 1: DeepNorm {update[f'deepnorm/L{hi}']['mean'][0]:z.3g} vs Post-LN "
          f"{update[f'post/L{hi}']['mean'][0]:z.3g}")
  return {"id": "deepnet_update_constant", "criterion": crit, "ours": "; ".join(parts) + tail,
          "short": ("; ".join(p for i, p in enumerate(parts) if i in judged)
                    or "Post-LN saturated at every early step: not judged") + tail,
          "holds": claims_lib.verdict(oks) if oks else claims_lib.NOT_TESTABLE,
          **({} if oks else {"ours": "not testable at this scale: Post-LN's update saturated (>= "
                             f"{SATURATED}) at every early step; measured: " + "; ".join(parts) + tail})}


def verdicts(points: dict, update: dict, consts: dict, cfg: Design, unigram: float) -> list[dict]:
  """The claims of the depth experiment.

  * ``admin_deep_postln_fails`` (:func:`admin_claim`): judged at each depth ``>= DEEP`` (12) at
    which Pre-LN ended at least :data:`PAST_PLATEAU` below unigram in every seed and some layout
    left the plateau within the first third of the run (else *too short*); Post-LN *fails*
    there if it diverged or stalled in every seed. yes at every judged depth, partly at some (or
    in only some seeds), no at none. Depth is confounded with the rate if Post-LN fails at the
    shallowest depth too (in any seed): then
    not testable (issue 24: a failure at the shallowest depth means the rate, not the depth,
    breaks Post-LN). Not testable too with fewer than 2 seeds, without a depth >= 12 and one <= 6,
    or where no depth could be judged. Each seed alone is judged too; ``yes`` needs every seed's
    ``yes``. DeepNorm's failures are listed beside it.
  * ``deepnet_update_constant`` (:func:`update_claim`): the growth exponent (log-log slope of
    the model update against N) of Post-LN and DeepNorm at each early step before Post-LN's
    relative update reaches :data:`SATURATED` (1: the output moved by its own size) at some
    depth. Post-LN "grows" if its exponent exceeds :data:`FLAT_EXPONENT` (0.25, the flat band of
    the gradient-depth claim); DeepNorm is "about constant" if its exponent is within +-0.25.
    Not testable with fewer than 3 probe depths spanning a factor :data:`MIN_SPAN`, or where
    Post-LN saturated at every early step. Pre-LN's and Sandwich's exponents are shown beside.
  * ``deepnet_constants``: yes if every ``(alpha, beta)`` is ``((2N)^(1/4), (8N)^(-1/4))`` to 1e-12
    (no partly: one formula, checked exactly).

  Returns:
    Claim dicts with ``id``, ``criterion``, ``ours`` and ``holds``.
  """
  claims = [admin_claim(points, cfg, unigram), update_claim(update, cfg)]
  errs = [abs(a - (2 * int(L)) ** 0.25) + abs(b - (8 * int(L)) ** -0.25) for L, (a, b) in consts.items()]
  claims.append({"id": "deepnet_constants", "criterion": "the constants jaxnorm.models uses equal the formula to "
                 "1e-12 (exact: no partly)",
                 "ours": "; ".join(f"N={L}: alpha {a:z.4f}, beta {b:z.4f}" for L, (a, b) in consts.items()),
                 "holds": "yes" if max(errs) < 1e-12 else "no"})
  return claims
