r"""Flax Linen ``LayerNorm`` and ``RMSNorm`` backed by jaxnorm's ops and their derived rules.

Drop-in replacements for :class:`flax.linen.LayerNorm` and :class:`flax.linen.RMSNorm`: the
same dataclass fields in the same order with the same defaults (``force_float32_reductions``
included), the same ``params`` tree (``scale``, ``bias`` of shape ``x.shape[feature_axes]``
and dtype ``param_dtype``, created in the same order so the same key gives the same values;
boxed initializers such as ``nn.with_partitioning`` pass through), the same output dtype
rules and the same ``reduction_axes``/``feature_axes``/``mask``/``axis_name`` semantics. Only
the gradient path changes: the backward pass is jaxnorm's hand-derived rule.

Example (swap one import; the variables, and so any checkpoint, are unchanged)::

  import flax.linen as nn
  from jaxnorm import linen as jln

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = jln.LayerNorm()(x)                # was: nn.LayerNorm()(x)
      return nn.Dense(4)(jln.RMSNorm()(x))  # was: nn.RMSNorm()(x)

Deliberate differences from Flax:

* ``LayerNorm``'s ``use_fast_variance`` defaults to ``False`` (Flax: ``True``): jaxnorm's
  shifted-data variance, accurate at any :math:`|\mu| / \sigma`, where Flax's default
  :math:`\overline{x^2} - \mu^2` cancels (every digit at :math:`10^4` in float32).
  ``use_fast_variance=True`` computes Flax's fast form. ``RMSNorm`` accepts the flag for
  compatibility; it computes no variance.
* ``force_float32_reductions`` is accepted for compatibility but the statistics are always
  reduced in at least float32 (float64 for float64 inputs). With ``False`` Flax reduces
  half-precision inputs in half precision; jaxnorm's result is then the more accurate one and
  differs from Flax's by at most the half-precision rounding error.
* With both ``axis_name`` and ``mask``, jaxnorm sums the masked-in elements and their count
  over the devices (the exact mean of the masked-in elements); Flax averages the per-device
  masked means with ``pmean``. The two agree whenever every device holds the same number of
  masked-in elements per row (always, without a mask).
* A repeated axis in ``reduction_axes``/``feature_axes`` raises a ``ValueError`` naming it
  (Flax merges the two mentions).
* Complex inputs are not supported (``TypeError``).

Extra trailing fields (their defaults reproduce Flax): ``epsilon_placement`` (``"inside"``:
:math:`\sqrt{\sigma^2 + \epsilon}`, ``"outside"``: :math:`\sqrt{\sigma^2} + \epsilon`),
``zero_centered_scale`` (multiply by :math:`1 + \gamma`; pair it with
``scale_init=nn.initializers.zeros`` to start at the identity) and ``impl``
(IMPL_CHOICES).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.typing import Axes, Dtype, Initializer
from jax.nn import initializers

from jaxnorm.flax import common as common
from jaxnorm import _validation as v
from jaxnorm.backends import table as _backends
from jaxnorm.flax import linen_pointwise as _pointwise
from jaxnorm.flax.gated_linen import GatedRMSNorm as GatedRMSNorm

__doc__ = _backends.documented(__doc__)  # the impl= choices of the table

# One layer per pointwise op of jaxnorm.OPS (DyT, Derf), built from its entry (exported by name).
# The layer of a pointwise op added to jaxnorm.OPS after import (register) is found by
# __getattr__ (PEP 562).
__all__, __getattr__, __dir__ = _pointwise.FACTORY.export(
    globals(), ["GatedRMSNorm", "LayerNorm", "RMSNorm"])


def _params(mdl: nn.Module, x: jax.Array, use_scale: bool, use_bias: bool):
  """Creates (or fetches) ``scale`` then ``bias``, as Flax does, in ``param_dtype``."""
  fshape = list(common.feature_shape(x.shape, mdl.feature_axes))
  scale = mdl.param("scale", mdl.scale_init, fshape, mdl.param_dtype) if use_scale else None
  bias = mdl.param("bias", mdl.bias_init, fshape, mdl.param_dtype) if use_bias else None
  return scale, bias


def _call(mdl: nn.Module, op_name: str, x: Any, mask: Any, use_scale: bool, use_bias: bool,
          residual: Any = None, residual_scale: float = 1.0):
  """The shared ``__call__``: parameters, Flax Linen's dtype rules, the op.

  With ``residual`` the rules apply to ``h = x + residual_scale * residual`` (the output dtype
  is ``dtype``, else ``result_type(h, scale, bias)``), and the residual add + norm op returns
  ``(y, h)``.
  """
  if not hasattr(x, "dtype"):
    x = jnp.asarray(x)
  v.check_layer_input("x", x)
  if jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.bool_):
    # Flax reduces integer inputs in float32 and returns floating outputs.
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  scale, bias = _params(mdl, x, use_scale, use_bias)
  # Linen does not promote x: the output dtype is `dtype`, else result_type(x, scale, bias).
  h = x if residual is None else common.residual_input(x, residual)
  out_dtype = common.output_dtype(h, scale, bias, dtype=mdl.dtype)
  return common.normalize(op_name, x, scale, bias, dtype=out_dtype, mask=mask, residual=residual,
                          residual_scale=residual_scale, **common.layer_options(mdl, op_name))


@_backends.documented
class LayerNorm(nn.Module):
  r"""Layer normalization (https://arxiv.org/abs/1607.06450) with a custom VJP.

  .. math::

     y = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta, \qquad
     \mu = \overline{x}, \quad \sigma^2 = \overline{(x - \mu)^2}

  where the means are over ``reduction_axes`` (over the elements where ``mask`` is true, and
  across the devices of ``axis_name``), and :math:`\gamma` (``scale``), :math:`\beta`
  (``bias``) are learned per feature along ``feature_axes``. Same fields, parameters and call
  as :class:`flax.linen.LayerNorm`; see the module docstring for the differences.

  Example::

    >>> import jax
    >>> from jaxnorm import linen as jln
    >>> x = jax.random.normal(jax.random.key(0), (3, 6))
    >>> variables = jln.LayerNorm().init(jax.random.key(1), x)
    >>> jax.tree.map(jax.numpy.shape, variables)
    {'params': {'bias': (6,), 'scale': (6,)}}

  Attributes:
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
      (clamped at 0); default False (Flax: True), jaxnorm's accurate shifted-data variance.
    force_float32_reductions: accepted for compatibility; the statistics are always reduced
      in at least float32.
    epsilon_placement: ``"inside"`` (Flax) or ``"outside"`` the square root.
    zero_centered_scale: if True, multiply by ``1 + scale`` instead of ``scale``.
    impl: IMPL_CHOICES.
    backend_config: the config of the backend ``impl`` runs, or None (a
      :class:`jaxnorm.PallasConfig` for the kernels; :func:`jaxnorm.layer_norm`).
    casting: ``"float32"``, ``"llama"`` or ``"t5"``: where the affine stage rounds.
    memory_efficient: reverse mode keeps ``y`` instead of ``x`` (:func:`jaxnorm.layer_norm`).
  """

  epsilon: float = 1e-6
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  use_bias: bool = True
  use_scale: bool = True
  bias_init: Initializer = initializers.zeros
  scale_init: Initializer = initializers.ones
  reduction_axes: Axes = -1
  feature_axes: Axes = -1
  axis_name: str | None = None
  axis_index_groups: Any = None
  use_fast_variance: bool = False
  force_float32_reductions: bool = True
  epsilon_placement: str = "inside"
  zero_centered_scale: bool = False
  impl: str = "auto"
  backend_config: Any = None
  casting: str = "float32"
  memory_efficient: bool = False

  def __post_init__(self):
    common.check_layer_options("layer_norm", dict(
        common.layer_options(self, "layer_norm"), dtype=self.dtype, param_dtype=self.param_dtype,
        use_scale=self.use_scale, use_bias=self.use_bias,
        force_float32_reductions=self.force_float32_reductions))
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None,
               residual: jax.Array | None = None, residual_scale: float = 1.0):
    r"""Applies layer normalization to ``x``, or to ``h = x + residual_scale * residual``.

    Args:
      x: the input.
      mask: optional boolean array broadcastable to ``x``; the statistics are computed over
        the elements where it is true, every element is normalized.
      residual: optional array of the shape of ``x`` (the residual stream). When given, the
        add is fused with the norm (:func:`jaxnorm.add_layer_norm`): the layer normalizes
        :math:`h = x + \alpha\,\text{residual}` (in the promoted dtype of ``x`` and
        ``residual``) and returns ``(y, h)``.
      residual_scale: :math:`\alpha`, a Python float (DeepNorm); only with ``residual``.

    Returns:
      The normalized input, the shape of ``x``, in ``dtype`` or else the promoted dtype of
      ``x``, ``scale`` and ``bias``; with ``residual``, ``(y, h)``.
    """
    return _call(self, "layer_norm", x, mask, self.use_scale, self.use_bias, residual,
                 residual_scale)


@_backends.documented
class RMSNorm(nn.Module):
  r"""RMS normalization (https://arxiv.org/abs/1910.07467) with a custom VJP.

  .. math::

     y = \gamma \odot \frac{x}{\sqrt{\overline{x^2} + \epsilon}}

  where the mean is over ``reduction_axes`` (over the elements where ``mask`` is true, and
  across the devices of ``axis_name``), and :math:`\gamma` (``scale``) is learned per feature
  along ``feature_axes``. No bias, as in Flax. Same fields, parameters and call as
  :class:`flax.linen.RMSNorm`.

  Example::

    >>> import jax
    >>> from jaxnorm import linen as jln
    >>> x = jax.random.normal(jax.random.key(0), (3, 6))
    >>> variables = jln.RMSNorm().init(jax.random.key(1), x)
    >>> jax.tree.map(jax.numpy.shape, variables)
    {'params': {'scale': (6,)}}

  Attributes:
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
    use_fast_variance: accepted for compatibility; RMSNorm computes no variance, so it has
      no effect (in Flax neither).
    force_float32_reductions: accepted for compatibility; the mean square is always reduced
      in at least float32.
    epsilon_placement: ``"inside"`` (Flax) or ``"outside"`` the square root.
    zero_centered_scale: if True, multiply by ``1 + scale`` instead of ``scale``.
    impl: IMPL_CHOICES.
    backend_config: the config of the backend ``impl`` runs, or None (a
      :class:`jaxnorm.PallasConfig` for the kernels; :func:`jaxnorm.layer_norm`).
    casting: ``"float32"``, ``"llama"`` or ``"t5"``: where the affine stage rounds.
    memory_efficient: reverse mode keeps ``y`` instead of ``x`` (:func:`jaxnorm.layer_norm`).
  """

  epsilon: float = 1e-6
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  use_scale: bool = True
  scale_init: Initializer = initializers.ones
  reduction_axes: Axes = -1
  feature_axes: Axes = -1
  axis_name: str | None = None
  axis_index_groups: Any = None
  use_fast_variance: bool = True
  force_float32_reductions: bool = True
  epsilon_placement: str = "inside"
  zero_centered_scale: bool = False
  impl: str = "auto"
  backend_config: Any = None
  casting: str = "float32"
  memory_efficient: bool = False

  def __post_init__(self):
    common.check_layer_options("rms_norm", dict(
        common.layer_options(self, "rms_norm"), dtype=self.dtype, param_dtype=self.param_dtype,
        use_scale=self.use_scale, force_float32_reductions=self.force_float32_reductions))
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, *, mask: jax.Array | None = None,
               residual: jax.Array | None = None, residual_scale: float = 1.0):
    r"""Applies RMS normalization to ``x``, or to ``h = x + residual_scale * residual``.

    Args:
      x: the input.
      mask: optional boolean array broadcastable to ``x``; the mean square is computed over
        the elements where it is true, every element is normalized.
      residual: optional array of the shape of ``x``; when given, the add is fused with the
        norm (:func:`jaxnorm.add_rms_norm`) and the layer returns ``(y, h)``.
      residual_scale: :math:`\alpha`, a Python float; only with ``residual``.

    Returns:
      The normalized input, the shape of ``x``, in ``dtype`` or else the promoted dtype of
      ``x`` and ``scale``; with ``residual``, ``(y, h)``.
    """
    return _call(self, "rms_norm", x, mask, self.use_scale, False, residual, residual_scale)
