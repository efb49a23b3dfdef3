r"""A throwaway pointwise op, defined outside the library as a new op of the family would be in it:
Softsign, :math:`y = \gamma \odot \varphi(\alpha x) + \beta` with
:math:`\varphi(u) = u / (1 + |u|)`.

Its derivative is written from :math:`u`, :math:`\varphi'(u) = 1 / (1 + |u|)^2`. From the value
:math:`t = \varphi(u)` it would be :math:`(1 - |t|)^2`, which cancels where :math:`t` rounds
near :math:`\pm 1` (in float32, 5e-5 off at :math:`|u| = 10^3`, 0 past about :math:`2^{24}`):
the tail check (``tests/jaxnorm/test_pointwise_tails.py``) finds it. This module holds everything
the op has: its declaration, public function, Jacobian, oracle and entry :data:`OP`. It is the
one new file a new pointwise op takes (``docs/adding-an-op.md``);
``tests/jaxnorm/test_throwaway_op.py`` adds it to ``jaxnorm.OPS`` with
``jaxnorm.ops.table.register`` (a library op would name it in the table instead).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm import reference as _reference
from jaxnorm.ops import table
from jaxnorm.ops.pointwise import rules


def _phi(u):
  return u / (1.0 + jnp.abs(u))


def _slope(u, t):
  """1 / (1 + |u|)^2, from u (not (1 - |t|)^2 from the value, which cancels in the tails)."""
  del t
  return 1.0 / jnp.square(1.0 + jnp.abs(u))


SOFTSIGN = rules.Squash("softsign", _phi, _slope, has_shift=False)


def softsign(x, alpha, scale=None, bias=None, *, dtype=None):
  r"""Softsign as a norm replacement: :math:`y = \gamma \odot \alpha x / (1 + |\alpha x|) + \beta`,
  elementwise, with the pointwise family's derived rules, numerics and argument checks
  (:func:`jaxnorm.dyt`'s arguments)."""
  return rules.call(SOFTSIGN, x, alpha, None, scale, bias, dtype=dtype)


def softsign_jacobian(x, alpha, scale=None):
  r"""The diagonal of :func:`softsign`'s Jacobian in ``x``, :math:`\alpha\gamma / (1 + |\alpha
  x|)^2`, shaped like ``x`` in the compute dtype."""
  return rules.jacobian(SOFTSIGN, x, alpha, None, scale)


def reference(x, alpha, scale=None, bias=None, *, dtype=None):
  """The oracle: the family's reference with ``phi`` written again, under autodiff."""
  return _reference.pointwise(lambda u: u / (1.0 + jnp.abs(u)), x, alpha, None, scale, bias,
                              dtype=dtype)


OP = table.Op("softsign", table.POINTWISE_FAMILY, SOFTSIGN, softsign, reference,
              ("alpha", "scale", "bias"), "Softsign", jacobian=softsign_jacobian)
"""Its entry of ``jaxnorm.OPS`` (no layer docstrings: the library writes default ones)."""
