r"""Logic shared by the Flax NNX and Linen norm layers (:mod:`jaxnorm.nnx`, :mod:`jaxnorm.linen`).

Flax's normalization layers accept any ``reduction_axes`` (the axes the statistics are taken
over) and any ``feature_axes`` (the axes that carry a learned scale and bias). The custom-VJP
ops of jaxnorm normalize over *trailing* axes only, so :func:`normalize` transposes the
reduction axes to the end, calls the op, and transposes back:

.. math::

   y = \mathrm{op}\big(P x\big)\, P^{-1}, \qquad P:\ (\text{kept axes}, \text{reduction axes})

When the feature axes are the reduction axes, ``scale`` and ``bias`` go into the op ("in-op
affine": its backward rule then yields ``dscale`` and ``dbias`` as well). Otherwise the op
normalizes without them, in float32, and the broadcast affine map :math:`y \gamma + \beta` is
applied with ``jax.numpy`` afterwards, as Flax does; the normalization itself still runs through the
custom VJP.

Everything here runs at trace time on static shapes, so every error is raised before any
computation and names the argument, the value received and the value expected.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax.nnx.nn import dtypes as _flax_dtypes

from jaxnorm.backends import table as _backends
from jaxnorm import _validation as v
from jaxnorm._casting import CASTINGS, cast_plan
from jaxnorm.ops.table import NORM_FAMILY, POINTWISE_FAMILY, lookup



def feature_shape(x_shape: tuple[int, ...], feature_axes: Any) -> tuple[int, ...]:
  """The shape of the learned parameters: ``x.shape[a]`` for each sorted feature axis."""
  axes = v.check_axes("feature_axes", len(x_shape), feature_axes)
  return tuple(int(x_shape[a]) for a in axes)


def check_num_features(module: str, num_features: int, x_shape: tuple[int, ...],
                       fshape: tuple[int, ...], feature_axes: Any, sharded: bool = False) -> None:
  """Raises ``ValueError`` unless ``num_features`` matches the input's feature size.

  Flax reports this mismatch as a reshape error deep inside the layer; this names both sizes.
  With ``sharded=True`` (the layer has an ``axis_name``: inside ``shard_map`` each device holds
  a slice of the features) the local feature size must divide ``num_features``; the parameter
  shards are then checked against the local size by :func:`normalize`.

  Args:
    module: the layer's class name, for the message.
    num_features: the layer's ``num_features``.
    x_shape: the input's shape.
    fshape: the input's feature shape (``x_shape`` along the canonical ``feature_axes``).
    feature_axes: the layer's ``feature_axes`` as given, for the message.
    sharded: whether the feature axes are split over ``axis_name``.
  """
  size = math.prod(fshape)
  if size == num_features or (sharded and num_features % size == 0):
    return
  where = "the local shard of the input" if sharded else "the input"
  raise ValueError(
      f"{module} was built with num_features={num_features}, but {where} x of shape "
      f"{tuple(x_shape)} has {size} features along feature_axes={feature_axes!r} (shape "
      f"{fshape}). Build the layer with num_features={size}, or fix feature_axes."
  )


def check_num_features_arg(module: str, num_features: Any) -> int:
  """Checks the ``num_features`` constructor argument: a positive int."""
  if isinstance(num_features, bool) or not isinstance(num_features, (numbers.Integral, np.integer)):
    raise TypeError(
        f"{module}: num_features must be a positive int (the size of the feature axes), got "
        f"{type(num_features).__name__} {num_features!r}."
    )
  if num_features <= 0:
    raise ValueError(f"{module}: num_features must be a positive int, got {num_features!r}.")
  return int(num_features)


def op_options(op_name: str) -> tuple[Any, ...]:
  """The options the norm-family op ``op_name`` declares (:class:`~jaxnorm._norm_ops.Option`:
  LayerNorm's ``use_fast_variance`` and ``memory_efficient``, RMSNorm's ``memory_efficient``),
  read from its entry of :data:`jaxnorm.OPS`: the one place the layers learn an option's name."""
  return tuple(lookup(op_name, "op_name", NORM_FAMILY).decl.options)


# The layers' own bool flags, checked with the options: a parameter's switch (a truthy string
# would otherwise create the parameter the user switched off) and Flax's compatibility flag.
LAYER_FLAGS = ("use_scale", "use_bias", "force_float32_reductions")


