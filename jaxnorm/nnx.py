r"""Flax NNX ``LayerNorm`` and ``RMSNorm`` backed by jaxnorm's ops and their derived rules.

Drop-in replacements for :class:`flax.nnx.LayerNorm` and :class:`flax.nnx.RMSNorm`: the same
constructor (``num_features`` positional, the same keyword-only arguments and defaults), the
same parameters (``scale``, ``bias``: ``nnx.Param`` of shape ``(num_features,)`` and dtype
``param_dtype``, with ``scale_metadata``/``bias_metadata`` passed through), the same output
dtype rules and the same ``reduction_axes``/``feature_axes``/``mask``/``axis_name`` semantics.
Only the gradient path changes: the backward pass is jaxnorm's hand-derived rule instead of
autodiff through the forward computation.

Example (swap one import; the state, and so any checkpoint, is unchanged)::

  from flax import nnx
  from jaxnorm import nnx as jnn

  norm = jnn.LayerNorm(512, rngs=nnx.Rngs(0))       # was: nnx.LayerNorm(512, rngs=...)
  rms = jnn.RMSNorm(512, epsilon=1e-5, rngs=nnx.Rngs(0))

Deliberate differences from Flax:

* ``LayerNorm``'s ``use_fast_variance`` defaults to ``False`` (Flax: ``True``): the variance is
  jaxnorm's shifted-data form, accurate at any :math:`|\mu| / \sigma`, where Flax's default
  :math:`\overline{x^2} - \mu^2` cancels catastrophically (every digit at :math:`10^4` in
  float32). ``use_fast_variance=True`` computes Flax's fast form (``docs/modules.md``).
  ``RMSNorm`` accepts the flag for compatibility; it computes no variance.
* ``num_features`` that does not match the input's feature size raises a ``ValueError``
  naming both sizes (Flax fails inside a reshape).
* With both ``axis_name`` and ``mask``, jaxnorm sums the masked-in elements and their count
  over the devices (the exact mean of the masked-in elements); Flax averages the per-device
  masked means with ``pmean``. The two agree whenever every device holds the same number of
  masked-in elements per row (always, without a mask).
* A repeated axis in ``reduction_axes``/``feature_axes`` raises a ``ValueError`` naming it
  (Flax merges the two mentions).
* Complex inputs are not supported (``TypeError``).

Extra trailing keyword arguments (their defaults reproduce Flax):

* ``epsilon_placement``: ``"inside"`` divides by :math:`\sqrt{\sigma^2 + \epsilon}` (Flax);
  ``"outside"`` by :math:`\sqrt{\sigma^2} + \epsilon`.
* ``zero_centered_scale``: ``True`` multiplies by :math:`1 + \gamma` (Gemma style). The
  default ``scale_init`` (ones) then starts at an effective scale of 2; pass
  ``scale_init=nnx.initializers.zeros_init()`` to start at the identity.
* ``impl``: IMPL_CHOICES, the kernel of the op.
* ``casting``: ``"float32"`` (default), ``"llama"`` or ``"t5"``, the order of casts of the
  affine stage (``docs/modules.md``, "Casting modes").
"""

from __future__ import annotations

import typing as tp
from types import MappingProxyType

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import rnglib
from flax.nnx.nn import dtypes, initializers
from flax.typing import Axes, Dtype, Initializer, PromoteDtypeFn

from jaxnorm import _validation as v
from jaxnorm.backends import table as _backends
from jaxnorm.flax import common as common
from jaxnorm.flax.gated_nnx import GatedRMSNorm as GatedRMSNorm
from jaxnorm.flax import nnx_pointwise as _pointwise
from jaxnorm.flax.nnx_pointwise import param as _param
from jaxnorm.flax.nnx_pointwise import value as _value
from jaxnorm.ops.table import OPS

__doc__ = _backends.documented(__doc__)  # the impl= choices of the table

# One layer per pointwise op of jaxnorm.OPS (DyT, Derf), built from its entry by
# jaxnorm.flax.nnx_pointwise (their __module__ is this one), exported by name.
# The layer of a pointwise op added to jaxnorm.OPS after import (register) is found by
# __getattr__ (PEP 562).
__all__, __getattr__, __dir__ = _pointwise.FACTORY.export(
    globals(), ["GatedRMSNorm", "LayerNorm", "RMSNorm"])


# The constructor arguments of LayerNorm and RMSNorm that go into the parameters (their
# initializers, metadata and keys) rather than into attributes of their own.
_PARAM_ARGS = ("self", "rngs", "scale_init", "bias_init", "scale_metadata", "bias_metadata")


