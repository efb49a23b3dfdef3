"""The "What to use" sentences of the flagship studies (issues 44 and 63): effect sizes a user can act on.

:func:`warmup_answer` and :func:`depth_answer` read a study's summary (its ``done.json``) and return
short sentences with numbers: the highest rate each layout trains at, per seed (">=" at the grid's top); Pre-LN
minus Post-LN, paired; the warm-up gain; deep Post-LN against Pre-LN. Each sentence opens with its regime (layers,
batch x sequence, steps, tokens per parameter; issue 63) and, where the committed gpu run is not the summary's own,
says in the same line what that run found, with its numbers read from its files when the report is rendered
(:mod:`experiments.studies.gpu_reference`) and whether it agrees. They judge nothing: the verdicts are the
rules'. A line is bold only where every seed agrees beyond the rules' margin at each compared layout's
best-tuned rate (:func:`best_rate`: lowest seed-mean final loss where it trains in every seed), issue 50.
Summaries written before the issue-44 field ``highest_trained_per_seed`` (the gpu report's, at 20ad8f4) get
the per-seed highest rate from the grid's recorded ``failures`` over every rate (:func:`_per_seed`), the
same reading as ``warmup_rules.highest_trained``; a summary without a grid gives no sentence.
"""

from __future__ import annotations

