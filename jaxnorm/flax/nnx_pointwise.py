"""The Flax NNX pointwise layers of :mod:`jaxnorm.nnx` (:class:`DyT`, :class:`Derf`) and the NNX
parameter helpers every layer of :mod:`jaxnorm.nnx` shares.

Private: the public names are ``jaxnorm.nnx.DyT`` and ``jaxnorm.nnx.Derf``, which
:mod:`jaxnorm.nnx` re-exports (this module holds them to keep that one under the size limit,
``tests/jaxnorm/test_layout.py``).
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import rnglib
from flax.nnx.nn import dtypes, initializers
from flax.typing import Axes, Dtype, Initializer, PromoteDtypeFn

from jaxnorm.flax import common as common
from jaxnorm import _validation as v
from jaxnorm.ops.table import OPS

__all__ = ["Derf", "DyT", "param", "value"]


def value(param: tp.Any) -> tp.Any:
  """The array held by an ``nnx.Param`` (``None`` for an absent parameter)."""
  return None if param is None else param[...]


def param(rngs: nnx.Rngs, use: bool, init: tp.Any, shape: tuple[int, ...], dtype: tp.Any,
           metadata: tp.Mapping[str, tp.Any]) -> tp.Any:
  """A learned parameter as Flax creates it (drawing a key only when it is used), or None."""
  if not use:
    return nnx.data(None)
  return nnx.Param(init(rngs.params(), shape, dtype), **metadata)



class _Pointwise(nnx.Module):
  """The shared constructor and call of :class:`DyT` and :class:`Derf`."""

  _op_name = ""

  def __init__(self, num_features: int, *, alpha_init_value: float = 0.5,
               shift_init_value: float = 0.0, dtype: tp.Optional[Dtype] = None,
               param_dtype: Dtype = jnp.float32, use_bias: bool = True, use_scale: bool = True,
               bias_init: Initializer = initializers.zeros_init(),
               scale_init: Initializer = initializers.ones_init(), feature_axes: Axes = -1,
               promote_dtype: PromoteDtypeFn = dtypes.promote_dtype, rngs: rnglib.Rngs):
    name = type(self).__name__
    num_features = common.check_num_features_arg(name, num_features)
    alpha0 = v.check_finite_real("alpha_init_value", alpha_init_value)
    shift0 = v.check_finite_real("shift_init_value", shift_init_value)
    self.alpha = nnx.Param(jnp.full((), alpha0, param_dtype))
    has_shift = "shift" in OPS[self._op_name].params  # the op's declared parameters
    self.shift = nnx.Param(jnp.full((), shift0, param_dtype)) if has_shift else nnx.data(None)
    shape = (num_features,)
    self.scale = param(rngs, use_scale, scale_init, shape, param_dtype, {})
    self.bias = param(rngs, use_bias, bias_init, shape, param_dtype, {})
    self.num_features = num_features
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.feature_axes = feature_axes
    self.promote_dtype = promote_dtype

  def __call__(self, x: jax.Array, *, residual: tp.Optional[jax.Array] = None,
               residual_scale: float = 1.0):
    r"""The op on ``x``, or on ``h = x + residual_scale * residual`` (then ``(y, h)``).

    Args:
      x: the input, with ``num_features`` features along ``feature_axes``.
      residual: optional array of the shape of ``x``, the residual stream; the add is fused
        by XLA into the same elementwise loop, and the layer returns ``(y, h)``.
      residual_scale: a Python float multiplying ``residual``.

    Returns:
      ``y`` (or ``(y, h)``), in ``dtype``, else the promoted dtype of the input and the
      parameters (Flax's rule).
    """
    if not hasattr(x, "shape"):
      x = jnp.asarray(x)
    v.check_layer_input("x", x)
    alpha, shift, scale, bias = (value(p) for p in (self.alpha, self.shift, self.scale,
                                                     self.bias))
    h = x if residual is None else common.residual_input(x, residual)
    h, alpha, shift, scale, bias = self.promote_dtype((h, alpha, shift, scale, bias),
                                                      dtype=self.dtype)
    out_dtype = common.output_dtype(h, alpha, shift, scale, bias, dtype=self.dtype)
    if residual is None:
      x = h
    return common.pointwise(self._op_name, x, alpha, shift, scale, bias,
                            feature_axes=self.feature_axes, dtype=out_dtype,
                            num_features=self.num_features, module=type(self).__name__,
                            residual=residual, residual_scale=residual_scale)


class DyT(_Pointwise):
  r"""Dynamic Tanh (Zhu et al., CVPR 2025), a normalization-free drop-in for a norm layer.

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

  _op_name = "dyt"


class Derf(_Pointwise):
  r"""Dynamic erf (Chen et al., arXiv 2512.10938), a normalization-free drop-in for a norm.

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

  _op_name = "derf"
