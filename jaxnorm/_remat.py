r"""Remat-policy names of the residuals the backward rules save.

The forward rules tag their residuals with :func:`jax.ad_checkpoint.checkpoint_name`, so a
``jax.checkpoint`` policy can keep or drop them by name:

- :data:`INPUT_RESIDUAL` (``"jaxnorm_input"``): the normalized array, ``x`` of the plain ops or
  ``h = x + alpha * residual`` of the fused ops.
- :data:`STATS_RESIDUAL` (``"jaxnorm_stats"``): the compute-dtype row statistics, ``rstd``
  (RMSNorm) or the pivot, its offset and ``rstd`` (LayerNorm).
- :data:`OUTPUT_RESIDUAL` (``"jaxnorm_output"``): the output ``y``, which the plain ops keep in
  place of ``x`` with ``memory_efficient=True`` (with ``rstd`` as :data:`STATS_RESIDUAL`).

Example::

  policy = jax.checkpoint_policies.save_only_these_names(jaxnorm.INPUT_RESIDUAL,
                                                         jaxnorm.STATS_RESIDUAL)
  block = jax.checkpoint(block, policy=policy)

The names are part of the public API and stable.
"""

from __future__ import annotations

from jax.ad_checkpoint import checkpoint_name

INPUT_RESIDUAL = "jaxnorm_input"
STATS_RESIDUAL = "jaxnorm_stats"
OUTPUT_RESIDUAL = "jaxnorm_output"

__all__ = ["INPUT_RESIDUAL", "OUTPUT_RESIDUAL", "STATS_RESIDUAL", "name_residuals"]


def name_residuals(x, stats, name=INPUT_RESIDUAL):
  """``(x, stats)`` tagged with ``name`` (default :data:`INPUT_RESIDUAL`) and
  :data:`STATS_RESIDUAL` (None kept)."""
  x = checkpoint_name(x, name)
  stats = tuple(None if a is None else checkpoint_name(a, STATS_RESIDUAL) for a in stats)
  return x, stats