from experiments.studies import gpu_reference
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
  (``{"pos|w": [lr or None per seed]}``; a layout missing from the grid is left out), re-read under issue 44's
  stalled-run rule (a summary judged before it, the gpu run's, counted a late exit as trained)."""
  from experiments.studies.seeds import late_counts_as_stalled
  per = summary.get("highest_trained_per_seed")
  if per:
    return per
  grid, lrs, out = summary.get("grid") or {}, summary.get("lrs") or [], {}
  steps = (summary.get("config") or {}).get("steps")
  if steps:
    grid = {k: late_counts_as_stalled(v, steps) for k, v in grid.items()}
  for pos, w in [("post", w) for w in warmups] + [("pre", 0)]:
    cells = [(lr, grid.get(f"{pos}|{lr}|{w}")) for lr in lrs]
    cells = [(lr, c) for lr, c in cells if c and "failures" in c]
    if cells:
      n = len(cells[0][1]["failures"])
      out[f"{pos}|{w}"] = [max([lr for lr, c in cells if not c["failures"][i]], default=None) for i in range(n)]
  return out


def _regime(summary: dict, n_layers: int, steps: int) -> str:
  """``"6 layers, 16 x 32, 200 steps (T/P 0.30)"``: the regime a line is about, from the summary's model and the
  run's batch layout (its ``provenance``, attached by the report); tokens per parameter count every parameter."""
  from experiments.suite.runs import trained_tokens_per_param
  train = (summary.get("provenance") or {}).get("train") or {}
  b, t = train.get("batch_size"), train.get("seq_len")
  if not (b and t and summary.get("model")):
    return f"{n_layers} layers, {steps} steps"
  tpp = trained_tokens_per_param(summary["model"], n_layers, steps, b, t)
  return f"{n_layers} layers, {b} x {t}, {steps} steps (T/P {tpp:z.2f})"


def _ref(summary: dict) -> dict | None:
  """The committed gpu run, or None (none committed, or this summary is its own)."""
  ref = gpu_reference.load()
  return None if ref is None or gpu_reference.is_self(ref, summary) else ref


def _c(lrs, width: int) -> str:
  """Rates as c = lr x width, a range over seeds (``>=`` kept)."""
  cs = sorted({lr * width for lr in lrs if lr is not None})
  return "none" if not cs else (f"{cs[0]:z.2g}" if len(cs) == 1 else f"{cs[0]:z.2g}-{cs[-1]:z.2g}")


def _side(xs) -> str:
  return "pre" if all(x < -MARGIN for x in xs) else ("post" if all(x > MARGIN for x in xs) else "neither")


def _gpu_best(ref: dict | None, d: list[float], bp: float, bq: float) -> str:
  """The gpu run's Pre-LN minus Post-LN at its best rates beside ours (``d`` at ``bp``/``bq``), and whether its best
  rates are in the other order; empty without a reference."""
  if ref is None:
    return ""
  gp, gq = ref["best"]["pre"], ref["best"]["post"]
  verb = "agrees" if _side(ref["diff_best"]) == _side(d) else "disagrees"
  out = (f"; the {gpu_reference.short(ref)} {verb}: Pre-LN ({gp:z.2g}) minus Post-LN with warm-up ({gq:z.2g}) "
         f"{_span(ref['diff_best'])}")
  if (gq > gp) != (bq > bp):
    out += (f", and its best rates are in the other order (Post-LN's {gq / gp:z.2g}x Pre-LN's; here Pre-LN's "
            f"{bp / bq:z.2g}x Post-LN's)")
  return out


def _self_regime() -> str:
  """The committed gpu run's own regime line (its report has no ladder study to give one): parameters, width,
  tokens a step, steps, tokens per parameter, and where its design came from."""
  ref = gpu_reference.load()
  return (f"Regime: {ref['params']:,} parameters (width {ref['width']}), {ref['batch']} x {ref['seq_len']} = "
          f"{ref['tokens_per_step']:,} tokens a step, {ref['steps']} steps (T/P {ref['tpp']:z.2f}); git "
          f"{ref['git'][:7]}, an older design than the cpu reports' (not piloted at this size; Setup).")


def _cpu_best(mine: list[float]) -> str:
  """For the committed gpu run's own report: the committed cpu report's Pre-LN minus Post-LN with warm-up at its
  best rates beside ``mine`` (the gpu run's), read from its files when the report is rendered (issue 63's referee:
  the gpu report names the disagreement too); empty where the cpu report is not committed."""
  from experiments.suite.registry import read_json
  done, suite = gpu_reference.RESULTS / "cpu" / "warmup" / "done.json", gpu_reference.RESULTS / "cpu" / "suite.json"
  if not done.exists():
    return ""
  c = read_json(done)
  best = _best(c)
  if best is None:
    return ""
  bp, bq, d = best
  cfg = c.get("config") or {}
  train = (read_json(suite).get("preset_config") or {}).get("train") or {} if suite.exists() else {}
  verb = "agrees" if _side(d) == _side(mine) else "disagrees"
  return (f"; the cpu report (newer code and design; {cfg.get('n_layers', 6)} layers, {train.get('batch_size', '?')} "
          f"x {train.get('seq_len', '?')}, {cfg.get('steps')} steps, width {(c.get('model') or {}).get('d_model')}) "
          f"{verb}: Pre-LN ({bp:z.2g}) minus Post-LN with warm-up ({bq:z.2g}) {_span(d)}")


def _cpu_summary(study: str) -> dict | None:
  """The committed cpu report's ``study`` summary (read when the report is rendered), or None."""
  from experiments.suite.registry import read_json
  done = gpu_reference.RESULTS / "cpu" / study / "done.json"
  return read_json(done) if done.exists() else None


def _cpu_gain(mine: list[float]) -> str:
  """For the committed gpu run's own report: the committed cpu report's warm-up gain for Post-LN at each one's
  best rate beside ``mine`` (issue 63's third referee); empty where it is not committed."""
  c = _cpu_summary("warmup")
  best = _best(c) if c else None
  b0 = best_rate(c.get("grid") or {}, c.get("lrs", []), lambda lr: f"post|{lr}|0") if c else None
  if best is None or b0 is None:
    return ""
  long_ = max((c.get("config") or {}).get("warmups") or [0])
  g = _paired(c["grid"], f"post|{b0}|0", f"post|{best[1]}|{long_}")
  verb = "agrees" if all(x > MARGIN for x in g) == all(x > MARGIN for x in mine) else "disagrees"
  return f"; the cpu report (newer code and design) {verb}: warm-up {long_} gains {_span(g)}"


def _cpu_depth(layers: int, fails: int, n: int) -> str:
  """For the committed gpu run's own report: the committed cpu report's Post-LN failures at ``layers`` beside
  ``fails`` of ``n`` (issue 63's third referee); empty where it has no such depth."""
  c = _cpu_summary("depth")
  p = ((c or {}).get("points") or {}).get(f"post/L{layers}")
  if not p:
    return ""
  cf = sum(1 for f in p["failures"] if f)
  verb = "agrees" if (cf == len(p["failures"])) == (fails == n) else "disagrees"
  steps = (c.get("config") or {}).get("steps")
  return f"; the cpu report (newer code and design; {steps} steps) {verb}: Post-LN failed in {cf}/{len(p['failures'])}"


def _best(summary: dict) -> tuple[float, float, list[float]] | None:
  """``(Pre-LN's best rate, Post-LN with the longest warm-up's, their paired difference per seed)`` of a warm-up
  grid summary, or None where either layout trains at no rate in every seed."""
  grid, lrs = summary.get("grid") or {}, summary.get("lrs", [])
  long_ = max((summary.get("config") or {}).get("warmups") or [0])
  bp, bq = best_rate(grid, lrs, lambda lr: f"pre|{lr}|0"), best_rate(grid, lrs, lambda lr: f"post|{lr}|{long_}")
  if bp is None or bq is None:
    return None
  return bp, bq, _paired(grid, f"pre|{bp}|0", f"post|{bq}|{long_}")


def warmup_answer(summary: dict) -> list[str]:
  """Sentences from the warm-up grid's summary (see the module docstring); each opens with its regime and, where
  the committed gpu run disagrees, says so with its numbers (issue 63)."""
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
  cfg = summary.get("config") or {}
  steps = cfg.get("steps")
  regime = _regime(summary, cfg.get("n_layers", 6), steps) if steps else f"{n} seeds"
  ref = _ref(summary)
  width = int((summary.get("model") or {}).get("d_model", 0)) or None
  pre_r, post_r = per.get("pre|0", []), per.get(f"post|{long_}", [])
  tops = ""
  if ref is not None and width:
    h, gw = ref["highest"], ref["width"]
    ge = ">= " if max((x for x in pre_r if x is not None), default=0) == top else ""
    tops = (f"; the {gpu_reference.short(ref)}, in c = lr x width (here Pre-LN {ge}{_c(pre_r, width)}, Post-LN "
            f"with warm-up {_c(post_r, width)}): Pre-LN {_c(h['pre'], gw)}, Post-LN without warm-up "
            f"{_c(h['post0'], gw)}, with warm-up {ref['warmup']} {_c(h['post'], gw)} (the top of its grid: "
            f"{max(ref['c']):z.2g})")
  out = [f"{regime}: highest peak rate each layout trained at, per seed ({n} seed{'s' if n != 1 else ''}): "
         f"Pre-LN without warm-up {_rates(pre_r, top)}; Post-LN without warm-up {_rates(per.get('post|0', []), top)}, "
         f"with warm-up {long_} {_rates(post_r, top)}{tops}"
         + (" (counted by issue 44's stalled-run rule, as in the cpu reports; this run's grid table and verdicts keep "
            "its commit's rule)" if ref is None and gpu_reference.is_self(gpu_reference.load(), summary) else "")
         + "."]
  # A bold recommendation only where every seed agrees, at each layout's best-tuned rate (issue 50).
  higher = pre_r and all(a is not None and (b is None or a >= b) for a, b in zip(pre_r, post_r))
  own = ref is None and gpu_reference.is_self(gpu_reference.load(), summary)
  best = _best(summary)
  bp, bq = best[:2] if best else (None, None)
  if best is not None:
    d = best[2]
    lead = ("**Pre-LN** trained at higher rates and, at each one's best rate, to a lower loss than Post-LN in every "
            "seed: " if higher and all(x < -MARGIN for x in d) else "at each one's best rate: ")
    gpu = _gpu_best(ref, d, bp, bq) or (_cpu_best(d) if own else "")
    edge = [name for name, b in (("Pre-LN", bp), ("Post-LN with warm-up", bq)) if b == top]
    edge_text = f" ({' and '.join(edge)}: best at the grid's top rate, not bracketed from above)" if edge else ""
    out.insert(0, f"{regime}: {lead}Pre-LN ({bp:z.2g}) minus Post-LN with warm-up ({bq:z.2g}) {_span(d)} nats per "
                  f"seed{edge_text}{gpu}.")
  if own:
    out.insert(0, _self_regime())
  gain = _warmup_gain_line(summary, regime, ref, own, bq)
  if gain:
    out.append(gain)
  return out


def _warmup_gain_line(summary: dict, regime: str, ref: dict | None, own: bool, bq: float | None) -> str | None:
  """The warm-up bullet: Post-LN's gain from warm-up at each one's best rate (``bq``: with warm-up's), bold only
  where every seed gains beyond the margin, with the gpu run's gain (or, in the gpu run's own report, the cpu
  report's) beside it; None where Post-LN trains at no rate without warm-up."""
  grid, lrs = summary.get("grid") or {}, summary.get("lrs", [])
  long_ = max((summary.get("config") or {}).get("warmups") or [0])
  b0 = best_rate(grid, lrs, lambda lr: f"post|{lr}|0")
  if b0 is None or bq is None:
    return None
  g = _paired(grid, f"post|{b0}|0", f"post|{bq}|{long_}")
  lead = ("**With Post-LN, use warm-up**:" if all(x > MARGIN for x in g) else
          f"warm-up {long_} for Post-LN gains no seed more than the {MARGIN} margin:" if all(x <= MARGIN for x in g)
          else "warm-up for Post-LN (no rule: the seeds disagree):")
  gpu = _cpu_gain(g) if own else ""
  if ref is not None and ref.get("warmup_gain"):
    gg = ref["warmup_gain"]
    verb = "agrees" if (all(x > MARGIN for x in gg) == all(x > MARGIN for x in g)) else "disagrees"
    gpu = (f"; the {gpu_reference.short(ref)} {verb}: warm-up {ref['warmup']} gains {_span(gg)} at each one's best "
           f"rate ({ref['best']['post0']:z.2g} without, {ref['best']['post']:z.2g} with)")
  edge = "; without: the grid's bottom rate, not bracketed from below" if lrs and b0 == min(lrs) else ""
  return (f"{regime}: {lead} at each one's best rate ({b0:z.2g} without, {bq:z.2g} with{edge}) it gains "
          f"{_span(g)} nats per seed{gpu}.")


def depth_answer(summary: dict) -> list[str]:
  """Sentences from the depth study's summary (see the module docstring): the deepest Post-LN against Pre-LN, its
  regime first, and the committed gpu run's where it disagrees (issue 63)."""
  points = summary.get("points") or {}
  deep = sorted((int(k.split("/L")[1]) for k in points if k.startswith("post/L")), reverse=True)
  if not deep or f"pre/L{deep[0]}" not in points:
    return []
  L = deep[0]
  post, pre = points[f"post/L{L}"], points[f"pre/L{L}"]
  fails = sum(1 for f in post["failures"] if f)
  cfg = summary.get("config") or {}
  width = int((summary.get("model") or {}).get("d_model", 0))
  rate = f", lr {summary['lr']:g} (c = lr x width {summary['lr'] * width:z.2g})" if summary.get("lr") and width else ""
  regime = _regime(summary, L, cfg.get("steps")) if cfg.get("steps") else f"{L} layers"
  gpu = ""
  ref = _ref(summary)
  g = (ref or {}).get("depth")
  if g and g["layers"] == L:
    verb = "agrees" if (g["post_fails"] == g["n"]) == (fails == len(post["failures"])) else "disagrees"
    gpu = (f"; the {gpu_reference.short(ref)} {verb}: at {g['layers']} layers, c {g['c']:z.2g}, {g['steps']} steps "
           f"(T/P {g['tpp']:z.2f}) Post-LN failed in {g['post_fails']}/{g['n']} seeds (final "
           + ", ".join(f"{v:z.2f}" for v in g["post"]) + ")"
           + (", Pre-LN " + ", ".join(f"{v:z.2f}" for v in g["pre"]) if g.get("pre") else ""))
  if ref is None and gpu_reference.is_self(gpu_reference.load(), summary):
    gpu = _cpu_depth(L, fails, len(post["failures"]))
  return [f"{regime}{rate}: Post-LN failed in {fails}/{len(post['failures'])} seeds (final "
          + ", ".join(f"{v:z.2f}" for v in post["values"]) + "), Pre-LN reached "
          + ", ".join(f"{v:z.2f}" for v in pre["values"]) + f"{gpu}."]
