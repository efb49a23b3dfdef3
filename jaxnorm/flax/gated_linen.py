"""Internal API: gated RMSNorm's Linen module, :class:`jaxnorm.linen.GatedRMSNorm`
(re-exported there), on :func:`jaxnorm.gated_rms_norm`.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import dtypes
from flax.nnx.nn import initializers

from jaxnorm import _validation as v
from jaxnorm.ops.gated.rules import check_options, gated_rms_norm, layer_options

__all__ = ["GatedRMSNorm"]


class GatedRMSNorm(nn.Module):
  """Gated RMSNorm as a Linen module: ``module.apply(variables, x, z)``, the scale a
  ``(d,)`` ``"params"`` entry named ``"scale"``, ``d`` read from ``x``; the options as
  :class:`jaxnorm.nnx.GatedRMSNorm`'s.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from jaxnorm import linen as jln
    >>> m = jln.GatedRMSNorm(group_size=4)
    >>> x = jnp.ones((2, 8))
    >>> m.apply(m.init(jax.random.key(0), x, x), x, x).shape
    (2, 8)
  """

  epsilon: float = 1e-6
  group_size: int | None = None
  norm_before_gate: bool = True
  casting: str = "float32"
  dtype: tp.Any = None
  param_dtype: tp.Any = jnp.float32
  use_scale: bool = True
  scale_init: tp.Any = initializers.ones
  impl: str = "auto"
  backend_config: tp.Any = None
  pallas: tp.Any = None

  @nn.compact
  def __call__(self, x: jax.Array, z: jax.Array) -> jax.Array:
    """``y``, shaped like ``x``."""
    v.check_input("x", x)
    v.check_input("z", z)
    d = int(x.shape[-1]) if x.ndim else 0
    options = check_options("GatedRMSNorm", d, **layer_options(self))
    v.check_out_dtype("dtype", self.dtype)
    v.check_out_dtype("param_dtype", self.param_dtype)  # before the scale is made in it
    scale = None
    if v.check_bool("use_scale", self.use_scale):
      scale = self.param("scale", self.scale_init, (d,), self.param_dtype)
    dtype = dtypes.canonicalize_dtype(x, z, scale, dtype=self.dtype)
    return gated_rms_norm(x, z, scale, epsilon=self.epsilon, dtype=dtype, impl=self.impl,
                          backend_config=self.backend_config, pallas=self.pallas, **options)
