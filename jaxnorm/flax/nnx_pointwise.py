"""The Flax NNX layers of the pointwise ops (``jaxnorm.nnx.DyT``, ``jaxnorm.nnx.Derf``, and one
for any pointwise op of :data:`jaxnorm.OPS`), built from the op's entry by :data:`FACTORY`,
and the NNX parameter helpers every layer of :mod:`jaxnorm.nnx` shares.

Private: the classes' public home is :mod:`jaxnorm.nnx`, which exports one per pointwise op of the
table (:func:`layers`). Each is a subclass of the family's layer, named by the entry's ``layer``,
with the entry's docstring; it keeps the op's name and looks the op up in the table when built
and when called.
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
from jaxnorm.flax.layer_factory import LayerFactory
from jaxnorm.ops.table import OPS, POINTWISE_FAMILY

__all__ = ["FACTORY", "param", "value"]


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
  """The constructor and call of every pointwise layer (:data:`FACTORY`)."""

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
    v.check_out_dtype("dtype", dtype)
    v.check_out_dtype("param_dtype", param_dtype)
    v.check_bool("use_bias", use_bias)
    v.check_bool("use_scale", use_scale)
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


_DEFAULT_DOC = """{layer}: the Flax NNX layer of :func:`jaxnorm.{name}` (a pointwise op of
  :data:`jaxnorm.OPS`), a normalization-free drop-in for a norm layer: a learned scalar ``alpha``
  (and ``shift``, where the op has one), ``scale`` and ``bias`` per feature along
  ``feature_axes``; the constructor and call of :class:`jaxnorm.nnx.DyT`.
  """

FACTORY = LayerFactory(_Pointwise, "jaxnorm.nnx", POINTWISE_FAMILY, 0, _DEFAULT_DOC)
"""Builds the layer of each pointwise op of :data:`jaxnorm.OPS` (exported by
:mod:`jaxnorm.nnx`)."""
