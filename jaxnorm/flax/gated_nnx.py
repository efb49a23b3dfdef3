"""Internal API: gated RMSNorm's NNX layer, :class:`jaxnorm.nnx.GatedRMSNorm` (re-exported
there), on :func:`jaxnorm.gated_rms_norm`: ``layer(x, z)``, one learned scale per feature of the
last axis (ones by default, as Mamba2's ``RMSNormGated``), computed in ``dtype`` (default:
inferred from ``x``, ``z`` and the scale, as Flax's norms do).
"""

from __future__ import annotations

import typing as tp
from types import MappingProxyType

import jax
import jax.numpy as jnp
from flax import nnx
from flax.linen import dtypes
from flax.nnx.nn import initializers

from jaxnorm import _validation as v
from jaxnorm.backends import table as _backends
from jaxnorm.ops.gated.rules import check_layer_features, check_options, gated_rms_norm
from jaxnorm.ops.gated.rules import layer_options

__all__ = ["GatedRMSNorm"]


@_backends.documented
class GatedRMSNorm(nnx.Module):
  r"""Gated RMSNorm (Mamba2's ``RMSNormGated``, Qwen3-Next's gated norm) as an NNX layer.

  ``layer(x, z)`` is :func:`jaxnorm.gated_rms_norm` ``(x, z, scale)`` with this layer's options:
  ``y = scale * rms_norm(x) * silu(z)`` (``norm_before_gate=True``) or
  ``scale * rms_norm(x * silu(z))`` (False), each group of ``group_size`` features normalized
  on its own.

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> from jaxnorm import nnx as jnn
    >>> layer = jnn.GatedRMSNorm(8, group_size=4, rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((2, 8)), jnp.ones((2, 8))).shape
    (2, 8)

  Args:
    num_features: the size of the last axis of ``x`` and ``z``.
    epsilon: added to each group's mean square.
    group_size: features per normalized group (a divisor of ``num_features``; Mamba2's
      ``d // ngroups``); None: the whole row.
    norm_before_gate: normalize then gate (True) or gate then normalize (False).
    casting: ``"float32"``, ``"llama"`` or ``"t5"``: where the affine stage rounds
      (:func:`jaxnorm.gated_rms_norm`; "llama" is Qwen3-Next's order).
    dtype: the dtype of the result (default: inferred from the inputs and the scale).
    param_dtype: the scale's dtype.
    use_scale: learn a scale (``self.scale``, ``(num_features,)``), else None.
    scale_init: the scale's initializer (ones).
    rngs: the random number generators for the initializer.
    scale_metadata: metadata for the scale ``nnx.Param``.
    impl: IMPL_CHOICES.
    backend_config: the config of the backend ``impl`` runs, or None (a
      :class:`jaxnorm.PallasConfig` for the kernels; :func:`jaxnorm.gated_rms_norm`).
    pallas: the documented alias of ``backend_config``.

  Raises:
    TypeError, ValueError: a bad option (naming it); at call time, inputs whose last axis is
      not ``num_features``, or a gate not shaped like ``x``.
  """

  def __init__(self, num_features: int, *, epsilon: float = 1e-6,
               group_size: int | None = None, norm_before_gate: bool = True,
               casting: str = "float32", dtype: tp.Any = None,
               param_dtype: tp.Any = jnp.float32, use_scale: bool = True,
               scale_init: tp.Any = initializers.ones, rngs: nnx.Rngs,
               scale_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
               impl: str = "auto", backend_config: tp.Any = None, pallas: tp.Any = None):
    self.num_features = v.check_positive_int("num_features", num_features)
    self.epsilon = v.check_epsilon(epsilon)
    # The op's own options (its declaration's), checked once and stored under their names.
    for name, value in check_options("GatedRMSNorm", self.num_features, group_size=group_size,
                                     norm_before_gate=norm_before_gate,
                                     casting=casting).items():
      setattr(self, name, value)
    v.check_out_dtype("dtype", dtype)
    v.check_out_dtype("param_dtype", param_dtype)
    v.check_choice("impl", impl, _backends.IMPLS)  # as the norm layers: when it is built
    _backends.check_config(backend_config, pallas)
    self.dtype, self.param_dtype, self.impl = dtype, param_dtype, impl
    self.backend_config, self.pallas = backend_config, pallas
    self.scale = nnx.data(None)  # drawing a key only when used, as Flax's norms
    if v.check_bool("use_scale", use_scale):
      self.scale = nnx.Param(scale_init(rngs.params(), (self.num_features,), param_dtype),
                             **scale_metadata)

  def __call__(self, x: jax.Array, z: jax.Array) -> jax.Array:
    """``y``, shaped like ``x``."""
    v.check_input("x", x)
    v.check_input("z", z)
    check_layer_features("GatedRMSNorm", x, self.num_features)
    scale = None if self.scale is None else self.scale[...]
    dtype = dtypes.canonicalize_dtype(x, z, scale, dtype=self.dtype)
    return gated_rms_norm(x, z, scale, epsilon=self.epsilon, dtype=dtype, impl=self.impl,
                          backend_config=self.backend_config, pallas=self.pallas,
                          **layer_options(self))
