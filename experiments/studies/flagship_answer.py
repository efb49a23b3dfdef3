"""The "What to use" sentences of the flagship studies (issue 44): effect sizes a user can act on.

:func:`warmup_answer` and :func:`depth_answer` read a study's summary (its ``done.json``) and return
short sentences with numbers: the highest rate each layout trains at, per seed; Pre-LN minus Post-LN,
paired; the warm-up gain; deep Post-LN against Pre-LN. They judge nothing: the verdicts are the rules'.
Summaries written before the issue-44 field ``highest_trained_per_seed`` (the gpu report's, at 20ad8f4) get
the per-seed highest rate from the grid's recorded ``failures`` over every rate (:func:`_per_seed`), the
same reading as ``warmup_rules.highest_trained``; a summary without a grid gives no sentence.
"""

from __future__ import annotations

from experiments.studies.warmup_rules import MARGIN

__all__ = ["depth_answer", "warmup_answer"]


def _rates(rates) -> str:
  return ", ".join("none" if r is None else f"{r:z.2g}" for r in rates)


def _span(xs) -> str:
  lo, hi = min(xs), max(xs)
  return f"{lo:+z.2f}" if abs(hi - lo) < 5e-3 else f"{lo:+z.2f} to {hi:+z.2f}"


def _per_seed(summary: dict, warmups: list[int]) -> dict:
  """``highest_trained_per_seed`` if the summary has it, else read from the grid's per-seed ``failures``
  (``{"pos|w": [lr or None per seed]}``; a layout missing from the grid is left out)."""
  per = summary.get("highest_trained_per_seed")
  if per:
    return per
  grid, lrs, out = summary.get("grid") or {}, summary.get("lrs") or [], {}
  for pos, w in [("post", w) for w in warmups] + [("pre", 0)]:
    cells = [(lr, grid.get(f"{pos}|{lr}|{w}")) for lr in lrs]
    cells = [(lr, c) for lr, c in cells if c and "failures" in c]
    if cells:
      n = len(cells[0][1]["failures"])
      out[f"{pos}|{w}"] = [max([lr for lr, c in cells if not c["failures"][i]], default=None) for i in range(n)]
  return out


def warmup_answer(summary: dict) -> list[str]:
  """Sentences from the warm-up grid's summary (see the module docstring)."""
  grid = summary.get("grid") or {}
  warmups = (summary.get("config") or {}).get("warmups")
  if not grid or not warmups:
    return []
  per = _per_seed(summary, warmups)
  if not per:
    return []
  long_ = max(warmups)
  n = len(summary.get("seeds", []))
  pre_r, post_r = per.get("pre|0", []), per.get(f"post|{long_}", [])
  out = [f"Highest peak rate each layout trained at, per seed ({n} seed{'s' if n != 1 else ''}): Pre-LN without "
         f"warm-up {_rates(pre_r)}; Post-LN without warm-up {_rates(per.get('post|0', []))}, with warm-up {long_} "
         f"{_rates(post_r)}."]
  diffs = []
  for lr in summary.get("lrs", []):
    pre, post = grid.get(f"pre|{lr}|0"), grid.get(f"post|{lr}|{long_}")
    if pre and post and not any(post["failures"]) and not any(pre["failures"]):
      diffs.append((lr, [a - b for a, b in zip(pre["values"], post["values"])]))
  if diffs:
    out.append("Final loss, Pre-LN without minus Post-LN with warm-up (paired per seed): "
               + "; ".join(f"{_span(d)} nats at {lr:z.2g}" for lr, d in diffs) + ".")
  # A recommendation only where every seed and every compared rate agree.
  higher = pre_r and all(a is not None and (b is None or a >= b) for a, b in zip(pre_r, post_r))
  if higher and diffs and all(x < -MARGIN for _, d in diffs for x in d):
    out.insert(0, "**Pre-LN** trained at higher rates and to a lower loss than Post-LN in every seed.")
  gains = []
  for lr in summary.get("lrs", []):
    a, b = grid.get(f"post|{lr}|0"), grid.get(f"post|{lr}|{long_}")
    if a and b:
      gains.append((lr, [x - y for x, y in zip(a["values"], b["values"])]))
  if gains:
    lr, g = max(gains, key=lambda t: sum(t[1]) / len(t[1]))
    lead = "**With Post-LN, use warm-up**:" if sum(g) / len(g) > MARGIN else "Warm-up for Post-LN:"
    out.append(f"{lead} its largest paired gain in final loss is {_span(g)} nats (per seed) at {lr:z.2g}.")
  return out


def depth_answer(summary: dict) -> list[str]:
  """Sentences from the depth study's summary (see the module docstring)."""
  points = summary.get("points") or {}
  deep = sorted((int(k.split("/L")[1]) for k in points if k.startswith("post/L")), reverse=True)
  if not deep or f"pre/L{deep[0]}" not in points:
    return []
  L = deep[0]
  post, pre = points[f"post/L{L}"], points[f"pre/L{L}"]
  fails = sum(1 for f in post["failures"] if f)
  return [f"At {L} layers Post-LN failed in {fails}/{len(post['failures'])} seeds (final "
          + ", ".join(f"{v:z.2f}" for v in post["values"]) + "), Pre-LN reached "
          + ", ".join(f"{v:z.2f}" for v in pre["values"]) + "."]
