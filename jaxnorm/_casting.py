r"""Casting modes: the order in which a norm's affine stage rounds (``casting=``).

Every mode computes the statistics and :math:`\hat x = (x - \mu)\,r` in the compute dtype
:math:`C` = ``promote_types(x.dtype, float32)``; they differ in where the affine stage rounds.
With :math:`A` the dtype :math:`\hat x` is rounded to, :math:`G` the dtype the multiplier
:math:`\gamma` (``scale`` or ``1 + scale``) is formed in, :math:`P` = ``promote(A, G)`` the
dtype of the product and :math:`Q` = ``promote(P, bias.dtype)`` that of the bias add:

.. math::

   u = \mathrm{rd}_A(\hat x), \qquad z = \mathrm{rd}_P(u\,\gamma), \qquad
   y = \mathrm{rd}_O\big(\mathrm{rd}_Q(z + \beta)\big),

(in the float32 mode, where nothing rounds before the end, the product is formed as
:math:`(x - \mu)\,(r\,\gamma)`: :meth:`CastPlan.normalized_affine`),

=========  ==========================  =====================  ========================
mode       A (x_hat rounded to)        G (gamma formed in)    matches
=========  ==========================  =====================  ========================
float32    C (no rounding)             C                      one rounding, at the end
llama      ``x.dtype``                 ``scale.dtype``        HF ``LlamaRMSNorm``
t5         ``scale.dtype``             ``scale.dtype``        HF ``T5LayerNorm``
=========  ==========================  =====================  ========================

(``t5`` without a ``scale`` has nothing to take a dtype from and is ``float32``.) Rounding is
differentiated straight through (identity), and the backward rounds the *cotangent* where the
forward rounded the value (the transpose of each cast): ``dz = rd_Q(dy)`` then
``rd_P(dz)``, ``du = rd_A(rd_P(dz * gamma))``; see ``docs/derivations.md``, "Casting modes".

Plain ``jax.numpy`` on arrays: the same helpers run in the XLA path, in the Pallas kernels and
in the autodiff reference, so the three round at the same places.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

CASTINGS = ("float32", "llama", "t5")

__all__ = ["CASTINGS", "CastPlan", "cast_plan"]


@dataclasses.dataclass(frozen=True)
class CastPlan:
  """The dtypes of one call's affine stage (hashable; part of the static op configuration)."""

  compute: Any  # C: statistics, x_hat and every row/column sum.
  xhat: Any  # A: x_hat is rounded to it before the multiply.
  gamma: Any  # G: gamma = scale or 1 + scale is formed (and rounded) in it.
  product: Any  # P = promote(A, G): u * gamma is computed in it.
  affine: Any  # Q = promote(P, bias): the bias add (y before the cast to its dtype).
  # The "float32" mode: y = x_c * (r * gamma) + beta (Flax's order). False for "llama" and
  # "t5", which follow their published order, x_hat * gamma, even where nothing rounds.
  factors_first: bool = False

  def gamma_of(self, scale, zero_centered_scale: bool):
    """``scale`` or ``1 + scale`` formed in G, returned in C (None stays None)."""
    if scale is None:
      return None
    # Every operation in C, every rounding an explicit pair of casts: XLA may skip the rounding
    # of a half-precision operation it computes in float32 ("excess precision"), never that of
    # an explicit convert.
    s = _rd(scale.astype(self.compute), self.gamma, self.compute)
    return _rd(1.0 + s, self.gamma, self.compute) if zero_centered_scale else s

  def affine_of(self, xhat, gam, bias):
    """``(u, y)``: the rounded x_hat and ``rd_Q(rd_P(u * gamma) + bias)``, both in C.

    ``xhat``, ``gam`` and ``bias`` are in C (bias may be None, gam may be None).
    """
    u = _rd(xhat, self.xhat, self.compute)
    z = u if gam is None else _rd(u * gam, self.product, self.compute)
    if bias is not None:
      z = _rd(z + bias.astype(self.compute), self.affine, self.compute)
    return u, z

  def normalized_affine(self, centered, rstd, gam, bias):
    r"""The forward's output map from the centred row ``x_c`` (``x`` for RMSNorm) and ``r``, in C.

    "llama" and "t5": :meth:`affine_of` of :math:`\hat x = x_c r` (it rounds :math:`\hat x`
    first, and follows the published order even where no stage rounds). The float32 mode
    (:attr:`factors_first`): the per-row and the per-feature factor multiplied first,
    :math:`y = x_c\,(r\,\gamma) + \beta`, Flax's order (jitted, RMSNorm compiles to Flax's
    ``RMSNorm`` program: bit for bit), one float32 rounding away from
    :math:`(x_c r)\,\gamma`; on XLA:CPU it compiles to Flax's loop (its cost against
    :math:`(x_c r)\,\gamma`: ``docs/perf-notes.md``).
    """
    if gam is None or not self.factors_first:
      return self.affine_of(centered * rstd, gam, bias)[1]
    y = centered * (rstd * gam)
    return y if bias is None else y + bias.astype(self.compute)

  def cotangents(self, dy, gam):
    """``(dq, dz, g)``, all in C: the cotangents of the stages of :meth:`affine_of`.

    ``dq = rd_Q(dy)`` is ``dbias``'s summand, ``dz = rd_P(dq)`` multiplies ``u`` in ``dscale``,
    and ``g = rd_A(rd_P(dz * gamma))`` is the cotangent of x_hat (the ``g`` of the
    normalization backward; ``dz`` itself without a scale).
    """
    dq = _rd(dy.astype(self.compute), self.affine, self.compute)
    dz = _rd(dq, self.product, self.compute)
    g = dz if gam is None else _rd(_rd(dz * gam, self.product, self.compute), self.xhat,
                                   self.compute)
    return dq, dz, g


def _rd(a, dtype, compute):
  """``a`` rounded to ``dtype`` and back to ``compute`` (a no-op when they are equal)."""
  if np.dtype(dtype) == np.dtype(compute):
    return a
  return a.astype(dtype).astype(compute)


def cast_plan(casting: str, x_dtype, scale_dtype=None, bias_dtype=None) -> CastPlan:
  """The :class:`CastPlan` of ``casting`` for these dtypes (``casting`` already validated)."""
  c = jnp.dtype(jnp.promote_types(x_dtype, jnp.float32))
  if casting == "float32" or (casting == "t5" and scale_dtype is None):
    return CastPlan(c, c, c, c, c, factors_first=True)
  a = jnp.dtype(x_dtype) if casting == "llama" else jnp.dtype(scale_dtype)
  g = a if scale_dtype is None else jnp.dtype(scale_dtype)
  p = jnp.dtype(jnp.promote_types(a, g))
  q = p if bias_dtype is None else jnp.dtype(jnp.promote_types(p, bias_dtype))
  return CastPlan(c, a, g, p, q)
