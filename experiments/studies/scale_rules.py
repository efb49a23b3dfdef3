r"""The rules of the ``scale`` study (issues 50 and 55), fixed before the report's run read any data.

Inputs: per run ``(seq_len, position, lr, seed)`` its validation curve on the main windows, the second
windows' curve at the ladder's points, and whether and when it diverged; per sequence length the unigram
plateau of its validation windows. Every number below is a validation loss in nats per byte.

**A run's value at a ladder point** ``t`` (:func:`value_at`): its loss at step ``t``; a run that diverged
at or before ``t`` counts at the plateau (as the warm-up grid counts a diverged run). A run within
:data:`~experiments.studies.seeds.STALL_NATS` of the plateau at ``t`` is *failed* there (listed) but keeps
its own loss.

**Best-tuned rate** (:func:`best_rate`): per sequence length, layout and ladder point, the measured rate
with the lowest seed-mean value (ties: the smaller rate). With one measured rate the choice is the
pilots': the tables say "pilot-tuned" and no bold line of the answer rests on it.

**The paired difference** at ``t``: per seed, Pre-LN without warm-up at its best rate minus Post-LN with
warm-up at its best rate (negative: Pre-LN ahead). Its *noise*: the same difference on the second set of
validation windows (the same models), ``|d - d_alt|``, median and largest over seeds and points.

**Who is ahead at t** (:func:`ahead`): ``"pre"`` if every seed's difference is below ``-MARGIN``,
``"post"`` if every seed's is above ``+MARGIN``, ``"neither"`` otherwise (MARGIN = 0.05 nats, the
warm-up grid's paired margin).

**Claims.**

* ``scale_preln_lead_lasts`` (judged at the preset's shortest sequence length; every other length's reading is
  printed beside it, marked not judged): yes if Pre-LN is ahead
  at every ladder point; no if Post-LN is ahead at the longest; partly otherwise. Testable when the design
  has >= 3 seeds and >= 3 ladder points whose longest is >= 3 times the shortest (conditions on the
  design, none on the outcome).
* ``scale_seq_len_same_sign`` (with >= 2 sequence lengths; ``n/a`` with one): at the longest ladder point,
  yes if every sequence length has the same side ahead (``"pre"`` or ``"post"``); no if one length has
  Pre-LN ahead and another Post-LN; partly otherwise (some length has neither). Testable when every
  length has >= 3 seeds.

The sign change (:func:`crossing`): per seed, the first evaluation step at or after the first ladder point
at which the paired difference (on the whole validation curves, at the ladder point's best rates) is
positive after having been negative; without one, how the difference moves: the least-squares slope of the
seed-mean difference against log2 of the length (nats per doubling).
"""

from __future__ import annotations

import math

import numpy as np

from experiments.studies.seeds import STALL_NATS
from experiments.studies.warmup_rules import MARGIN
from experiments.suite.claims import not_testable

__all__ = ["MARGIN", "ahead", "best_rate", "claims", "crossing", "ladder_table", "slope_per_doubling", "value_at"]


def _curve(run: dict, key: str = "val_curve") -> dict[int, float]:
  out = {}
  for s, v in run.get(key) or []:
    try:
      out[int(s)] = float(v)
    except (TypeError, ValueError):
      out[int(s)] = math.nan
  return out


def value_at(run: dict, step: int, unigram: float, key: str = "val_curve") -> tuple[float, str | None]:
  """``(loss, failure)`` of ``run`` at ``step`` (see the module docstring); failure is ``"diverged"``,
  ``"stalled"`` or None. A curve without ``step`` that did not diverge raises ``KeyError``."""
  d = run.get("diverged_at")
  if d is not None and int(d) <= step:
    return unigram, "diverged"
  v = _curve(run, key).get(step)
  if v is None:
    raise KeyError(f"run has no {key} point at step {step}")
  if not np.isfinite(v):
    return unigram, "diverged"
  return v, ("stalled" if v > unigram - STALL_NATS else None)


