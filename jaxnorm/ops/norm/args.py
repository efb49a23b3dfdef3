"""Internal API: the public norm ops' arguments, checked and prepared once.

:func:`prepare` (the plain ops, the layers, the Jacobian, the kernel API) and
:func:`prepare_add` (the residual add + norm ops) check every argument with
:mod:`jaxnorm._validation`, resolve ``impl`` (:func:`jaxnorm.backends.table.resolve_impl`) and build
the call's :class:`~jaxnorm._norm_config.NormConfig`; :func:`flat_params` gives the parameters
as the ops take them. Everything below trusts what comes out of here.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxnorm.backends import table as _backends
from jaxnorm import _jax_compat
from jaxnorm import _concrete_checks as _cc
from jaxnorm import _validation as v
from jaxnorm._casting import CASTINGS, cast_plan
from jaxnorm._norm_config import AddConfig, NormConfig
from jaxnorm.ops.norm import memory_efficient as _memory_efficient

__all__ = ["flat_params", "prepare", "prepare_add"]


def prepare(x, scale, bias, *, op, epsilon, axis, mask, epsilon_placement,
            zero_centered_scale, axis_name, axis_index_groups, dtype, impl, backend_config=None,
            pallas=None, casting="float32", x_name="x", options=None, h_dtype=None):
  """Validates the public arguments and returns ``(cfg, x2, mask2, restore)``.

  ``op``: the op's :class:`~jaxnorm._norm_ops.NormOp` declaration, which the config carries.
  ``options``: a dict of the op's own options (:attr:`NormOp.options`; missing ones take their
  defaults), e.g. ``{"use_fast_variance": True}`` for LayerNorm. ``backend_config`` (or its
  alias ``pallas``, not both): the config of the backend ``impl`` runs (a
  :class:`jaxnorm.PallasConfig` for the Triton kernels), or None for its default.
  ``casting``: one of :data:`jaxnorm._casting.CASTINGS`, checked here once and carried as the
  call's :class:`~jaxnorm._casting.CastPlan`. ``x_name``: what the messages call ``x`` (the kernel
  API's fused backward normalizes ``h``). ``h_dtype``: the dtype of the array the statistics are
  taken of where it is not ``x`` (the fused ops' ``h``); ``epsilon`` must be within its
  statistics' float range (:func:`jaxnorm._validation.check_epsilon_range`), traced ``x`` too.

  ``x2`` is ``x`` with its normalized trailing axes flattened into one, ``mask2`` the mask
  broadcast and flattened the same way, and ``restore`` maps a ``(..., d)`` result back to the
  shape of ``x``.
  """
  v.check_input(x_name, x)
  epsilon = v.check_epsilon(epsilon)
  v.check_epsilon_range(epsilon, x.dtype if h_dtype is None else h_dtype)
  axes = v.normalized_axes(x.ndim, axis)
  v.check_choice("epsilon_placement", epsilon_placement, v.EPSILON_PLACEMENTS)
  v.check_bool("zero_centered_scale", zero_centered_scale)
  options = v.check_op_options(op.name, tuple((o.name, o.default) for o in op.options),
                               options or {})
  v.check_choice("casting", casting, CASTINGS)
  if dict(options).get("memory_efficient"):
    _cc.check_invertible_scale(scale, zero_centered_scale)
  norm_shape = tuple(x.shape[axes[0]:])
  scale_heads = v.check_param("scale", scale, x.shape, axes[0], x_name=x_name)
  bias_heads = v.check_param("bias", bias, x.shape, axes[0], x_name=x_name)
  v.check_mask(mask, x.shape)
  dtype = v.check_out_dtype("dtype", dtype)
  axis_name = v.check_axis_name(axis_name)  # hashable: the config is a static argument
  if axis_index_groups is not None:
    if axis_name is None:
      raise ValueError("axis_index_groups needs axis_name (the mesh axis they group).")
    axis_index_groups = tuple(tuple(int(i) for i in grp) for grp in axis_index_groups)
  d = int(np.prod(norm_shape))
  if dict(options).get("memory_efficient"):
    _memory_efficient.warn_imprecise(
        scale, bias, zero_centered_scale=zero_centered_scale,
        shapes=(scale_heads + (d,), bias_heads + (d,)), out_dtype=dtype or x.dtype)
  lead = tuple(x.shape[:axes[0]])
  x2 = x.reshape(lead + (d,))
  configs, config_arg = _backends.check_config(backend_config, pallas)
  impl_arg = impl
  impl, names = _backends.resolve_impl(impl, (int(np.prod(lead)), d), x.dtype, mask,
                                       axis_name, op, options)
  mask2 = None
  if mask is not None:
    mask2 = jnp.broadcast_to(mask, x.shape).reshape(lead + (d,))
  cfg = NormConfig(
      op=op,
      epsilon=epsilon,
      epsilon_placement=epsilon_placement,
      zero_centered_scale=zero_centered_scale,
      axis_name=axis_name,
      axis_index_groups=axis_index_groups,
      out_dtype=jnp.dtype(dtype or x.dtype),
      bias_dtype=None if bias is None else jnp.dtype(bias.dtype),
      bias_shape=None if bias is None else bias_heads + (d,),
      bias_vma=frozenset() if bias is None else _jax_compat.varying_axes(bias),
      impl=impl,
      backend_config=_backends.call_config(configs, names, impl_arg, config_arg),
      cast=cast_plan(casting, x.dtype, None if scale is None else scale.dtype,
                     None if bias is None else bias.dtype),
      heads=max(scale_heads, bias_heads, key=len),
      options=options,
  )
  shape = tuple(x.shape)
  return cfg, x2, mask2, lambda y: y.reshape(shape)


def prepare_add(x, residual, scale, bias, *, residual_scale, residual_dtype, **kw):
  """Validates a residual add + norm call; returns ``(cfg, x2, r2, mask2, restore)``.

  As :func:`prepare`, with ``cfg.add`` describing the add ``h = x + residual_scale *
  residual`` (``h`` stored in ``residual_dtype``, default the inputs' promoted dtype).
  """
  v.check_input("x", x)
  v.check_input("residual", residual)
  v.check_residual_shape(residual.shape, x.shape)
  alpha = v.check_residual_scale(residual_scale)
  hd = v.check_out_dtype("residual_dtype", residual_dtype)  # None: the inputs' promoted dtype
  if hd is None:
    hd = jnp.dtype(jnp.promote_types(x.dtype, residual.dtype))
  impl = kw.get("impl", "auto")
  norm, x2, mask2, restore = prepare(x, scale, bias, h_dtype=hd, **kw)
  norm = _backends.resolve_add_impl(
      norm, (("residual", jnp.dtype(residual.dtype)), ("residual_dtype", hd)), impl)
  add = AddConfig(residual_scale=alpha, h_dtype=hd, x_dtype=jnp.dtype(x.dtype),
                  residual_dtype=jnp.dtype(residual.dtype), x_vma=_jax_compat.varying_axes(x),
                  residual_vma=_jax_compat.varying_axes(residual))
  cfg = dataclasses.replace(norm, add=add)
  return cfg, x2, residual.reshape(x2.shape), mask2, restore


def flat_params(x, x2, *params):
  """Each scale/bias as the ops take it: ``(heads..., d)``, its normalized axes flattened.

  ``x`` is the public input and ``x2`` the prepared one (normalized axes flattened into ``d``);
  a parameter of the normalized shape or ``(d,)`` becomes ``(d,)``, a per-head one
  ``(heads..., *normalized_shape)`` becomes ``(heads..., d)``. None stays None.
  """
  n_norm, d = x.ndim - x2.ndim + 1, x2.shape[-1]
  out = []
  for p in params:
    if p is not None:
      n_heads = max(p.ndim - n_norm, 0)
      p = p.reshape(tuple(p.shape[:n_heads]) + (d,))
    out.append(p)
  return tuple(out)