def _init_norm(layer: nnx.Module, name: str, op_name: str, args: dict[str, tp.Any]) -> None:
  """The shared constructor body of :class:`LayerNorm` and :class:`RMSNorm`.

  ``args`` is the constructor's ``locals()`` on entry: its arguments by name. Checks them
  (``num_features`` a positive int, errors naming ``name``; the options with
  :func:`common.check_layer_options`), creates ``scale`` then, for an op with a bias, ``bias``
  (keys drawn in that order, as in Flax, so that the same Rngs give the same initial values:
  ``nnx.Param`` of shape ``(num_features,)``, or None when not used), and stores every other
  argument under its own name, in the constructor's order (``num_features`` as an int,
  ``epsilon`` as a float).
  """
  fields = {k: a for k, a in args.items() if k not in _PARAM_ARGS}
  fields["num_features"] = common.check_num_features_arg(name, fields["num_features"])
  fields["epsilon"] = common.check_layer_options(op_name, fields)
  shape = (fields["num_features"],)
  for p in OPS[op_name].params:  # ("scale",) or ("scale", "bias")
    setattr(layer, p, _param(args["rngs"], fields[f"use_{p}"], args[f"{p}_init"], shape,
                             fields["param_dtype"], args[f"{p}_metadata"]))
  for k, a in fields.items():
    setattr(layer, k, a)


@_backends.documented
class LayerNorm(nnx.Module):
  r"""Layer normalization (https://arxiv.org/abs/1607.06450) with a custom VJP.

  .. math::

     y = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta, \qquad
     \mu = \overline{x}, \quad \sigma^2 = \overline{(x - \mu)^2}

  where the means are over ``reduction_axes`` (over the elements where ``mask`` is true, and
  across the devices of ``axis_name``), and :math:`\gamma` (``scale``), :math:`\beta`
  (``bias``) are learned per feature along ``feature_axes``. Same constructor, parameters
  and call as :class:`flax.nnx.LayerNorm`; see the module docstring for the differences.

  Example::

    >>> from flax import nnx
    >>> import jax
    >>> from jaxnorm import nnx as jnn
    >>> layer = jnn.LayerNorm(6, rngs=nnx.Rngs(0))
    >>> y = layer(jax.random.normal(jax.random.key(0), (3, 6)))
    >>> y.shape
    (3, 6)

  Args:
    num_features: the number of input features: the product of the sizes of ``feature_axes``.
    epsilon: a small float added to the variance to avoid dividing by zero.
    dtype: the dtype of the result (default: inferred from the input and the parameters).
    param_dtype: the dtype of the parameters (default: float32).
    use_bias: if True, the bias :math:`\beta` is added.
    use_scale: if True, the output is multiplied by the scale :math:`\gamma`.
    bias_init: initializer for the bias, zeros by default.
    scale_init: initializer for the scale, ones by default.
    reduction_axes: axes the statistics are computed over.
    feature_axes: axes that carry a separate learned scale and bias per feature.
    axis_name: named axis (of ``shard_map``/``pmap``) across which the statistics are
      averaged, when the reduction axes are split across devices.
    axis_index_groups: groups of indices within ``axis_name`` to average over separately.
    use_fast_variance: if True, the variance is Flax's :math:`\overline{x^2} - \mu^2`
      (clamped at 0); default False (Flax: True), jaxnorm's accurate shifted-data variance
      (see the module docstring).
    promote_dtype: function that promotes ``(x, scale, bias)`` to a common dtype, called with
      ``dtype=dtype``, as in Flax.
    rngs: the random number generators for the initializers.
    bias_metadata: metadata for the bias ``nnx.Param`` (e.g. ``out_sharding``; ``sharding_names``
      before Flax 0.12.4).
    scale_metadata: metadata for the scale ``nnx.Param``.
    epsilon_placement: ``"inside"`` (Flax) or ``"outside"`` the square root.
    zero_centered_scale: if True, multiply by ``1 + scale`` instead of ``scale``.
    impl: IMPL_CHOICES.
    backend_config: the config of the backend ``impl`` runs, or None (a
      :class:`jaxnorm.PallasConfig` for the kernels; :func:`jaxnorm.layer_norm`).
    casting: ``"float32"``, ``"llama"`` or ``"t5"``: where the affine stage rounds.
    memory_efficient: reverse mode keeps ``y`` instead of ``x`` (:func:`jaxnorm.layer_norm`).

  Raises:
    TypeError: for a non-int ``num_features`` or a non-number ``epsilon``.
    ValueError: for a non-positive ``num_features``, a negative ``epsilon`` or an unknown
      ``epsilon_placement``/``impl``; at call time, for an input whose feature size is not
      ``num_features``.
  """

  def __init__(
      self,
      num_features: int,
      *,
      epsilon: float = 1e-6,
      dtype: tp.Optional[Dtype] = None,
      param_dtype: Dtype = jnp.float32,
      use_bias: bool = True,
      use_scale: bool = True,
      bias_init: Initializer = initializers.zeros_init(),
      scale_init: Initializer = initializers.ones_init(),
      reduction_axes: Axes = -1,
      feature_axes: Axes = -1,
      axis_name: tp.Optional[str] = None,
      axis_index_groups: tp.Any = None,
      use_fast_variance: bool = False,
      promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
      rngs: rnglib.Rngs,
      bias_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
      scale_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
      epsilon_placement: str = "inside",
      zero_centered_scale: bool = False,
      impl: str = "auto",
      backend_config: tp.Any = None,
      casting: str = "float32",
      memory_efficient: bool = False,
  ):
    _init_norm(self, "LayerNorm", "layer_norm", locals())

  def __call__(self, x: jax.Array, *, mask: tp.Optional[jax.Array] = None,
               residual: tp.Optional[jax.Array] = None, residual_scale: float = 1.0):
    r"""Applies layer normalization to ``x``, or to ``h = x + residual_scale * residual``.

    Args:
      x: the input, any shape with ``num_features`` features along ``feature_axes``.
      mask: optional boolean array broadcastable to ``x``; the statistics are computed over
        the elements where it is true, every element is normalized.
      residual: optional array of the shape of ``x`` (the residual stream). When given, the
        residual add is fused with the norm (:func:`jaxnorm.add_layer_norm`): the layer
        normalizes :math:`h = x + \alpha\,\text{residual}` (``h`` in the promoted dtype of ``x``
        and ``residual``) and returns ``(y, h)``.
      residual_scale: :math:`\alpha`, a Python float (DeepNorm's up-weighting); only with
        ``residual``.

    Returns:
      The normalized input, the shape of ``x``, in the dtype Flax's rules give
      (``dtype``, else the promoted dtype of ``x``, ``scale`` and ``bias``); with ``residual``,
      ``(y, h)`` (``y`` by the same rules applied to ``h``).
    """
    return _call(self, "layer_norm", x, _value(self.scale), _value(self.bias), mask, residual,
                 residual_scale)