def best_rate(runs: dict, seq: int, position: str, step: int, seeds, unigram: float) -> float:
  """The measured rate of ``position`` at ``seq`` with the lowest seed-mean value at ``step``."""
  lrs = sorted({lr for (s, p, lr, _) in runs if s == seq and p == position})
  means = [(np.mean([value_at(runs[(seq, position, lr, sd)], step, unigram)[0] for sd in seeds]), lr) for lr in lrs]
  return min(means)[1]


def ahead(diffs) -> str:
  """``"pre"``, ``"post"`` or ``"neither"`` from the per-seed paired differences (Pre - Post)."""
  if all(x < -MARGIN for x in diffs):
    return "pre"
  if all(x > MARGIN for x in diffs):
    return "post"
  return "neither"


def ladder_table(runs: dict, seq: int, ladder, seeds, unigram: float) -> list[dict]:
  """Per ladder point of sequence length ``seq``: the best rates, the per-seed values and paired
  differences (main and second windows), failures and who is ahead."""
  out = []
  for t in ladder:
    lr = {p: best_rate(runs, seq, p, t, seeds, unigram) for p in ("pre", "post")}
    row = {"step": t, "lr": lr, "n_rates": {p: len({k[2] for k in runs if k[0] == seq and k[1] == p})
                                            for p in ("pre", "post")}}
    for key, name in (("val_curve", "diff"), ("val_curve_alt", "diff_alt")):
      try:
        vals = {p: [value_at(runs[(seq, p, lr[p], s)], t, unigram, key) for s in seeds] for p in lr}
      except KeyError:
        row[name] = None
        continue
      row[name] = [a[0] - b[0] for a, b in zip(vals["pre"], vals["post"])]
      if key == "val_curve":
        row["values"] = {p: [v for v, _ in vals[p]] for p in vals}
        row["failures"] = {p: [f for _, f in vals[p]] for p in vals}
    row["ahead"] = ahead(row["diff"])
    out.append(row)
  return out


def noise(table: list[dict]) -> dict | None:
  """``{"median", "max", "n"}`` of ``|d - d_alt|`` over seeds and ladder points, None without alt."""
  d = [abs(a - b) for r in table if r.get("diff_alt") for a, b in zip(r["diff"], r["diff_alt"])
       if np.isfinite(a) and np.isfinite(b)]
  return {"median": float(np.median(d)), "max": float(max(d)), "n": len(d)} if d else None


def crossing(runs: dict, seq: int, table: list[dict], seeds, unigram: float) -> list[int | None]:
  """Per seed, the first evaluation step at or after the first ladder point where the paired difference
  at each ladder point's best rates is positive after being negative at that point (None: no sign
  change). Between ladder points the rates of the next ladder point apply."""
  out = []
  for s in seeds:
    found = None
    first = table[0]["step"]
    steps = sorted(k for k in _curve(runs[(seq, "pre", table[0]["lr"]["pre"], s)]) if k >= first)
    prev_neg = False
    for st in steps:
      row = next((r for r in table if r["step"] >= st), table[-1])
      try:
        a = value_at(runs[(seq, "pre", row["lr"]["pre"], s)], st, unigram)[0]
        b = value_at(runs[(seq, "post", row["lr"]["post"], s)], st, unigram)[0]
      except KeyError:
        continue
      if a - b < 0:
        prev_neg = True
      elif prev_neg and a - b > 0:
        found = st
        break
    out.append(found)
  return out


def slope_per_doubling(table: list[dict], tpp: dict) -> float:
  """Least-squares slope of the seed-mean paired difference against log2 of tokens per parameter."""
  x = np.log2([tpp[r["step"]] for r in table])
  y = [float(np.mean(r["diff"])) for r in table]
  return float(np.polyfit(x, y, 1)[0]) if len(table) >= 2 else math.nan


def _fmt_d(d) -> str:
  return "(" + ", ".join(f"{x:+z.3f}" for x in d) + ")"