def check_layer_options(op_name: str, options: Mapping[str, Any]) -> float:
  """Validates the static options of a norm layer once, when it is built.

  ``options`` holds the family's options by name (``epsilon``, ``epsilon_placement``,
  ``zero_centered_scale``, ``impl``, ``backend_config``, ``casting``; the layer's ``dtype``,
  ``param_dtype`` and :data:`LAYER_FLAGS` (each a bool) where given) and the op's own
  (:func:`op_options`, each a bool; an option the op does not declare, e.g. RMSNorm's
  ``use_fast_variance``, is not checked: it has no effect).

  Returns:
    ``epsilon`` as a Python float (the NNX layers store it; the op then sees a clean value).
  """
  epsilon = v.check_epsilon(options["epsilon"])
  v.check_choice("epsilon_placement", options["epsilon_placement"], v.EPSILON_PLACEMENTS)
  v.check_bool("zero_centered_scale", options["zero_centered_scale"])
  for o in op_options(op_name):
    v.check_bool(o.name, options[o.name])
  for name in LAYER_FLAGS:  # where the layer passes them (both layer kinds do)
    if name in options:
      v.check_bool(name, options[name])
  v.check_choice("impl", options["impl"], _backends.IMPLS)
  _backends.check_config(options["backend_config"])
  v.check_choice("casting", options["casting"], CASTINGS)
  for name in ("dtype", "param_dtype"):  # where the layer passes them (both layer kinds do)
    if name in options:
      v.check_out_dtype(name, options[name])
  return epsilon


def output_dtype(*args: Any, dtype: Any = None) -> Any:
  """Flax's output dtype rule: ``dtype`` if given, else ``jnp.result_type`` of the arrays.

  ``None`` entries are ignored; a non-floating result is promoted to float32 (Flax's
  ``canonicalize_dtype`` with ``inexact=True``).
  """
  return _flax_dtypes.canonicalize_dtype(*args, dtype=dtype)


def _to_rank(mask: Any, ndim: int) -> Any:
  """Prepends size-1 axes so that a broadcastable ``mask`` has rank ``ndim``."""
  if mask.ndim == ndim:
    return mask
  return mask.reshape((1,) * (ndim - mask.ndim) + tuple(mask.shape))


# The norm family's options every norm layer stores under these names and passes to its op; the
# op's own options (op_options) come from its declaration.
FAMILY_OPTIONS = ("reduction_axes", "feature_axes", "epsilon", "axis_name", "axis_index_groups",
                  "epsilon_placement", "zero_centered_scale", "impl", "backend_config", "casting")


def layer_options(layer: Any, op_name: str) -> dict[str, Any]:
  """The options of :func:`normalize` read off an NNX layer or a Linen module of ``op_name``:
  the family's (:data:`FAMILY_OPTIONS`) and the op's declared ones (:func:`op_options`).

  Both APIs store them under the same attribute names, so one place maps a layer to the op.
  """
  names = FAMILY_OPTIONS + tuple(o.name for o in op_options(op_name))
  return {name: getattr(layer, name) for name in names}


