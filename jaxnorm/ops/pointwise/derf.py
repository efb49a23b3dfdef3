r"""Derf, Dynamic erf (Chen et al., "Stronger Normalization-Free Transformers", arXiv 2512.10938):
one op of the pointwise family (:mod:`jaxnorm.ops.pointwise.rules`), in its own module.

Here are its declaration :data:`DERF` (:math:`\varphi = \operatorname{erf}` and its derivative,
with a learned shift), its public function :func:`derf`, the diagonal of its Jacobian
:func:`derf_jacobian` and the docstrings of its layers (:data:`LAYER_DOCS`). Its oracle is
:func:`jaxnorm.reference.derf`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from jaxnorm.ops.pointwise import rules

__all__ = ["DERF", "LAYER_DOCS", "derf", "derf_jacobian"]

_LOG_TWO_OVER_SQRT_PI = math.log(2.0 / math.sqrt(math.pi))


def _erf_slope(u, t):
  """erf'(u) = 2 / sqrt(pi) * exp(-u^2) = exp(log(2 / sqrt(pi)) - u^2): the factor inside the
  exp, so that no subnormal exp(-u^2) is flushed where erf'(u) is normal (docs/derivations.md,
  "Pointwise ops")."""
  del t
  return jnp.exp(_LOG_TWO_OVER_SQRT_PI - jnp.square(u))


DERF = rules.Squash("derf", lax.erf, _erf_slope, has_shift=True)
"""Derf's declaration: :math:`\\varphi = \\operatorname{erf}` with a learned shift."""


def derf(x, alpha, shift, scale=None, bias=None, *, dtype=None):
  r"""Dynamic erf (Chen et al., "Stronger Normalization-Free Transformers", arXiv 2512.10938).

  .. math::

     y = \gamma \odot \operatorname{erf}(\alpha x + s) + \beta

  elementwise, with the standard :math:`\operatorname{erf}(u) = \tfrac{2}{\sqrt\pi}\int_0^u
  e^{-t^2} dt`, and the same derived rules, numerics and shapes as :func:`jaxnorm.dyt`.

  Args:
    x: floating array of any shape.
    alpha: :math:`\alpha`, a floating array broadcasting against ``x`` from its trailing axes
      (the paper's learnable scalar: shape ``()``).
    shift: :math:`s`, likewise (the paper's learnable scalar shift); required.
    scale, bias, dtype: :math:`\gamma`, :math:`\beta` and the dtype of ``y``, as in
      :func:`jaxnorm.dyt`.

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError, ValueError: as :func:`jaxnorm.dyt`; ``TypeError`` also for ``shift=None``.
  """
  if shift is None:
    raise TypeError("shift must be a floating array (Derf's learned shift s; pass "
                    "jnp.zeros(()) for none), got None.")
  return rules.call(DERF, x, alpha, shift, scale, bias, dtype=dtype)


def derf_jacobian(x, alpha, shift, scale=None):
  r"""The diagonal of :func:`derf`'s Jacobian in ``x``,
  :math:`\alpha\gamma\,\tfrac{2}{\sqrt\pi}e^{-(\alpha x + s)^2}`, shaped like ``x`` (see
  :func:`jaxnorm.dyt_jacobian`)."""
  return rules.jacobian(DERF, x, alpha, shift, scale)


_NNX_DOC = r"""Dynamic erf (Chen et al., arXiv 2512.10938), a normalization-free drop-in for a norm.

  .. math::

     y = \gamma \odot \operatorname{erf}(\alpha x + s) + \beta

  with learned scalars :math:`\alpha` (``alpha``, initial 0.5) and :math:`s` (``shift``, initial
  0), the paper's initializations, and :math:`\gamma`, :math:`\beta` per feature as in
  :class:`DyT`, whose arguments it takes (``shift_init_value`` sets :math:`s`). Backed by
  :func:`jaxnorm.derf`.

  Raises:
    TypeError: a non-int ``num_features`` or a non-number initial value.
    ValueError: a non-positive ``num_features``; at call time, an input whose feature size is
      not ``num_features``.
  """

_LINEN_DOC = r"""Dynamic erf (Chen et al., arXiv 2512.10938):
  :math:`y = \gamma \odot \operatorname{erf}(\alpha x + s) + \beta`.

  The Linen form of :class:`jaxnorm.nnx.Derf`: the fields of :class:`DyT`, with a scalar
  ``shift`` parameter initialized to ``shift_init_value`` (0, the paper's), backed by
  :func:`jaxnorm.derf`.
  """

LAYER_DOCS = (_NNX_DOC, _LINEN_DOC)
"""The docstrings of :class:`jaxnorm.nnx.Derf` and :class:`jaxnorm.linen.Derf`, in that order."""
