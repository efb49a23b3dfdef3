r"""Explicit per-row Jacobians of LayerNorm and RMSNorm, for analysis, teaching and tests.

For one row, with :math:`r` the reciprocal standard deviation (RMS), :math:`\hat x` the
normalized row, :math:`\gamma` the effective scale, :math:`m` the mask and :math:`n` the number
of masked-in elements (:math:`m \equiv 1, n = d` without a mask):

.. math::

   J^{\mathrm{LN}}_{ij} = \frac{\partial y_i}{\partial x_j}
     = \gamma_i\, r \Big(\delta_{ij} - \frac{m_j}{n} - c\,\frac{m_j\, \hat x_i \hat x_j}{n}\Big),
   \qquad
   J^{\mathrm{RMS}}_{ij} = \gamma_i\, r \Big(\delta_{ij}
      - c\,\frac{m_j\, \hat x_i \hat x_j}{n}\Big),

the three terms being the direct path, the mean path and the variance (RMS) path, with
:math:`c = 1` for epsilon inside the root and :math:`c = 1/(1 - \epsilon r)` outside. The VJP is
:math:`dx = dy^\top J`. These build ``d x d`` matrices per row: use them on small ``d``.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm import _concrete_checks as _cc
from jaxnorm.ops.norm import args as _norm_args
from jaxnorm.backends import table as _backends
from jaxnorm._xla_rows import gamma, variance_path_factor
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM


def _jacobian(x, scale, *, op, epsilon, axis, mask, epsilon_placement, zero_centered_scale):
  cfg, x2, mask2, _ = _norm_args.prepare(
      x, scale, None, op=op, epsilon=epsilon, axis=axis, mask=mask,
      epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
      axis_name=None, axis_index_groups=None, dtype=None, impl="xla")
  (scale,) = _norm_args.flat_params(x, x2, scale)
  _cc.check_row_range(f"{op.name}_jacobian", x2, cfg.epsilon)  # as the ops (rules._check)
  shift, delta, rstd = _backends.formula(cfg, "statistics")(x2, mask2)
  ct = rstd.dtype
  xh = _backends.formula(cfg, "x_hat")(x2.astype(ct), shift, delta, rstd)  # (..., d)
  d = x2.shape[-1]
  n = jnp.sum(mask2, -1, keepdims=True, dtype=ct) if mask2 is not None else jnp.asarray(d, ct)
  m = jnp.ones_like(xh) if mask2 is None else mask2.astype(ct)  # (..., d)
  col = m / n  # (..., d): the m_j / n factor of column j
  var_path = xh[..., :, None] * (xh * col)[..., None, :]  # (..., d, d)
  c = variance_path_factor(cfg, rstd)
  if c is not None:
    var_path = var_path * c[..., None]
  eye = jnp.eye(d, dtype=ct).reshape((1,) * (x2.ndim - 1) + (d, d))
  jac = eye - var_path
  if cfg.op.mean_path:  # the mean path
    jac = jac - col[..., None, :]
  jac = rstd[..., None] * jac
  gam = gamma(cfg, scale, x2.ndim, x2.dtype)
  if gam is not None:
    jac = jac * gam[..., :, None]
  return jac


def layer_norm_jacobian(x, scale=None, *, epsilon=1e-6, axis=-1, mask=None,
                        epsilon_placement="inside", zero_centered_scale=False):
  r"""Per-row Jacobian :math:`J_{ij} = \partial y_i / \partial x_j` of :func:`jaxnorm.layer_norm`.

  .. math::

     J_{ij} = \gamma_i\, r \Big(\delta_{ij} - \frac1d - \frac{\hat x_i \hat x_j}{d}\Big)

  (see the module docstring for the masked and "outside" forms). The bias does not enter J.

  Args:
    x: ``(..., *normalized_shape)`` floating array.
    scale: optional ``normalized_shape`` array.
    epsilon, axis, mask, epsilon_placement, zero_centered_scale: as :func:`jaxnorm.layer_norm`.

  Returns:
    ``(..., d, d)`` array in the compute dtype (float32, or float64 for float64 inputs), with
    ``d`` the product of the normalized axes and ``...`` the leading axes of ``x``.

  Raises:
    TypeError, ValueError: as :func:`jaxnorm.layer_norm` (a concrete row past the float range
      included).
  """
  return _jacobian(x, scale, op=LAYER_NORM, epsilon=epsilon, axis=axis, mask=mask,
                   epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale)


def rms_norm_jacobian(x, scale=None, *, epsilon=1e-6, axis=-1, mask=None,
                      epsilon_placement="inside", zero_centered_scale=False):
  r"""Per-row Jacobian :math:`J_{ij} = \partial y_i / \partial x_j` of :func:`jaxnorm.rms_norm`.

  .. math::

     J_{ij} = \gamma_i\, r \Big(\delta_{ij} - \frac{\hat x_i \hat x_j}{d}\Big), \qquad
     \hat x = x\, r

  (see the module docstring for the masked and "outside" forms).

  Args:
    x: ``(..., *normalized_shape)`` floating array.
    scale: optional ``normalized_shape`` array.
    epsilon, axis, mask, epsilon_placement, zero_centered_scale: as :func:`jaxnorm.rms_norm`.

  Returns:
    ``(..., d, d)`` array in the compute dtype.

  Raises:
    TypeError, ValueError: as :func:`jaxnorm.rms_norm`.
  """
  return _jacobian(x, scale, op=RMS_NORM, epsilon=epsilon, axis=axis, mask=mask,
                   epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale)