@_backends.documented
class RMSNorm(nnx.Module):
  r"""RMS normalization (https://arxiv.org/abs/1910.07467) with a custom VJP.

  .. math::

     y = \gamma \odot \frac{x}{\sqrt{\overline{x^2} + \epsilon}}

  where the mean is over ``reduction_axes`` (over the elements where ``mask`` is true, and
  across the devices of ``axis_name``), and :math:`\gamma` (``scale``) is learned per feature
  along ``feature_axes``. There is no bias, as in Flax. Same constructor, parameters and call
  as :class:`flax.nnx.RMSNorm`, except that ``mask`` is keyword-only, as in ``LayerNorm``.

  Example::

    >>> from flax import nnx
    >>> import jax
    >>> from jaxnorm import nnx as jnn
    >>> layer = jnn.RMSNorm(6, rngs=nnx.Rngs(0))
    >>> y = layer(jax.random.normal(jax.random.key(0), (3, 6)))
    >>> y.shape
    (3, 6)

  Args:
    num_features: the number of input features: the product of the sizes of ``feature_axes``.
    epsilon: a small float added to the mean square to avoid dividing by zero.
    dtype: the dtype of the result (default: inferred from the input and the parameters).
    param_dtype: the dtype of the parameters (default: float32).
    use_scale: if True, the output is multiplied by the scale :math:`\gamma`.
    scale_init: initializer for the scale, ones by default.
    reduction_axes: axes the statistics are computed over.
    feature_axes: axes that carry a separate learned scale per feature.
    axis_name: named axis (of ``shard_map``/``pmap``) across which the mean square is
      averaged, when the reduction axes are split across devices.
    axis_index_groups: groups of indices within ``axis_name`` to average over separately.
    use_fast_variance: accepted for compatibility; RMSNorm computes no variance, so it has no
      effect (in Flax neither).
    promote_dtype: function that promotes ``(x, scale)`` to a common dtype, called with
      ``dtype=dtype``, as in Flax.
    rngs: the random number generators for the initializer.
    scale_metadata: metadata for the scale ``nnx.Param`` (e.g. ``out_sharding``;
      ``sharding_names`` before Flax 0.12.4).
    epsilon_placement: ``"inside"`` (Flax) or ``"outside"`` the square root.
    zero_centered_scale: if True, multiply by ``1 + scale`` instead of ``scale``.
    impl: IMPL_CHOICES.
    backend_config: the config of the backend ``impl`` runs, or None (a
      :class:`jaxnorm.PallasConfig` for the kernels; :func:`jaxnorm.layer_norm`).
    casting: ``"float32"``, ``"llama"`` or ``"t5"``: where the affine stage rounds.
    memory_efficient: reverse mode keeps ``y`` instead of ``x`` (:func:`jaxnorm.layer_norm`).

  Raises:
    TypeError: for a non-int ``num_features`` or a non-number ``epsilon``.
    ValueError: for a non-positive ``num_features``, a negative ``epsilon`` or an unknown
      ``epsilon_placement``/``impl``; at call time, for an input whose feature size is not
      ``num_features``.
  """

  def __init__(
      self,
      num_features: int,
      *,
      epsilon: float = 1e-6,
      dtype: tp.Optional[Dtype] = None,
      param_dtype: Dtype = jnp.float32,
      use_scale: bool = True,
      scale_init: Initializer = initializers.ones,
      reduction_axes: Axes = -1,
      feature_axes: Axes = -1,
      axis_name: tp.Optional[str] = None,
      axis_index_groups: tp.Any = None,
      use_fast_variance: bool = True,
      promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
      rngs: rnglib.Rngs,
      scale_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
      epsilon_placement: str = "inside",
      zero_centered_scale: bool = False,
      impl: str = "auto",
      backend_config: tp.Any = None,
      casting: str = "float32",
      memory_efficient: bool = False,
  ):
    _init_norm(self, "RMSNorm", "rms_norm", locals())

  def __call__(self, x: jax.Array, *, mask: tp.Optional[jax.Array] = None,
               residual: tp.Optional[jax.Array] = None, residual_scale: float = 1.0):
    r"""Applies RMS normalization to ``x``, or to ``h = x + residual_scale * residual``.

    Args:
      x: the input, any shape with ``num_features`` features along ``feature_axes``.
      mask: optional boolean array broadcastable to ``x``; the mean square is computed over
        the elements where it is true, every element is normalized.
      residual: optional array of the shape of ``x``; when given, the add is fused with the
        norm (:func:`jaxnorm.add_rms_norm`) and the layer returns ``(y, h)``, see
        :meth:`LayerNorm.__call__`.
      residual_scale: :math:`\alpha`, a Python float; only with ``residual``.

    Returns:
      The normalized input, the shape of ``x``, in the dtype Flax's rules give
      (``dtype``, else the promoted dtype of ``x`` and ``scale``); with ``residual``, ``(y, h)``.
    """
    return _call(self, "rms_norm", x, _value(self.scale), None, mask, residual, residual_scale)


