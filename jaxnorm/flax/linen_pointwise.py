"""The Flax Linen layers of the pointwise ops (``jaxnorm.linen.DyT``, ``jaxnorm.linen.Derf``, and
one for any pointwise op of :data:`jaxnorm.OPS`), built from the op's entry by :data:`FACTORY`.

Private: the classes' public home is :mod:`jaxnorm.linen`, which exports one per pointwise op of
the table (``FACTORY.layers()``). Each is a subclass of the family's module, named by the entry's
``layer``, with the entry's Linen docstring; its fields are the family's.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from flax import linen as nn
from flax.typing import Axes, Dtype, Initializer
from jax.nn import initializers

from jaxnorm import _validation as v
from jaxnorm.flax import common as common
from jaxnorm.flax.layer_factory import LayerFactory
from jaxnorm.ops.table import OPS, POINTWISE_FAMILY

__all__ = ["FACTORY"]


class _Pointwise(nn.Module):
  """The fields and call of every pointwise layer (:data:`FACTORY`)."""

  alpha_init_value: float = 0.5
  shift_init_value: float = 0.0
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  use_bias: bool = True
  use_scale: bool = True
  bias_init: Initializer = initializers.zeros
  scale_init: Initializer = initializers.ones
  feature_axes: Axes = -1

  _op_name = ""

  @nn.compact
  def __call__(self, x: Any, *, residual: Any = None, residual_scale: float = 1.0):
    r"""The op on ``x``, or on ``h = x + residual_scale * residual`` (then ``(y, h)``); the
    output dtype is ``dtype``, else ``result_type`` of the input and the parameters."""
    alpha0 = v.check_finite_real("alpha_init_value", self.alpha_init_value)
    shift0 = v.check_finite_real("shift_init_value", self.shift_init_value)
    v.check_out_dtype("dtype", self.dtype)
    v.check_out_dtype("param_dtype", self.param_dtype)
    v.check_bool("use_bias", self.use_bias)
    v.check_bool("use_scale", self.use_scale)
    if not hasattr(x, "dtype"):
      x = jnp.asarray(x)
    v.check_layer_input("x", x)
    h = x if residual is None else common.residual_input(x, residual)
    fshape = list(common.feature_shape(h.shape if residual is None else x.shape,
                                       self.feature_axes))
    alpha = self.param("alpha", lambda _, dt: jnp.full((), alpha0, dt), self.param_dtype)
    shift = (self.param("shift", lambda _, dt: jnp.full((), shift0, dt), self.param_dtype)
             if "shift" in OPS[self._op_name].params else None)
    scale = (self.param("scale", self.scale_init, fshape, self.param_dtype) if self.use_scale
             else None)
    bias = self.param("bias", self.bias_init, fshape, self.param_dtype) if self.use_bias else None
    out_dtype = common.output_dtype(h, alpha, shift, scale, bias, dtype=self.dtype)
    flat = [None if p is None else p.reshape(-1) for p in (scale, bias)]
    return common.pointwise(self._op_name, x, alpha, shift, *flat, feature_axes=self.feature_axes,
                            dtype=out_dtype, num_features=math.prod(fshape),
                            module=type(self).__name__, residual=residual,
                            residual_scale=residual_scale)


_DEFAULT_DOC = """{layer}: the Flax Linen layer of :func:`jaxnorm.{name}` (a pointwise op of
  :data:`jaxnorm.OPS`): the fields, parameters and call of :class:`jaxnorm.linen.DyT` (with a
  scalar ``shift`` where the op has one).
  """

FACTORY = LayerFactory(_Pointwise, "jaxnorm.linen", POINTWISE_FAMILY, 1, _DEFAULT_DOC)
"""Builds the layer of each pointwise op of :data:`jaxnorm.OPS` (exported by
:mod:`jaxnorm.linen`)."""