def normalize(op_name: str, x: Any, scale: Any, bias: Any, *, reduction_axes: Any,
              feature_axes: Any, epsilon: float, dtype: Any, mask: Any = None,
              axis_name: Any = None, axis_index_groups: Any = None,
              epsilon_placement: str = "inside", zero_centered_scale: bool = False,
              impl: str = "auto", backend_config: Any = None, casting: str = "float32",
              num_features: int | None = None, module: str = "", residual: Any = None,
              residual_scale: float = 1.0, **options: Any) -> Any:
  r"""Normalizes ``x`` over any ``reduction_axes`` with the custom-VJP op of ``op_name``.

  .. math::

     y = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta \quad
     (\text{layer\_norm}), \qquad
     y = \gamma \odot \frac{x}{\sqrt{\overline{x^2} + \epsilon}} \quad (\text{rms\_norm})

  with the statistics over ``reduction_axes`` (masked-in elements only when ``mask`` is
  given; combined over the devices of ``axis_name`` when given) and :math:`\gamma`,
  :math:`\beta` broadcast along ``feature_axes``.

  Args:
    op_name: the name of a norm-family op of :data:`jaxnorm.OPS` (``"layer_norm"``,
      ``"rms_norm"``); another name raises a ``ValueError``.
    x: the input, already cast as the layer's dtype rules require.
    scale: ``None`` or an array with ``prod(feature shape)`` elements (any shape).
    bias: ``None`` or like ``scale``; must be ``None`` for ``rms_norm``.
    reduction_axes: axes the statistics are taken over (int or sequence).
    feature_axes: axes carrying the learned parameters (int or sequence).
    epsilon: the epsilon of the op.
    dtype: the output dtype (the layer computes it with Flax's rules).
    mask: ``None`` or a boolean array broadcastable to ``x``.
    axis_name, axis_index_groups, epsilon_placement, zero_centered_scale, impl,
      backend_config, casting: as :func:`jaxnorm.layer_norm` (``axis_name`` splits the
      reduction axes).
    residual: ``None``, or an array of the shape of ``x``: the residual add + norm op then
      normalizes :math:`h = x + \alpha\,\text{residual}` (``jaxnorm.add_layer_norm``).
    residual_scale: :math:`\alpha`, a Python float (DeepNorm); only with ``residual``.
    options: the op's own options by name, as its declaration lists them (:func:`op_options`:
      LayerNorm's ``use_fast_variance`` and ``memory_efficient``, RMSNorm's
      ``memory_efficient``), each at its declared default when left out; another name raises a
      ``TypeError``. With ``residual``, an option the residual add + norm op does not take
      (``memory_efficient``) set away from its default raises a ``ValueError``.
    num_features: the layer's ``num_features`` (NNX; None for Linen), checked against the
      input's feature size. module: the layer's class name, for error messages.

  The layer's static options were validated when it was built (:func:`check_layer_options`); ``x``'s
  and ``residual``'s dtypes, the residual's shape and the mask are checked once, by the op
  (the mask and the residual's shape here only when they must be transposed first).

  Returns:
    ``y`` with the shape of ``x`` and dtype ``dtype``; ``(y, h)`` when ``residual`` is given.

  Raises:
    ValueError: for axes out of range, or ``scale``/``bias`` whose size is not the feature size.
    TypeError: for a non-floating ``x`` or a non-boolean ``mask``.
  """
  red, feat, fshape = _check_call(op_name, x, scale, bias, reduction_axes, feature_axes,
                                  residual, residual_scale, num_features, module, axis_name)
  xt, rt, mt, back = _to_trailing(x, residual, mask, red)
  op_kwargs = dict(
      epsilon=epsilon, axis=tuple(range(x.ndim - len(red), x.ndim)), mask=mt,
      epsilon_placement=epsilon_placement, axis_name=axis_name,
      axis_index_groups=axis_index_groups, impl=impl, backend_config=backend_config)
  op_kwargs.update(_own_options(op_name, options))
  pshape = _in_op_param_shape(x, red, feat)
  if pshape is not None or (scale is None and bias is None):
    # In-op affine: scale and bias live on the reduction axes, or per head on axes just before
    # them (Flax's QK-norm spelling, feature_axes=(-2, -1), reduction_axes=-1): the op applies
    # (and differentiates) them, the kernels included.
    s = None if scale is None else scale.reshape(pshape)
    b = None if bias is None else bias.reshape(pshape)
    out = _op(op_name, xt, rt, s, b, residual_scale, zero_centered_scale=zero_centered_scale,
              dtype=dtype, casting=casting, **op_kwargs)
    return tuple(map(back, out)) if rt is not None else back(out)
  return _affine_after(op_name, x, xt, rt, scale, bias, feat, back, residual_scale=residual_scale,
                       zero_centered_scale=zero_centered_scale, dtype=dtype, casting=casting,
                       **op_kwargs)


def _in_op_param_shape(x, red, feat):
  """The shape the op takes the parameters in, or None when only an affine map after it fits.

  ``(d,)`` when the feature axes are the reduction axes; ``(heads..., *normalized_shape)`` when
  they extend them by axes that come, in ``x``'s order, right before the reduction axes once
  those are moved to the end (per-head parameters: one weight per head and feature; the op
  flattens the normalized axes itself). Otherwise None.
  """
  d = math.prod(int(x.shape[a]) for a in red)
  if feat == red:
    return (d,)
  extra = tuple(a for a in feat if a not in red)
  if len(extra) + len(red) != len(feat):  # a reduction axis without parameters
    return None
  kept = [a for a in range(x.ndim) if a not in red]
  if tuple(kept[len(kept) - len(extra):]) != extra or max(extra) > min(red):
    return None
  return tuple(int(x.shape[a]) for a in extra) + tuple(int(x.shape[a]) for a in red)


