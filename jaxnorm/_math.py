r"""The formulas every implementation shares: the normalizer ``rstd`` and the variance-path factor.

One home for the two rules that the XLA path (:mod:`jaxnorm.backends.xla.formulas`), the Pallas
kernels (:mod:`jaxnorm.backends.triton`) and the autodiff reference (:mod:`jaxnorm.reference`) must
agree on. Plain ``jax.numpy``/``lax`` on arrays, so they trace inside a Pallas kernel as well as in
XLA.

.. math::

   r = (v + \epsilon)^{-1/2} \ \text{("inside")}, \qquad
   r = (\sqrt v + \epsilon)^{-1} \ \text{("outside")},

   c = 1 \ \text{("inside")}, \qquad
   c = \frac{1}{r \sqrt v} = \frac{1}{1 - \epsilon r} \ \text{("outside")}.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

__all__ = ["past_range_guard", "rstd", "variance_path_factor", "variance_path_factor_of_std"]


def rstd(var, epsilon: float, outside: bool, guard: bool = True):
  r"""The reciprocal standard deviation of a row: ``rsqrt(var + eps)`` or ``1/(sqrt(var) + eps)``.

  Args:
    var: the row variance (LayerNorm) or mean square (RMSNorm), any shape.
    epsilon: Python float >= 0.
    outside: ``epsilon_placement == "outside"``: epsilon added to the standard deviation, not to
      the variance.
    guard: apply :func:`past_range_guard` (False: ``r`` is 0 past the float range, as in Flax
      and the published formulas; only the XLA backend's undifferentiated forward on many rows
      asks for that, :func:`jaxnorm.backends.xla.formulas.forward_only`).

  Returns:
    :math:`r`, the same shape and dtype as ``var``; NaN where ``var`` is infinite (a row past
    the float range, whose statistic overflowed: ``r`` would be 0 and the row's output finite
    zeros, see ``docs/derivations.md``, "Where the float range ends"), or NaN itself.
  """
  r = 1.0 / (jnp.sqrt(var) + epsilon) if outside else lax.rsqrt(var + epsilon)
  return past_range_guard(r) if guard else r


def past_range_guard(r):
  """``r`` where it is positive, NaN where it is 0 (or NaN).

  ``r`` from :func:`rstd` is 0 exactly where ``var + eps`` (or ``sqrt(var) + eps``) is infinite:
  every finite ``var`` gives at least ``rsqrt(max)``. Without the guard such a row would come
  out as finite zeros (LayerNorm: its bias) with ``dx = 0``.
  """
  return jnp.where(r > 0, r, jnp.nan)


def variance_path_factor(rstd, epsilon: float, outside: bool):
  r"""``c`` in the backward's variance-path term, or None for "inside" (where it is 1).

  "inside": :math:`dr/dv = -r^3/2`, so c = 1. "outside": :math:`dr/dv = -r^2/(2\sqrt v)`, which
  is c = :math:`1/(r\sqrt v) = 1/(1 - \epsilon r)` times the "inside" form. On a zero-variance
  row (``1 - eps*r == 0``) the whole term is zero in the limit, so c is set to 0 there (with the
  double-``where`` that keeps second derivatives finite).

  Args:
    rstd: :math:`r` from :func:`rstd`.
    epsilon: the same epsilon.
    outside: ``epsilon_placement == "outside"``.

  Returns:
    ``c`` with the shape of ``rstd``, or None when ``outside`` is False.
  """
  if not outside:
    return None
  denom = 1.0 - epsilon * rstd
  ok = denom > 0
  return jnp.where(ok, 1.0 / jnp.where(ok, denom, 1.0), 0.0)


def variance_path_factor_of_std(std, epsilon: float):
  r"""The "outside" ``c`` from the standard deviation itself: :math:`1 + \epsilon/\sqrt v`.

  The same value as :func:`variance_path_factor` (:math:`1/(1 - \epsilon r) = (\sqrt v +
  \epsilon)/\sqrt v`), without its cancellation: where :math:`\sqrt v \ll \epsilon`,
  :math:`\epsilon r` rounds to within an ulp of 1 and ``1 - eps*r`` keeps few digits (1.2% at
  :math:`\sqrt v/\epsilon = 5\cdot10^{-6}` in float32), and its derivative twice that. For the
  second-order path, which recomputes the statistics from ``x`` and so has :math:`v`
  (:func:`jaxnorm.ops.norm.rules._wide_backward`). 0 on a zero-variance row, as there.

  Args:
    std: :math:`\sqrt v`, the row standard deviation (LayerNorm) or root mean square (RMSNorm).
    epsilon: the epsilon added outside the square root.

  Returns:
    ``c`` with the shape of ``std``.
  """
  ok = std > 0
  return jnp.where(ok, 1.0 + epsilon / jnp.where(ok, std, 1.0), 0.0)
