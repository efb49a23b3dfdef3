r"""Internal API: the residual add + norm's forward and derived backward (XLA or the kernels).

In a Transformer block every residual add is followed by a normalization (Pre-LN: the next
sub-layer's input; Post-LN and DeepNorm: the block output). This module does both in one op,

.. math::

   h = x + \alpha\, r \quad(\text{stored in } \texttt{residual\_dtype}), \qquad
   y = \mathrm{Norm}(h),

and returns ``(y, h)``. Both outputs can be used downstream (``h`` is the residual stream), so
the backward receives two cotangents, ``dy`` and ``dh``. With :math:`J` the Jacobian of
the norm at ``h``, :math:`\partial h/\partial x = I` and :math:`\partial h/\partial r = \alpha I`:

.. math::

   \frac{\partial L}{\partial x} = dh + J^\top dy, \qquad
   \frac{\partial L}{\partial r} = \alpha\,\big(dh + J^\top dy\big),

and the parameter cotangents are the norm's own (:math:`J^\top dy` and ``dscale``/``dbias`` are
the plain op's backward at ``h``, computed by the same functions of :mod:`jaxnorm._core`). The
derivation is in ``docs/derivations.md``, "Fused residual add".

Residuals: those of the plain op on ``h`` (``h`` itself, ``scale``, the mask and the row
statistics); ``x`` and ``residual`` are not kept, and ``h`` is the same buffer as the output.
When ``dh`` is a zero (``h`` unused downstream: Post-LN, DeepNorm) it is skipped, not
materialized (the transpose rule of :mod:`jaxnorm._ad` passes None).

Numerics: the add runs in at least float32 and is rounded once to ``residual_dtype``; ``y`` and
its statistics are computed from that rounded ``h``, so ``add_layer_norm(x, r)`` equals
``layer_norm(h)`` with ``h`` the returned stream, and the backward differentiates exactly the
function the forward computed.

Internal API (no public guarantee; a leading underscore means "only this file"):
:func:`prepare`, :func:`forward_only`, :func:`forward` and :func:`backward`, the pieces of the
``jax.custom_jvp`` of :mod:`jaxnorm._ad` that the public ops (:mod:`jaxnorm._add_norm`) call. A
fused call is described by a :class:`jaxnorm._spec.NormConfig` whose ``add`` is set.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxnorm import _core
from jaxnorm import _jax_compat
from jaxnorm import _validation as v
from jaxnorm import _xla
from jaxnorm._spec import AddConfig, NormConfig

__all__ = ["backward", "forward", "forward_only", "prepare"]


def _residual_dtype(x, residual, residual_dtype):
  if residual_dtype is None:
    return jnp.dtype(jnp.promote_types(x.dtype, residual.dtype))
  try:
    dt = jnp.dtype(residual_dtype)
  except TypeError:
    raise TypeError(f"residual_dtype must be a floating dtype (e.g. jnp.float32) or None, got "
                    f"{residual_dtype!r}.") from None
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"residual_dtype must be a floating dtype (e.g. jnp.float32) or None, got "
                    f"{dt}; the residual stream is stored in it.")
  return dt


def _pallas_ok(cfg: NormConfig, dtypes, impl: str) -> NormConfig:
  """The config with impl="xla" where the kernels cannot take one of ``dtypes`` ("auto")."""
  if cfg.impl == "xla":
    return cfg
  reason = v.kernel_problem(dtypes=dtypes)
  if reason is None:
    return cfg
  if impl == "auto":
    return dataclasses.replace(cfg, impl="xla")
  raise ValueError(v.pallas_refusal(reason))


def prepare(x, residual, scale, bias, *, center, residual_scale, residual_dtype, **kw):
  """Validates the arguments; returns ``(cfg, x2, r2, mask2, restore)`` (see ``_core.prepare``)."""
  v.check_floating("x", x)
  v.check_floating("residual", residual)
  v.check_residual_shape(residual.shape, x.shape)
  alpha = v.check_residual_scale(residual_scale)
  hd = _residual_dtype(x, residual, residual_dtype)
  impl = kw.get("impl", "auto")
  norm, x2, mask2, restore = _core.prepare(x, scale, bias, center=center, **kw)
  norm = _pallas_ok(norm, (("residual", jnp.dtype(residual.dtype)), ("residual_dtype", hd)), impl)
  add = AddConfig(residual_scale=alpha, h_dtype=hd, x_dtype=jnp.dtype(x.dtype),
                  residual_dtype=jnp.dtype(residual.dtype), x_vma=_jax_compat.varying_axes(x),
                  residual_vma=_jax_compat.varying_axes(residual))
  cfg = dataclasses.replace(norm, add=add)
  return cfg, x2, residual.reshape(x2.shape), mask2, restore


def _xla_add(cfg: NormConfig, x, residual):
  """h = x + alpha * residual, added in at least float32 and rounded once to ``h_dtype``."""
  ct = _xla.compute_dtype(jnp.promote_types(cfg.h_dtype, jnp.promote_types(x.dtype,
                                                                              residual.dtype)))
  r = residual.astype(ct)
  if cfg.residual_scale != 1.0:
    r = cfg.residual_scale * r
  return (x.astype(ct) + r).astype(cfg.h_dtype)


def _pallas_forward_one(cfg: NormConfig, x, residual, scale, bias):
  d = x.shape[-1]
  spec = _core.pallas_spec(cfg, x, scale, has_bias=bias is not None,
                           residual_scale=cfg.residual_scale)
  y, h, *stats = _core.kernels().forward.add_norm_forward(
      x.reshape(-1, d), residual.reshape(-1, d), _flat(scale), _flat(bias), spec=spec,
      out_dtype=cfg.out_dtype, h_dtype=cfg.h_dtype, interpret=cfg.pallas.interpret)
  return (y.reshape(x.shape), h.reshape(x.shape),
          _core.pallas_stats(cfg, x.shape[:-1] + (1,), stats))


def _pallas_forward_call(cfg: NormConfig, x, residual, scale, bias):
  """The residual add + norm forward kernel on ``(..., d)`` arrays: ``(y, h, stats)``."""
  return _core.over_heads(cfg, _pallas_forward_one, "rrpp", "rrr")(x, residual, scale, bias)


def _pallas_backward_one(cfg: NormConfig, h, scale, stats, dy, dh):
  d = h.shape[-1]
  spec = _core.pallas_spec(cfg, h, scale, has_bias=cfg.bias_dtype is not None,
                           residual_scale=cfg.residual_scale)
  shift, delta, rstd = _core.flat_stats(cfg, stats)
  dx, dres, dscale, dbias = _core.kernels().backward.add_norm_backward(
      h.reshape(-1, d), dy.reshape(-1, d), None if dh is None else dh.reshape(-1, d),
      _flat(scale), shift, delta, rstd, spec=spec, x_dtype=cfg.add.x_dtype,
      residual_dtype=cfg.add.residual_dtype, interpret=cfg.pallas.interpret)
  return (dx.reshape(h.shape), dres.reshape(h.shape),
          *_core.params_like(cfg, scale, dscale, dbias))


def _pallas_backward_call(cfg: NormConfig, h, scale, stats, dy, dh):
  """The residual add + norm backward kernels: ``(dx, dresidual, dscale, dbias)``."""
  dx, dres, dscale, dbias = _core.over_heads(cfg, _pallas_backward_one, "rprrr", "rrpp")(
      h, scale, stats, dy, dh)
  return (dx, dres, None if scale is None else _core.sum_to(dscale, scale.shape),
          None if dbias is None else _core.sum_to(dbias, cfg.bias_shape))


def _flat(p):
  return None if p is None else p.reshape(-1)


def _unfused_backward(cfg: NormConfig, h, scale, mask, stats, dy, dh):
  """The plain op's backward at ``h`` (XLA, or the plain kernels), plus ``dh`` in XLA."""
  ct = _xla.compute_dtype(h.dtype)
  # J^T dy in the compute dtype, unrounded until dh is added (one rounding per cotangent);
  # h itself goes in as stored, so the backward's barriers see it and no float32 copy of a
  # narrow h is materialized.
  dn, dscale, dbias = _core.backward(cfg, h, scale, mask, stats, dy, dx_dtype=ct)
  total = dn if dh is None else dn + dh.astype(ct)  # (..., d)
  dx = total.astype(cfg.add.x_dtype)
  if cfg.residual_scale == 1.0 and cfg.add.residual_dtype == cfg.add.x_dtype:
    dres = dx  # one array for both input cotangents
  else:
    dres = (cfg.residual_scale * total).astype(cfg.add.residual_dtype)
  return dx, dres, dscale, dbias


