"""The "What to use" sentences of the second command's studies (issue 44): DyT/Derf and QK-norm.

:func:`dyt_answer` reads the ``dyt`` summary's ``table`` (per T/P and norm: seed mean, min, max of the
final and best-of-curve validation loss); :func:`qk_answer` reads the ``qk_norm`` summary's ``table``
(per layout, QK-norm and seed: the peak attention logit at each rate). Numbers only, no verdict.
Summaries without these fields give no sentence.
"""

from __future__ import annotations

import math

__all__ = ["dyt_answer", "qk_answer"]


def _pct(a: float, b: float) -> float:
  return 100.0 * (a - b) / b


def dyt_answer(summary: dict) -> list[str]:
  """Sentences from the ``dyt`` study's summary (see the module docstring)."""
  rows = {(r["tpp"], r["norm"]): r for r in summary.get("table") or []}
  if not rows:
    return []
  tpp = max(t for t, _ in rows)
  ln = rows.get((tpp, "layer_norm"))
  if ln is None or "best" not in ln:
    return []
  parts = []
  for norm, name in (("rms_norm", "RMSNorm"), ("dyt", "DyT"), ("derf", "Derf")):
    r = rows.get((tpp, norm))
    if r is not None and all(math.isfinite(x) for x in (r["best"][0], ln["best"][0])):
      parts.append(f"{name} {_pct(r['best'][0], ln['best'][0]):+z.1f}%")
  if not parts:
    return []
  return [f"Norm-free layers: at the most data per parameter trained here (T/P {tpp:g}), best validation loss "
          f"against LayerNorm (seed mean): " + ", ".join(parts) + "; a small model, outside the papers' regime."]


def qk_answer(summary: dict) -> list[str]:
  """Sentences from the ``qk_norm`` study's summary (see the module docstring)."""
  table = summary.get("table") or []
  top = {}
  for r in table:
    peaks = [p for p in r.get("peak_logits") or [] if p is not None and math.isfinite(p)]
    if r.get("position") == "pre" and peaks:
      top.setdefault(bool(r["qk_norm"]), []).append(max(peaks))
  if not top.get(True) or not top.get(False):
    return []
  return [f"QK-norm (Pre-LN): largest attention logit over the rate sweep {min(top[True]):z.3g}-{max(top[True]):z.3g} "
          f"with it, {min(top[False]):z.3g}-{max(top[False]):z.3g} without (per seed)."]
