"""Readings of the ``dyt`` study's cells for its rules (:mod:`experiments.studies.dyt_rules`): a run's best and
final validation loss, its gap and saturation, paired differences per seed, the trained tokens per parameter,
the testability conditions T1-T4 and the regime text every claim's row opens with. Plain numbers in and out, no
training and no JAX; the thresholds are the rules' constants.
"""

from __future__ import annotations

import math

import numpy as np

MIN_DECADES = 1.0      # T1: the T/P values span at least one decade
OVERFIT_NATS = 0.25    # T2: LayerNorm's gap at the smallest T/P minus its gap at the largest
MAX_RICH_EPOCHS = 2.0  # T3: the largest T/P is seen at most this many times
PAPERS_TPP = (2.9, 29)  # tokens trained per parameter of Zhu et al.'s and Chen et al.'s language models (stated)
OVERFIT_FINAL_NATS = 0.1  # a run "has overfit" where its final validation loss exceeds its curve's best by this
TRAINED_NATS = 0.1     # T4: a reference run's validation loss below the unigram plateau by this
MIN_SEEDS = 3
REL = 0.01             # 1% of the reference's validation loss: "matches" within, "beats"/"helps" beyond
ORDER_NATS = 0.005     # training-loss order of Table 13: each step larger than this
SAT_DIFF = 0.05        # saturated fraction at the smallest T/P minus at the largest
GAP_NATS = 0.05        # DyT's gap below LayerNorm's by at least this

REFS = ("layer_norm", "rms_norm")
# The regime of the claims of Zhu et al. and Chen et al., as this project read the papers (stated in their rows).
PAPERS_REGIME = (f"the papers: single-epoch, {PAPERS_TPP[0]:g}-{PAPERS_TPP[1]:g} trained tokens per parameter, "
                 "124M-70B parameters")
NAMES = {"layer_norm": "LN", "rms_norm": "RMS", "dyt": "DyT", "derf": "Derf", "hardtanh": "HardTanh"}


def as_float(x) -> float:
  """``x`` as a float, NaN for a missing reading (None)."""
  return float("nan") if x is None else float(x)


def mean_saturation(sat) -> float:
  """The mean over a run's DyT/Derf norm inputs of the saturated fraction (nan if none)."""
  if not sat:
    return float("nan")
  return float(np.mean([as_float(s) for s in sat]))


def seeds_of(cells: dict) -> list:
  """The sorted seeds of ``cells`` (keyed ``(norm, tokens per parameter, seed)``)."""
  return sorted({s for (_, _, s) in cells})


def tpps_of(cells: dict) -> list:
  """The sorted tokens-per-parameter levels of ``cells``."""
  return sorted({t for (_, t, _) in cells})


def usable(c) -> bool:
  """Whether a cell is a run that did not diverge and has finite losses on both window sets."""
  return c is not None and not c.get("diverged") and all(math.isfinite(as_float(c.get(k))) for k in ("val", "val_alt"))


def val_diff(cells, a, b, tpp, seed) -> tuple[float, float] | None:
  """``(d, d_alt)``: val(a) - val(b) on both sets of validation windows, or None if a run is missing."""
  ca, cb = cells.get((a, tpp, seed)), cells.get((b, tpp, seed))
  if not (usable(ca) and usable(cb)):
    return None
  return as_float(ca["val"]) - as_float(cb["val"]), as_float(ca["val_alt"]) - as_float(cb["val_alt"])


