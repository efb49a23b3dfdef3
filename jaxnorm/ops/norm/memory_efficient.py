r"""Internal API: the memory-saving backward of the norm ops (option ``memory_efficient``).

NVIDIA Apex's ``memory_efficient=True``: reverse mode keeps the output ``y`` and ``rstd``
instead of the input ``x``, and the backward recovers

.. math:: \hat x = (y - \beta) / \gamma

(derived in ``docs/derivations.md``, "memory_efficient=True"). The derived backward and tangent
are not written again: they run on a stand-in ``x' = \hat x / r`` with pivot 0 and no offset, for
which ``centered`` gives ``x'`` and ``x_hat`` gives :math:`\hat x`. The differentiation layer
(:mod:`jaxnorm.ops.norm.rules`) asks :func:`kept` what to give its tangent primitive, and the
primitive's formula and transpose call :func:`recovered`, so partial evaluation saves ``y``, the
parameters and ``rstd`` (``x'`` is computed in the backward, never saved).

Where a :math:`\gamma_i` is 0, ``y_i = \beta_i`` carries nothing of :math:`\hat x_i`.
:func:`jaxnorm._concrete_checks.check_invertible_scale` raises where the scale's value is concrete
(an eager call, differentiated or not: the JVP rule checks its concrete primal). Where it is
traced, the backward divides by a safe :math:`\gamma` (1 where :math:`\gamma_i = 0`), which
leaves every other feature's ``dx`` exact (:math:`g_i = \gamma_i\,dy_i = 0` takes feature
``i`` out of the row means), and :func:`lost` puts NaN back in the two cotangents that need
:math:`\hat x_i`: column ``i`` of ``dx`` and ``dscale_i``. The tangent (forward mode) needs
:math:`\hat x_i` in every row mean, so it divides by :math:`\gamma` unmasked: NaN rows; second
order (the backward's derivative) is NaN throughout (:func:`_first_order_only`).

Away from 0 the recovery costs precision: ``y``'s rounding error, about ``u (|gamma x_hat| +
|beta|)``, divided by :math:`\gamma` is ``u (|x_hat| + |beta / gamma|)`` on :math:`\hat x`
(``u`` the unit roundoff of ``y``'s dtype). :func:`warn_imprecise` warns where the scale and bias
are concrete and ``max_j |beta_j| / |gamma_j|`` exceeds :func:`max_ratio` of ``y``'s dtype
(measured in ``docs/perf-notes.md``, "memory_efficient precision").
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import _xla_rows as _rows
from jaxnorm._norm_config import NormConfig

__all__ = ["kept", "lost", "max_ratio", "recovered", "warn_imprecise"]


def kept(cfg: NormConfig, x, y, bias, stats) -> dict:
  """The residual operands the plain op's tangent primitive takes (the rule factory tags them
  for remat policies, :data:`jaxnorm.ops.norm.rules.NORM`'s ``remat_names``).

  Default: ``x`` and the op's statistics ``(shift, delta, rstd)``. With ``memory_efficient``:
  ``y``, ``bias`` and ``rstd`` (the scale and the mask are given either way); the factory then
  returns the tagged ``y`` as the output too (``output_residual``), so that a consumer that
  keeps ``y`` (a matmul's weight gradient) keeps the same array rather than a second residual.
  """
  if not cfg.option("memory_efficient"):
    return dict(x=x, shift=stats[0], delta=stats[1], rstd=stats[2])
  return dict(y=y, bias=bias, rstd=stats[2])


def recovered(cfg: NormConfig, named: dict, *, safe: bool = False) -> dict:
  """``named`` operands with ``x``, ``shift`` and ``delta`` recovered from ``y`` where the call
  kept ``y`` (``named["x"]`` None); otherwise ``named`` itself.

  ``x = (y - bias) / gamma / rstd`` in the compute dtype (``rstd``'s), the pivot 0 (LayerNorm;
  RMSNorm has none) and no offset: the backward and the tangent then see :math:`\\hat x`.
  ``safe``: divide by 1 where :math:`\\gamma_i = 0` (the backward, which then masks with
  :func:`lost`); otherwise by :math:`\\gamma` itself (NaN there).
  """
  if named["x"] is not None:
    return named
  y, rstd = named["y"], named["rstd"]
  ct = rstd.dtype
  xhat = y.astype(ct)
  if named["bias"] is not None:
    xhat = xhat - _rows.as_row(named["bias"], y.ndim, ct)
  g = _rows.gamma(cfg, named["scale"], y.ndim, ct)
  if g is not None:
    g = g.astype(ct)
    xhat = xhat / (jnp.where(g == 0, jnp.ones_like(g), g) if safe else g)
  shift = jnp.zeros_like(rstd) if cfg.op.mean_path else None
  return {**named, "x": xhat / rstd, "shift": shift, "delta": None}


def max_ratio(dtype) -> float:
  r"""The largest ``max_j |beta_j| / |gamma_j|`` at which ``memory_efficient=True`` keeps at
  least half of the significand bits of ``y``'s ``dtype`` in the recovered :math:`\hat x`:
  ``2 ** (p // 2)`` for ``p`` significand bits (float32 4096, float16 32, bfloat16 16)."""
  return float(2 ** ((jnp.finfo(dtype).nmant + 1) // 2))


def warn_imprecise(scale, bias, *, zero_centered_scale: bool, shapes, out_dtype) -> None:
  r"""A ``RuntimeWarning`` where ``memory_efficient=True`` recovers :math:`\hat x` from ``y``
  (stored in ``out_dtype``) with fewer than half of its significand bits: ``scale`` and ``bias``
  concrete and ``max_j |beta_j| / |gamma_j| > max_ratio(out_dtype)``.

  ``shapes``: ``(scale_shape, bias_shape)``, each ``heads + (d,)`` (the checked parameters'
  per-head axes and normalized size; they broadcast against each other). Nothing where either
  is None or traced (under ``jit`` the docs carry the rule), or where a :math:`\gamma_j` is 0
  (that is :func:`jaxnorm._concrete_checks.check_invertible_scale`'s case).
  """
  if scale is None or bias is None:
    return
  try:
    gamma = np.asarray(scale, np.float64).reshape(shapes[0])
    beta = np.asarray(bias, np.float64).reshape(shapes[1])
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return  # traced: not checkable here
  gamma = np.abs(gamma + (1.0 if zero_centered_scale else 0.0))
  gamma, beta = np.broadcast_arrays(gamma, np.abs(beta))
  nonzero = gamma > 0
  if not nonzero.any():
    return
  ratios = np.where(nonzero, beta / np.where(nonzero, gamma, 1.0), 0.0)
  worst = float(ratios.max())
  limit = max_ratio(out_dtype)
  if not worst > limit:  # also False for NaN parameters
    return
  where = np.unravel_index(int(ratios.argmax()), ratios.shape)
  warnings.warn(
      f"memory_efficient=True recovers x_hat = (y - bias) / gamma from y stored in "
      f"{jnp.dtype(out_dtype).name}, and max |bias_j| / |gamma_j| is {worst:.4g} (at index "
      f"{tuple(int(i) for i in where)} of the parameters), above {limit:g} for "
      f"{jnp.dtype(out_dtype).name}: the recovered x_hat, and dx/dscale with it, keep fewer "
      f"than half of y's significand bits (docs/perf-notes.md, 'memory_efficient precision'). "
      f"Use memory_efficient=False, or a wider dtype= for y.", RuntimeWarning, stacklevel=4)


def lost(cfg: NormConfig, named: dict, dx, dscale):
  r"""``(dx, dscale)`` with NaN where :math:`\gamma_i = 0` under ``memory_efficient``: column
  ``i`` of ``dx`` and entry ``i`` of ``dscale`` (the only cotangents that read
  :math:`\hat x_i`, which ``y`` does not carry there). Unchanged where the call kept ``x``.

  ``named``: the operands as given to the backward (before :func:`recovered`); ``dscale`` in
  the scale's shape, or None.
  """
  if named["x"] is not None or named["scale"] is None:
    return dx, dscale
  g = _rows.gamma(cfg, named["scale"], named["scale"].ndim, named["rstd"].dtype)
  # A factor per feature, NaN where gamma is 0 and 1 elsewhere (exact): XLA fuses the product
  # into the backward's output, where a select costs a pass over dx (docs/perf-notes.md).
  col = jnp.where(g == 0, jnp.nan, 1.0)             # the scale's shape
  if dx is not None:
    dx = dx * _rows.as_row(col, dx.ndim, dx.dtype)
  if dscale is not None:
    dscale = dscale * col.astype(dscale.dtype)
  return _first_order_only(jnp.any(g == 0), dx, dscale)


@jax.custom_jvp
def _first_order_only(lost_any, *cotangents):
  r"""The cotangents unchanged; their tangents (second order) NaN where ``lost_any``.

  The second order of the backward recomputes the row statistics from the recovered ``x``,
  whose feature ``i`` (:math:`\gamma_i = 0`) is not :math:`\hat x_i`: every second-order
  value would be silently wrong, so all are NaN instead. No operation in first order.
  """
  del lost_any
  return cotangents


@_first_order_only.defjvp
def _first_order_only_jvp(primals, tangents):
  lost_any, *cts = primals
  poison = jnp.where(lost_any, jnp.nan, 1.0)
  return tuple(cts), tuple(None if c is None else t * poison.astype(t.dtype)
                           for c, t in zip(cts, tangents[1:]))