def _lead_claim(table: list[dict], seq: int, tpp: dict, n_seeds: int) -> dict:
  crit = ("at the preset's shortest sequence length (the others printed beside it, not judged): per seed, Pre-LN "
          "without warm-up minus Post-LN with warm-up at each layout's best-tuned rate, at every ladder point; yes: "
          f"every seed below -{MARGIN} at every point; no: every seed above +{MARGIN} at the longest; partly "
          "otherwise")
  base = {"id": "scale_preln_lead_lasts", "criterion": crit}
  steps = [r["step"] for r in table]
  reasons = []
  if n_seeds < 3:
    reasons.append(f"{n_seeds} seeds (< 3)")
  if len(steps) < 3 or steps[-1] < 3 * steps[0]:
    reasons.append(f"ladder {steps} (needs >= 3 points, the longest >= 3x the shortest)")
  if reasons:
    holds, ours = not_testable(reasons)
    return {**base, "holds": holds, "ours": ours}
  parts = [f"T/P {tpp[r['step']]:z.2f} (step {r['step']}): {_fmt_d(r['diff'])} -> {r['ahead']}" for r in table]
  if all(r["ahead"] == "pre" for r in table):
    holds = "yes"
  elif table[-1]["ahead"] == "post":
    holds = "no"
  else:
    holds = "partly"
  tuned = ("" if all(min(r["n_rates"].values()) >= 2 for r in table)
           else "; rates pilot-tuned (one measured rate for a layout)")
  return {**base, "holds": holds, "ours": f"sequence {seq}: " + "; ".join(parts) + tuned,
          "short": f"seq {seq}: " + "; ".join(f"T/P {tpp[r['step']]:z.2f} {r['ahead']}" for r in table),
          "per_seed": [ahead([r["diff"][i]]) for r in table[-1:] for i in range(n_seeds)]}


def _seq_claim(tables: dict, n_seeds: dict) -> dict:
  crit = (f"at the longest ladder point, who is ahead (every seed beyond {MARGIN} nats) at each sequence length; "
          "yes: the same side at every length; no: Pre-LN at one, Post-LN at another; partly otherwise")
  base = {"id": "scale_seq_len_same_sign", "criterion": crit}
  if len(tables) < 2:
    return {**base, "holds": "n/a", "ours": "one sequence length in this preset"}
  if min(n_seeds.values()) < 3:
    holds, ours = not_testable([f"seeds per sequence length {n_seeds} (needs >= 3)"])
    return {**base, "holds": holds, "ours": ours}
  sides = {seq: t[-1]["ahead"] for seq, t in tables.items()}
  ours = "; ".join(f"sequence {seq}: {_fmt_d(t[-1]['diff'])} at step {t[-1]['step']} -> {sides[seq]}"
                   for seq, t in tables.items())
  vals = set(sides.values())
  if len(vals) == 1 and "neither" not in vals:
    holds = "yes"
  elif {"pre", "post"} <= vals:
    holds = "no"
  else:
    holds = "partly"
  return {**base, "holds": holds, "ours": ours}


def claims(tables: dict, tpp: dict, n_seeds: int) -> list[dict]:
  """The two claims from the per-sequence-length ladder tables (``{seq: ladder_table(...)}``)."""
  shortest = min(tables)
  lead = _lead_claim(tables[shortest], shortest, tpp[shortest], n_seeds)
  others = [s for s in sorted(tables) if s != shortest]
  if others and "short" in lead:
    # The registered rule judges the shortest sequence length; the others are printed beside it, each with who
    # is ahead at every point by the same test, so that no length of the study is left out of the row (issue 63).
    lead["ours"] += "".join(
        f". Not judged by the rule (it reads sequence {shortest}), sequence {s}: "
        + "; ".join(f"T/P {tpp[s][r['step']]:z.2f} (step {r['step']}): {_fmt_d(r['diff'])} -> {r['ahead']}"
                    for r in tables[s]) for s in others)
    lead["short"] += "".join(f"; seq {s} (not judged): " + "; ".join(
        f"T/P {tpp[s][r['step']]:z.2f} {r['ahead']}" for r in tables[s]) for s in others)
  return [lead, _seq_claim(tables, {s: n_seeds for s in tables})]
