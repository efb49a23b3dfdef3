"""The "What to use" sentences of the flagship studies (issue 44): effect sizes a user can act on.

:func:`warmup_answer` and :func:`depth_answer` read a study's summary (its ``done.json``) and return
short sentences with numbers: the highest rate each layout trains at, per seed (">=" at the grid's top); Pre-LN
minus Post-LN, paired; the warm-up gain; deep Post-LN against Pre-LN. They judge nothing: the verdicts are the
rules'. A line is bold only where every seed agrees beyond the rules' margin at each compared layout's
best-tuned rate (:func:`best_rate`: lowest seed-mean final loss where it trains in every seed), issue 50.
Summaries written before the issue-44 field ``highest_trained_per_seed`` (the gpu report's, at 20ad8f4) get
the per-seed highest rate from the grid's recorded ``failures`` over every rate (:func:`_per_seed`), the
same reading as ``warmup_rules.highest_trained``; a summary without a grid gives no sentence.
"""

from __future__ import annotations

from experiments.studies.seeds import span as _span
from experiments.studies.warmup_rules import MARGIN

__all__ = ["depth_answer", "warmup_answer"]


def _rates(rates, top: float | None = None) -> str:
  """Rates per seed; the grid's top rate reads ">= top" (the layout may train higher still)."""
  return ", ".join("none" if r is None else (">= " if top is not None and r >= top else "") + f"{r:z.2g}"
                   for r in rates)


def best_rate(grid: dict, lrs, key) -> float | None:
  """The rate where the layout (``key(lr)`` its grid label) has the lowest seed-mean final loss among the
  rates where it trains in every seed (None if it trains at none): its best-tuned rate."""
  ok = [(sum(grid[key(lr)]["values"]) / len(grid[key(lr)]["values"]), lr) for lr in lrs
        if key(lr) in grid and not any(grid[key(lr)]["failures"])]
  return min(ok)[1] if ok else None


def _paired(grid: dict, a: str, b: str) -> list[float]:
  return [x - y for x, y in zip(grid[a]["values"], grid[b]["values"])]


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
  lrs = summary.get("lrs", [])
  top = max(lrs) if lrs else None
  steps = (summary.get("config") or {}).get("steps")
  pre_r, post_r = per.get("pre|0", []), per.get(f"post|{long_}", [])
  run = f", {steps} steps" if steps else ""
  out = [f"Highest peak rate each layout trained at, per seed ({n} seed{'s' if n != 1 else ''}{run}): "
         f"Pre-LN without warm-up {_rates(pre_r, top)}; Post-LN without warm-up {_rates(per.get('post|0', []), top)}, "
         f"with warm-up {long_} {_rates(post_r, top)}."]
  # A bold recommendation only where every seed agrees, at each layout's best-tuned rate (issue 50).
  higher = pre_r and all(a is not None and (b is None or a >= b) for a, b in zip(pre_r, post_r))
  bp, bq = best_rate(grid, lrs, lambda lr: f"pre|{lr}|0"), best_rate(grid, lrs, lambda lr: f"post|{lr}|{long_}")
  if bp is not None and bq is not None:
    d = _paired(grid, f"pre|{bp}|0", f"post|{bq}|{long_}")
    lead = ("**Pre-LN** trained at higher rates and, at each one's best rate, to a lower loss than Post-LN in every "
            f"seed{run.replace(',', ' after')}: " if higher and all(x < -MARGIN for x in d)
            else "At each one's best rate: ")
    out.insert(0, f"{lead}Pre-LN ({bp:z.2g}) minus Post-LN with warm-up ({bq:z.2g}) {_span(d)} nats per seed.")
  b0 = best_rate(grid, lrs, lambda lr: f"post|{lr}|0")
  if b0 is not None and bq is not None:
    g = _paired(grid, f"post|{b0}|0", f"post|{bq}|{long_}")
    lead = ("**With Post-LN, use warm-up**:" if all(x > MARGIN for x in g)
            else "Warm-up for Post-LN (no rule: the seeds disagree):")
    out.append(f"{lead} at each one's best rate ({b0:z.2g} without, {bq:z.2g} with) it gains {_span(g)} nats per seed.")
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