def paired(cells, a, b, tpp, seed) -> dict | None:
  """What a "which norm is better" rule compares of runs ``a`` and ``b`` (same T/P and seed), or None.

  Where neither final checkpoint has overfit (:func:`overfit`), the final validation losses on both
  sets of windows: ``{"kind": "final", "pairs": [(d, val(b)), (d_alt, val_alt(b))], ...}`` (each
  difference with its own set's reference, the denominator of a relative difference). Where either
  has, the best point of each curve (one set of windows: the curve is evaluated on the first only):
  ``{"kind": "best", "pairs": [(best(a) - best(b), best(b))], ...}``. Both carry ``final`` (the
  final ``(d, d_alt)``) and ``best`` (``(best(a) - best(b), best(b))``) for the text.
  """
  d = val_diff(cells, a, b, tpp, seed)
  if d is None:
    return None
  ca, cb = cells[(a, tpp, seed)], cells[(b, tpp, seed)]
  best = (best_val(ca) - best_val(cb), best_val(cb))
  if overfit(ca) or overfit(cb):
    return {"kind": "best", "pairs": [best], "final": d, "best": best,
            "refs": (as_float(cb["val"]), as_float(cb["val_alt"]))}
  refs = (as_float(cb["val"]), as_float(cb["val_alt"]))
  return {"kind": "final", "pairs": [(d[0], refs[0]), (d[1], refs[1])], "final": d, "best": best,
          "refs": refs}


def best_val(c) -> float:
  """The lowest validation loss of a run's curve (``val_curve``: ``[(step, loss)]``), else its final one."""
  curve = [as_float(v) for _, v in (c.get("val_curve") or [])]
  curve = [v for v in curve if math.isfinite(v)]
  return min(curve) if curve else as_float(c.get("val"))


def trained_tokens_per_param(epochs: dict, tpp: float) -> float:
  """Tokens trained per parameter in the cell ``tpp``: passes over its unique bytes times ``tpp``."""
  return as_float(epochs.get(tpp)) * float(tpp)


def overfit(c) -> bool:
  """Whether a run's final validation loss lies ``OVERFIT_FINAL_NATS`` above the best of its curve."""
  return bool(c) and as_float(c.get("val")) - best_val(c) > OVERFIT_FINAL_NATS


def gap(c) -> float:
  """``val - train`` of one cell (nan if either is missing)."""
  return as_float(c.get("val")) - as_float(c.get("train")) if c else float("nan")


def testability(cells: dict, *, epochs: dict, unigram: float, need=("T1", "T2", "T3", "T4"),
                norms=("layer_norm", "rms_norm", "dyt", "derf")) -> list[str]:
  """The unmet conditions (reasons, with their numbers) among ``need`` for a rule that reads ``norms``.

  ``epochs``: T/P -> how many times the unique bytes are seen; ``unigram``: the plateau of the
  validation windows.
  """
  tpps, seeds, out = tpps_of(cells), seeds_of(cells), []
  if len(seeds) < MIN_SEEDS:
    out.append(f"{len(seeds)} seed(s), fewer than {MIN_SEEDS}")
  if not tpps:
    return out + ["no run"]
  lo, hi = tpps[0], tpps[-1]
  if "T1" in need and (lo <= 0 or math.log10(hi / lo) < MIN_DECADES):
    out.append(f"T/P spans {lo:g}-{hi:g}, less than {MIN_DECADES:g} decade (T1)")
  if "T2" in need:
    gl = [gap(cells.get(("layer_norm", lo, s))) - gap(cells.get(("layer_norm", hi, s))) for s in seeds]
    gl = [g for g in gl if math.isfinite(g)]
    if not gl or float(np.mean(gl)) < OVERFIT_NATS:
      shown = f"{float(np.mean(gl)):z.3f}" if gl else "not measured"
      out.append(f"LayerNorm's gap (val - train) at T/P {lo:g} exceeds its gap at {hi:g} by {shown} nats, "
                 f"less than {OVERFIT_NATS:g}: data are not scarce in the sense of overfitting (T2)")
  if "T3" in need and as_float(epochs.get(hi)) > MAX_RICH_EPOCHS:
    out.append(f"the largest T/P {hi:g} is seen {as_float(epochs.get(hi)):z.2f} times, "
               f"more than {MAX_RICH_EPOCHS:g} (T3)")
  if "T4" in need:
    bad = [f"{NAMES.get(n, n)} T/P {t:g} s{s}" for (n, t, s), c in sorted(cells.items(), key=str)
           if n in norms and c.get("diverged")]
    if bad:
      out.append("diverged: " + ", ".join(bad) + " (T4)")
    stuck = [f"{NAMES[n]} T/P {t:g} s{s} (best {best_val(c):z.3f})" for (n, t, s), c in sorted(cells.items(), key=str)
             if n in REFS and n in norms and not c.get("diverged") and best_val(c) > unigram - TRAINED_NATS]
    if stuck:
      out.append(f"reference runs that did not leave the plateau {unigram:z.3f} by {TRAINED_NATS:g}: "
                 + ", ".join(stuck) + " (T4)")
  return out