def _check_call(op_name, x, scale, bias, reduction_axes, feature_axes, residual, residual_scale,
                num_features, module, axis_name):
  """Checks what only the layer knows (axes, feature sizes); ``(red, feat, feature shape)``.

  The arrays' dtypes, the residual's shape and the mask are checked once, by the op.
  """
  op = lookup(op_name, "op_name", NORM_FAMILY)
  if bias is not None and "bias" not in op.params:
    raise ValueError(f"{op_name} has no bias; got a bias array. Pass bias=None.")
  if residual is None and residual_scale != 1.0:
    raise ValueError(f"residual_scale={residual_scale!r} multiplies the residual; pass "
                     f"residual= as well (or leave residual_scale at 1.0).")
  red = v.check_axes("reduction_axes", x.ndim, reduction_axes)
  feat = v.check_axes("feature_axes", x.ndim, feature_axes)
  fshape = tuple(int(x.shape[a]) for a in feat)
  if num_features is not None:
    check_num_features(module, num_features, x.shape, fshape, feature_axes,
                       sharded=axis_name is not None)
  for name, p in (("scale", scale), ("bias", bias)):
    if p is not None and int(np.prod(p.shape)) != math.prod(fshape):
      raise ValueError(
          f"{name} has shape {tuple(p.shape)} ({int(np.prod(p.shape))} elements), but the input "
          f"x of shape {tuple(x.shape)} has feature shape {fshape} along feature_axes="
          f"{feature_axes!r}; the parameter was created for a different feature size."
      )
  return red, feat, fshape


def _to_trailing(x, residual, mask, red):
  """``(xt, rt, mt, back)``: the reduction axes moved to the end (sorted), and the way back."""
  ndim = x.ndim
  kept = [a for a in range(ndim) if a not in red]
  perm = kept + list(red)
  if perm == list(range(ndim)):
    return x, residual, mask, lambda a: a
  if residual is not None:
    # Checked here, before the transpose, so the op's message names the layer's shapes.
    v.check_residual_shape(residual.shape, x.shape)
  mt = mask
  if mask is not None:
    v.check_mask(mask, x.shape)  # before the transpose; the op checks an untransposed mask
    mt = jnp.transpose(_to_rank(mask, ndim), perm)
  rt = None if residual is None else jnp.transpose(residual, perm)
  return (jnp.transpose(x, perm), rt, mt,
          lambda a: jnp.transpose(a, np.argsort(perm)))


def _affine_after(op_name, x, xt, rt, scale, bias, feat, back, *, residual_scale,
                  zero_centered_scale, dtype, casting, **op_kwargs):
  """Feature axes other than the reduction axes: the op normalizes in (at least) float32, then
  the broadcast affine map is applied with jnp, as Flax does, and cast once at the end (with
  ``casting`` other than "float32": in that mode's order of casts)."""
  compute = jnp.promote_types(x.dtype, jnp.float32)
  if rt is not None:
    compute = jnp.promote_types(compute, rt.dtype)
  out = _op(op_name, xt, rt, None, None, residual_scale, dtype=compute, **op_kwargs)
  yt, h = (out[0], back(out[1])) if rt is not None else (out, None)
  y = back(yt)  # (x.shape), float32
  bshape = [1] * x.ndim
  for a in feat:
    bshape[a] = x.shape[a]
  # gamma is formed, and the affine map rounds, where the op's would (jaxnorm._casting): one
  # home for 1 + scale, whatever the casting mode ("float32": everything in the compute dtype,
  # parameters widened first, so 1 + scale is not rounded to a half-precision param_dtype).
  plan = cast_plan(casting, compute if casting == "float32" else (x.dtype if h is None
                                                                  else h.dtype),
                   None if scale is None else scale.dtype, None if bias is None else bias.dtype)
  s = None if scale is None else scale.reshape(bshape)
  b = None if bias is None else bias.reshape(bshape)
  _, y = plan.affine_of(y.astype(plan.compute), plan.gamma_of(s, zero_centered_scale), b)
  return y.astype(dtype) if h is None else (y.astype(dtype), h)


