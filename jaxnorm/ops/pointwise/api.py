"""Public pointwise ops: DyT and Derf, normalization-free replacements for a norm layer.

Both are the family of :mod:`jaxnorm.ops.pointwise.rules`, with its derived backward and tangent;
the derivation is in ``docs/derivations.md`` ("Pointwise ops: DyT and Derf").
"""

from __future__ import annotations

from jaxnorm.ops.pointwise import rules as _pointwise


def dyt(x, alpha, scale=None, bias=None, *, dtype=None):
  r"""Dynamic Tanh (Zhu et al., "Transformers without Normalization", CVPR 2025).

  .. math::

     y = \gamma \odot \tanh(\alpha x) + \beta

  elementwise, with hand-derived backward and tangent rules (``jax.grad`` runs the derived
  VJP, ``jax.jvp`` the derived tangent; both differentiate again to any order). The arithmetic
  runs in float32 for bfloat16/float16 inputs (float64 stays float64), rounded once to
  ``dtype``.

  Args:
    x: floating array of any shape.
    alpha: floating array, :math:`\alpha`: a scalar (``()``/``(1,)``, the paper's learnable
      scalar), or one value per channel or per head and channel; any shape that broadcasts
      against ``x`` from its trailing axes.
    scale: :math:`\gamma`, the same kind of shape as ``alpha`` (usually ``(d,)``); None for none.
    bias: :math:`\beta`, likewise; None for none.
    dtype: dtype of ``y``; default ``x.dtype``.

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError: ``x`` or a parameter not a floating array (``alpha=None`` included), an 8-bit
      float ``x``; ``dtype`` not floating.
    ValueError: a parameter whose shape does not broadcast against ``x``'s trailing axes.

  Example:
    >>> import jax.numpy as jnp, jaxnorm
    >>> y = jaxnorm.dyt(jnp.array([[0.0, 1.0, -2.0]]), jnp.array(0.5), jnp.ones(3), jnp.zeros(3))
    >>> [round(float(v), 4) for v in y[0]]
    [0.0, 0.4621, -0.7616]
  """
  cfg, alpha, _, scale, bias = _pointwise.prepare(_pointwise.DYT, x, alpha, None, scale, bias,
                                                  dtype=dtype)
  return _pointwise.apply(cfg, x, alpha, None, scale, bias)


def derf(x, alpha, shift, scale=None, bias=None, *, dtype=None):
  r"""Dynamic erf (Chen et al., "Stronger Normalization-Free Transformers", arXiv 2512.10938).

  .. math::

     y = \gamma \odot \operatorname{erf}(\alpha x + s) + \beta

  elementwise, with the standard :math:`\operatorname{erf}(u) = \tfrac{2}{\sqrt\pi}\int_0^u
  e^{-t^2} dt`, and the same derived rules, numerics and shapes as :func:`dyt`.

  Args:
    x: floating array of any shape.
    alpha: :math:`\alpha`, a floating array broadcasting against ``x`` from its trailing axes
      (the paper's learnable scalar: shape ``()``).
    shift: :math:`s`, likewise (the paper's learnable scalar shift); required.
    scale, bias, dtype: :math:`\gamma`, :math:`\beta` and the dtype of ``y``, as in :func:`dyt`.

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError, ValueError: as :func:`dyt`; ``TypeError`` also for ``shift=None``.
  """
  if shift is None:
    raise TypeError("shift must be a floating array (Derf's learned shift s; pass "
                    "jnp.zeros(()) for none), got None.")
  cfg, alpha, shift, scale, bias = _pointwise.prepare(_pointwise.DERF, x, alpha, shift, scale,
                                                      bias, dtype=dtype)
  return _pointwise.apply(cfg, x, alpha, shift, scale, bias)


def dyt_jacobian(x, alpha, scale=None):
  r"""The diagonal of :func:`dyt`'s Jacobian in ``x``,
  :math:`\alpha\gamma\,(1 - \tanh^2(\alpha x))`, shaped like ``x`` in the compute dtype
  (float32 at least): the Jacobian of a pointwise op is diagonal, so this is all of it."""
  cfg, alpha, _, scale, _ = _pointwise.prepare(_pointwise.DYT, x, alpha, None, scale, None)
  return _pointwise.jacobian_diagonal(cfg, x, alpha, None, scale)


def derf_jacobian(x, alpha, shift, scale=None):
  r"""The diagonal of :func:`derf`'s Jacobian in ``x``,
  :math:`\alpha\gamma\,\tfrac{2}{\sqrt\pi}e^{-(\alpha x + s)^2}`, shaped like ``x`` (see
  :func:`dyt_jacobian`)."""
  cfg, alpha, shift, scale, _ = _pointwise.prepare(_pointwise.DERF, x, alpha, shift, scale, None)
  return _pointwise.jacobian_diagonal(cfg, x, alpha, shift, scale)