def _call(layer: tp.Any, op_name: str, x: tp.Any, scale: tp.Any, bias: tp.Any, mask: tp.Any,
          residual: tp.Any = None, residual_scale: float = 1.0) -> tp.Any:
  """The shared ``__call__``: Flax NNX's dtype promotion, then the op (with the feature check).

  With ``residual`` the normalized input is ``h = x + residual_scale * residual``: Flax's
  promotion is applied to the parameters and the output dtype as it would be to ``h``, while
  ``x`` and ``residual`` go into the residual add + norm op as they are (``h`` keeps their
  promoted dtype).
  """
  name = type(layer).__name__
  if not hasattr(x, "shape"):
    x = jnp.asarray(x)
  v.check_layer_input("x", x)
  # Flax NNX promotes the input and the parameters to one dtype (`dtype` when given) first.
  h = x if residual is None else common.residual_input(x, residual)
  if "bias" in OPS[op_name].params:  # the op's declared parameters
    h, scale, bias = layer.promote_dtype((h, scale, bias), dtype=layer.dtype)
  else:
    h, scale = layer.promote_dtype((h, scale), dtype=layer.dtype)
  out_dtype = common.output_dtype(h, scale, bias, dtype=layer.dtype)
  if residual is None:
    x = h
  return common.normalize(op_name, x, scale, bias, dtype=out_dtype, mask=mask, residual=residual,
                          residual_scale=residual_scale, num_features=layer.num_features,
                          module=name, **common.layer_options(layer, op_name))
