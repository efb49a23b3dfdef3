r"""DyT, Dynamic Tanh (Zhu et al., "Transformers without Normalization", CVPR 2025): one op of the
pointwise family (:mod:`jaxnorm.ops.pointwise.rules`), in its own module.

Here are its declaration :data:`DYT` (:math:`\varphi = \tanh` and its derivative, no shift), its
public function :func:`dyt`, the diagonal of its Jacobian :func:`dyt_jacobian` and the
docstrings of its layers (:data:`LAYER_DOCS`: :class:`jaxnorm.nnx.DyT`, :class:`jaxnorm.linen.DyT`,
built from its entry of :data:`jaxnorm.OPS`). Its oracle is :func:`jaxnorm.reference.dyt`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jaxnorm.ops.pointwise import rules

__all__ = ["DYT", "LAYER_DOCS", "dyt", "dyt_jacobian"]


_LOG_4 = math.log(4.0)


def _tanh_slope(u, t):
  """sech^2(u) = q / (1 + q/4)^2 with q = 4 e^{-2|u|} = exp(log 4 - 2|u|): no cancellation
  where tanh(u) rounds to 1, and q, the factor 4 inside the exp, is normal wherever sech^2 is
  (docs/derivations.md, "Pointwise ops")."""
  del t
  q = jnp.exp(_LOG_4 - 2.0 * jnp.abs(u))
  return q / jnp.square(1.0 + 0.25 * q)


DYT = rules.Squash("dyt", jnp.tanh, _tanh_slope, has_shift=False)
"""DyT's declaration: :math:`\\varphi = \\tanh`, no shift."""


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
  return rules.call(DYT, x, alpha, None, scale, bias, dtype=dtype)


def dyt_jacobian(x, alpha, scale=None):
  r"""The diagonal of :func:`dyt`'s Jacobian in ``x``,
  :math:`\alpha\gamma\,(1 - \tanh^2(\alpha x))`, shaped like ``x`` in the compute dtype
  (float32 at least): the Jacobian of a pointwise op is diagonal, so this is all of it."""
  return rules.jacobian(DYT, x, alpha, None, scale)


_NNX_DOC = r"""Dynamic Tanh (Zhu et al., CVPR 2025), a normalization-free drop-in for a norm layer.

  .. math::

     y = \gamma \odot \tanh(\alpha x) + \beta

  with a learned scalar :math:`\alpha` (``alpha``, initialized to ``alpha_init_value``: the
  paper's default 0.5; its LLM guidance, Table 11 of the paper: 1.0 in every layer at width
  1024, and at larger widths a larger value in the attention blocks than elsewhere) and
  :math:`\gamma` (``scale``, ones), :math:`\beta` (``bias``, zeros) per feature along
  ``feature_axes``, as a norm layer's. Backed by :func:`jaxnorm.dyt` (derived backward and
  tangent).

  Example::

    >>> from flax import nnx
    >>> import jax
    >>> from jaxnorm import nnx as jnn
    >>> layer = jnn.DyT(6, rngs=nnx.Rngs(0))
    >>> layer(jax.random.normal(jax.random.key(0), (3, 6))).shape
    (3, 6)

  Args:
    num_features: the number of features: the product of the sizes of ``feature_axes``.
    alpha_init_value: the initial :math:`\alpha` (a finite float).
    shift_init_value: unused by DyT (accepted so that both pointwise layers share one
      signature).
    dtype: the dtype of the result (default: inferred from the input and the parameters).
    param_dtype: the dtype of the parameters (default: float32).
    use_bias: if True, the bias :math:`\beta` is added.
    use_scale: if True, the output is multiplied by :math:`\gamma`.
    bias_init: initializer for the bias, zeros by default.
    scale_init: initializer for the scale, ones by default.
    feature_axes: axes that carry their own :math:`\gamma` and :math:`\beta` (``(-2, -1)``: one
      per head and feature, as for QK-norm).
    promote_dtype: function that promotes the input and parameters to one dtype, as in Flax.
    rngs: the random number generators for the initializers.

  Raises:
    TypeError: a non-int ``num_features`` or a non-number ``alpha_init_value``.
    ValueError: a non-positive ``num_features``; at call time, an input whose feature size is
      not ``num_features``.
  """

_LINEN_DOC = r"""Dynamic Tanh (Zhu et al., CVPR 2025): """ + (
    r""":math:`y = \gamma \odot \tanh(\alpha x) + \beta`.

  The Linen form of :class:`jaxnorm.nnx.DyT` (same parameters: scalar ``alpha``, ``scale`` and
  ``bias`` of shape ``x.shape[feature_axes]``; same initializations), backed by
  :func:`jaxnorm.dyt`.

  Example::

    >>> import jax
    >>> from jaxnorm import linen as jln
    >>> x = jax.random.normal(jax.random.key(0), (3, 6))
    >>> variables = jln.DyT().init(jax.random.key(1), x)
    >>> jax.tree.map(jax.numpy.shape, variables)
    {'params': {'alpha': (), 'bias': (6,), 'scale': (6,)}}

  Attributes:
    alpha_init_value: the initial :math:`\alpha` (0.5, the paper's default).
    shift_init_value: unused by DyT (one field list for both pointwise layers).
    dtype: the dtype of the result (default: inferred from the input and the parameters).
    param_dtype: the dtype of the parameters (default: float32).
    use_bias: if True, the bias :math:`\beta` is added.
    use_scale: if True, the output is multiplied by :math:`\gamma`.
    bias_init: initializer for the bias, zeros by default.
    scale_init: initializer for the scale, ones by default.
    feature_axes: axes that carry their own :math:`\gamma` and :math:`\beta`.
  """)

LAYER_DOCS = (_NNX_DOC, _LINEN_DOC)
"""The docstrings of :class:`jaxnorm.nnx.DyT` and :class:`jaxnorm.linen.DyT`, in that order."""