def regime(cells: dict, epochs: dict, compact: bool = False) -> str:
  """The regime of the judged (largest) T/P beside the papers', the opening of the rows of Zhu et al.'s
  and Chen et al.'s claims (issue 50: judged at this scale, the regime stated, not a condition);
  ``compact``: the verdict table's short form."""
  tpps = tpps_of(cells)
  if not tpps:
    return ""
  hi = tpps[-1]
  params = next((c.get("params") for c in cells.values() if c and c.get("params")), None)
  trained = trained_tokens_per_param(epochs, hi)
  if compact:
    return (f"at this scale ({trained:z.2f} trained tokens/param" + (f", {params:,} params" if params else "")
            + f"; papers {PAPERS_TPP[0]:g}-{PAPERS_TPP[1]:g} at 124M-70B)")
  return (f"judged at this scale, outside the papers' regime: T/P {hi:g} unique tokens per parameter, "
          f"{trained:z.2f} trained" + (f", {params:,} parameters" if params else "") + f" ({PAPERS_REGIME})")


def fmt_diff(d) -> str:
  """A :func:`val_diff` pair as text ('missing' for None)."""
  return "missing" if d is None else f"{d[0]:+z.3f} (alt {d[1]:+z.3f})"


def fmt_pair(p, rel: bool = False) -> str:
  """A :func:`paired` comparison as text: the final differences (absolute, or relative to each
  window set's own reference), and the best-of-curve one, marked where it is the one judged."""
  if p is None:
    return "missing"
  (d, da), (db, rb), (r, ra) = p["final"], p["best"], p["refs"]
  fin = f"{d / r:+z.1%} (alt {da / ra:+z.1%})" if rel else fmt_diff(p["final"])
  best = f"{db / rb:+z.1%}" if rel else f"{db:+z.3f}"
  if p["kind"] == "best":
    return f"best-of-curve {best} (judged: a final checkpoint overfit; final {fin})"
  return f"{fin}, best-of-curve {best}"


def top_short(cells, norm: str, others) -> str:
  """The judged differences of ``norm`` at the largest T/P, relative to each of ``others``, as
  min..max over the seeds (the verdict table's short text)."""
  tpps = tpps_of(cells)
  if not tpps:
    return ""
  out = []
  for other in others:
    rel = []
    for s in seeds_of(cells):
      p = paired(cells, norm, other, tpps[-1], s)
      if p is not None:
        rel += [x / r for x, r in p["pairs"][:1]]
    if rel:
      out.append(f"vs {NAMES[other]} {min(rel):+z.1%} to {max(rel):+z.1%}")
  return (f"T/P {tpps[-1]:g}: {NAMES[norm]} " + ", ".join(out) + f" (range over {len(seeds_of(cells))} seeds)"
          if out else "")


def nearest_cut(cells, norm: str, others) -> str:
  """``"; nearest the -1% cut: s11 vs DyT -1.14%"``: the (seed, competitor) pair at the largest T/P whose judged
  relative difference (the worse of its window sets) lies closest to the rule's cut ``-REL``, so that a reader sees
  where a verdict sits on a threshold (issue 63's referees: Derf's "partly" rested on one pair at -1.14%, and the
  fresh seeds' "no" on one at -0.99%); empty without a judged pair."""
  tpps = tpps_of(cells)
  if not tpps:
    return ""
  cand = []
  for other in others:
    for s in seeds_of(cells):
      p = paired(cells, norm, other, tpps[-1], s)
      if p is not None:
        rel = max(x / r for x, r in p["pairs"])
        cand.append((abs(rel + REL), s, other, rel))
  if not cand:
    return ""
  _, s, other, rel = min(cand)
  return f"; nearest the -{REL:z.0%} cut: s{s} vs {NAMES[other]} {rel:+z.2%}"