def _own_options(op_name: str, given: Mapping[str, Any]) -> dict[str, Any]:
  """The op's declared options, from ``given`` or at their defaults; a ``TypeError`` naming any
  other name."""
  own = op_options(op_name)
  unknown = sorted(set(given) - {o.name for o in own})
  if unknown:
    raise TypeError(f"{op_name} takes no option {unknown}; its options are "
                    f"{tuple(o.name for o in own)} (its declaration in jaxnorm.OPS).")
  return {o.name: given.get(o.name, o.default) for o in own}


def _op(op_name, x, residual, scale, bias, residual_scale, **kw):
  """The op of ``op_name``: ``y``, or ``(y, h)`` of the residual add + norm op with ``residual``
  (an op option that op does not take is dropped at its default, refused otherwise)."""
  op = lookup(op_name, "op_name", NORM_FAMILY)
  params = _by_name(op, scale=scale, bias=bias)
  if residual is not None:
    takes = inspect.signature(op.add_fn).parameters
    for o in op_options(op_name):
      if o.name in kw and o.name not in takes:
        value = kw.pop(o.name)
        if value != o.default:
          raise ValueError(f"{o.name}={value!r}: the residual add + norm (residual=...) has no "
                           f"such option ({op.add_fn.__name__} takes no {o.name}). Call the "
                           f"layer without residual, or with {o.name}={o.default!r}.")
    return op.add_fn(x, residual, *params, residual_scale=residual_scale, **kw)
  return op.fn(x, *params, **kw)


def _by_name(op, **given):
  """``op``'s parameters in its call order, taken from ``given`` by name."""
  return tuple(given[name] for name in op.params)


def residual_input(x: Any, residual: Any) -> Any:
  """A scalar stand-in for ``h = x + residual`` for the layers' dtype rules (shape-free).

  The layers apply Flax's dtype promotion to the normalized input; with ``residual`` that input
  is ``h``, of dtype ``result_type(x, residual)``. Raises ``TypeError`` for a non-floating
  ``residual``.
  """
  v.check_input("residual", residual)
  return jnp.zeros((), jnp.result_type(x, residual))


def pointwise(op_name: str, x: Any, alpha: Any, shift: Any, scale: Any, bias: Any, *,
              feature_axes: Any, dtype: Any, num_features: int, module: str,
              residual: Any = None, residual_scale: float = 1.0) -> Any:
  """The pointwise layers' call: ``op(h)`` with ``h = x + residual_scale * residual``.

  ``scale``/``bias`` (``(num_features,)``) are laid along ``feature_axes`` of ``x`` and
  broadcast over the other axes; ``alpha`` and ``shift`` are scalars. With ``residual`` the add
  runs in XLA ahead of the op (both elementwise: XLA fuses them into one loop) and the result
  is ``(y, h)``. ``op_name``: the name of a pointwise op of :data:`jaxnorm.OPS` (``"dyt"``,
  ``"derf"``; each takes the parameters its entry names, ``shift`` only where declared);
  another name raises a ``ValueError``.
  """
  op = lookup(op_name, "op_name", POINTWISE_FAMILY)
  if residual is not None:
    v.check_residual_shape(getattr(residual, "shape", None), x.shape)
    alpha_r = v.check_residual_scale(residual_scale)
    dt = jnp.result_type(x, residual)
    x = x.astype(dt) + jnp.asarray(alpha_r, dt) * residual.astype(dt)
  axes = v.check_axes("feature_axes", x.ndim, feature_axes)
  fshape = tuple(int(x.shape[a]) for a in axes)
  check_num_features(module, num_features, x.shape, fshape, feature_axes)
  lead = min(axes)
  bshape = tuple(x.shape[a] if a in axes else 1 for a in range(lead, x.ndim))
  scale, bias = (None if p is None else p.reshape(bshape) for p in (scale, bias))
  y = op.fn(x, *_by_name(op, alpha=alpha, shift=shift, scale=scale, bias=bias), dtype=dtype)
  return y if residual is None else (y, x)