def _kernels(cfg: NormConfig) -> bool:
  return cfg.impl == "pallas" and cfg.add.fused_kernels


def _forward_only(cfg: NormConfig, x, residual, scale, bias, mask):
  if _kernels(cfg):
    y, h, _ = _pallas_forward_call(cfg, x, residual, scale, bias)
    return y, h
  h = _xla_add(cfg, x, residual)
  return _core.forward_only(cfg, h, scale, bias, mask), h


def forward_only(cfg: NormConfig, x, residual, scale, bias, mask):
  r"""``(y, h)``, nothing kept: the value of an undifferentiated call.

  .. math:: h = \mathrm{rd}_h(x + \alpha r), \qquad y = \mathrm{Norm}(h)
  """
  return _core.on_platform(cfg, _forward_only, x, residual, scale, bias, mask)


def _forward(cfg: NormConfig, x, residual, scale, bias, mask):
  if _kernels(cfg):
    return _pallas_forward_call(cfg, x, residual, scale, bias)
  h = _xla_add(cfg, x, residual)
  y, stats = _core.forward(cfg, h, scale, bias, mask)
  return y, h, stats


def forward(cfg: NormConfig, x, residual, scale, bias, mask):
  """``(y, h, stats)`` of ``x, residual: (..., d)`` on ``cfg.impl`` (stats: the plain op's)."""
  return _core.on_platform(cfg, _forward, x, residual, scale, bias, mask)


def _backward(cfg: NormConfig, h, scale, mask, stats, dy, dh):
  if _kernels(cfg):
    return _pallas_backward_call(cfg, h, scale, stats, dy, dh)
  return _unfused_backward(cfg, h, scale, mask, stats, dy, dh)


def backward(cfg: NormConfig, h, scale, mask, stats, dy, dh):
  r"""``(dx, dresidual, dscale, dbias)``: ``dx = dh + J^T dy``, ``dresidual = alpha dx``.

  The norm part is the plain op's backward at ``h`` (its residuals are exactly the plain op's:
  ``h``, ``scale``, the mask, the row statistics); the add contributes the identity (times
  ``alpha`` for ``residual``), so ``dh`` is added once and the sum serves both inputs. ``dh``
  None: ``h`` unused downstream (nothing added, nothing read). Every cotangent comes back in
  its primal's dtype, summed over the mesh axes its primal is replicated on.
  """
  dx, dres, dscale, dbias = _core.on_platform(cfg, _backward, h, scale, mask, stats, dy, dh)
  dscale, dbias = _core.param_cotangents(cfg, scale, dscale, dbias)
  add = cfg.add
  dx = _xla.match_vma(dx, add.x_vma)
  dres = _xla.match_vma(dres, add.residual_vma)
  return dx, dres, dscale, dbias
