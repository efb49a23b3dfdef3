r"""Remat-policy names of the residuals the backward rules save.

The rule factory (:mod:`jaxnorm._rules`) tags the residuals each family declares with
:func:`jax.ad_checkpoint.checkpoint_name`, so a ``jax.checkpoint`` policy can keep or drop them
by name:

- :data:`INPUT_RESIDUAL` (``"jaxnorm_input"``): the inputs, ``x`` of the plain ops (and gated
  RMSNorm's ``z``) or ``h = x + alpha * residual`` of the fused ops.
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

INPUT_RESIDUAL = "jaxnorm_input"
STATS_RESIDUAL = "jaxnorm_stats"
OUTPUT_RESIDUAL = "jaxnorm_output"

__all__ = ["INPUT_RESIDUAL", "OUTPUT_RESIDUAL", "STATS_RESIDUAL"]
