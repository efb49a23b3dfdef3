"""What the suite calls a training-loss spike: a run's :func:`largest_rise` above :data:`SPIKE_NATS`.

The suite's scan of every cached run (:func:`experiments.suite.runs.scan_runs`) and the report's list of
instabilities read it; the studies' seed statistics (:mod:`experiments.studies.seeds`) re-export it, so a
study's tables and the report mark the same rises as spikes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SPIKE_NATS", "largest_rise"]

SPIKE_NATS = 1.0   # a training loss this far above its running minimum is a spike


def largest_rise(train_curve) -> dict | None:
  r"""The largest rise of a training-loss curve above its running minimum: a loss spike's size.

  .. math:: r = \max_t \big(\ell_t - \min_{s < t} \ell_s\big)

  Args:
    train_curve: ``[(step, loss), ...]`` in step order (non-finite losses are skipped). A hard
      batch every run shares (:func:`experiments.studies.seeds.shared_rise_steps`) counts as a rise
      like any other step.

  Returns:
    ``{"rise", "step", "peak"}`` (the rise in nats, the step and the loss there; for a curve
    that never rises: rise 0, step None and its largest loss) or None for an empty curve.
    A rise above :data:`SPIKE_NATS` is a spike.
  """
  best, lo, top = None, np.inf, -np.inf
  for step, loss in train_curve or []:
    loss = float(loss)
    if not np.isfinite(loss):
      continue
    if lo < np.inf and loss - lo > (0.0 if best is None else best["rise"]):
      best = {"rise": float(loss - lo), "step": int(step), "peak": loss}
    lo, top = min(lo, loss), max(top, loss)
  if best is None and lo < np.inf:
    best = {"rise": 0.0, "step": None, "peak": float(top)}
  return best
