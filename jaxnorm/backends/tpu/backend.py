"""Internal API: the ``"tpu"`` backend, the Pallas TPU (Mosaic) kernels behind the interface.

:class:`TpuBackend` declares what it runs: its lowering platform (``tpu``), its config class
(:class:`~jaxnorm.backends.tpu.config.TpuConfig`), whether this JAX has Pallas TPU
(:meth:`~TpuBackend.unavailable`), and its table: LayerNorm's and RMSNorm's six roles (the plain
op and the fused residual add + norm, forward alone, forward with statistics, derived backward)
and gated RMSNorm's three (:mod:`jaxnorm.backends.tpu.gated`), each op with a ``"refusal"``
entry. Its :meth:`~TpuBackend.refusal` starts from that table, so an op without entries is
refused by name. The norm kernels implement no option of the ops (LayerNorm's fast variance,
the memory-saving backward) and no mask or ``axis_name``; per-head parameters are one more grid
axis; the casting modes are the call's plan, applied in the kernels, except a plan that rounds
to float16 (a ``ValueError``: TPUs have no float16).

:data:`AUTO_ON_TPU` is the one-line switch of issue 66's goal 4: ``impl="auto"`` on a TPU runs
XLA until the kernels have been measured there (``docs/tpu.md``). The backend declares the
platforms ``impl="auto"`` may give it as :attr:`TpuBackend.auto_platforms`: ``("tpu",)`` with the
switch on, ``()`` off; the table's per-platform choice
(:data:`jaxnorm.backends.table.PLATFORM_BACKENDS`) reads it at every call.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from jaxnorm import _validation as v
from jaxnorm._gated_op import GATED_RMS_NORM
from jaxnorm._norm_config import NormConfig
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm.backends._kernel_common import (KernelBackend, over_heads, param_sums,
                                             params_like, stats_from_kernels)
from jaxnorm.backends.tpu import compat as _compat
from jaxnorm.backends.tpu import config as _config
from jaxnorm.backends.tpu import gated as _gated
from jaxnorm.backends.tpu.tpu_call import PLATFORMS, tpu_call

__all__ = ["AUTO_ON_TPU", "TPU", "TpuBackend"]

#: Whether ``impl="auto"`` may run these kernels on a TPU. Off until a TPU has measured them
#: (``docs/tpu.md``, "Measuring").
AUTO_ON_TPU = False



def kernels():
  """The kernel module, imported on first use (it reaches Pallas through ``compat``)."""
  from jaxnorm.backends.tpu import kernels as k
  return k


def _refuse(reason: str):
  raise ValueError(v.backend_refusal("tpu", reason))


def _check_dtypes(cfg: NormConfig, x_dtype):
  """A ``ValueError`` where a dtype the kernels would store or round to is not a TPU's."""
  plan = cfg.plan(x_dtype)
  named = [("y (dtype=)", cfg.out_dtype), ("casting= rounding", plan.xhat),
           ("casting= rounding", plan.product), ("casting= rounding", plan.affine)]
  if cfg.has_add:
    named += [("h", cfg.h_dtype), ("residual", cfg.add.residual_dtype), ("x", cfg.add.x_dtype)]
  for name, dtype in named:
    why = _config.refusal_of_dtype(name, dtype)
    if why is not None:
      _refuse(why)


def check_call(cfg, x, *args):
  """A ``ValueError`` (as :func:`_spec` would raise it inside the kernels' trace) where a dtype
  of the call or the config's ``block_rows`` is one the kernels cannot take; ``x`` (or ``h``)
  is the role's first argument. ``cfg``: a norm call's :class:`NormConfig` or gated RMSNorm's
  config."""
  del args
  if not isinstance(cfg, NormConfig):
    plan = cfg.cast
    named = [("y (dtype=)", cfg.out_dtype)] + ([] if plan is None else [
        ("casting= rounding", plan.xhat), ("casting= rounding", plan.product)])
    for name, dtype in named:
      why = _config.refusal_of_dtype(name, dtype)
      if why is not None:
        _refuse(why)
    _gated._spec(cfg, x)  # block_rows
    return
  d = x.shape[-1]
  _check_dtypes(cfg, x.dtype)
  _config.block_rows(max(x.size // max(d, 1), 1), d, _row_dtypes(cfg, x), cfg.backend_config)


def _row_dtypes(cfg: NormConfig, x):
  """The dtypes of every ``(rows, d)`` operand and result of the call's kernels (``x``, ``y``
  and its cotangent, and with the residual add ``h``, ``x``'s and the residual's): the row block
  is a multiple of the largest sublane count among them."""
  add = (cfg.h_dtype, cfg.add.x_dtype, cfg.add.residual_dtype) if cfg.has_add else ()
  return (x.dtype, cfg.out_dtype) + add


def _spec(cfg: NormConfig, x, *, has_gamma: bool, has_bias: bool):
  d = x.shape[-1]
  rows = x.size // d
  tcfg = cfg.backend_config
  _check_dtypes(cfg, x.dtype)
  return kernels().Spec(
      rows=rows, d=d, width=_config.padded_width(d, tcfg.pad_features),
      block_rows=_config.block_rows(rows, d, _row_dtypes(cfg, x), tcfg),
      center=cfg.op.mean_path, has_gamma=has_gamma, has_bias=has_bias, epsilon=cfg.epsilon,
      outside=cfg.epsilon_placement == "outside", plan=cfg.plan(x.dtype),
      interpret=tcfg.interpret, op=cfg.op.name,
      residual_scale=cfg.residual_scale if cfg.has_add else 1.0, add=cfg.has_add)


def _rows(cfg: NormConfig, x, scale, bias):
  """``(gamma, bias)`` as float32 ``(1, 1, d)`` rows of one group (None where absent), formed
  in XLA as the call's plan forms gamma (``scale`` or ``1 + scale``)."""
  d = x.shape[-1]
  gam = None if scale is None else cfg.plan(x.dtype).gamma_of(
      scale.reshape(1, 1, d), cfg.zero_centered_scale).astype(jnp.float32)
  b = None if bias is None else bias.reshape(1, 1, d).astype(jnp.float32)
  return gam, b


def _stats_in(stats):
  return [s.reshape(1, -1, 1).astype(jnp.float32) for s in stats if s is not None]


def _forward_one(cfg: NormConfig, x, residual, scale, bias):
  """``(y, h, stats)`` of one head (``h`` None for the plain op)."""
  d = x.shape[-1]
  spec = _spec(cfg, x, has_gamma=scale is not None, has_bias=bias is not None)
  gam, b = _rows(cfg, x, scale, bias)
  res = kernels().launch_forward(
      x.reshape(1, -1, d), None if residual is None else residual.reshape(1, -1, d), gam, b,
      spec=spec, out_dtype=jnp.dtype(cfg.out_dtype),
      h_dtype=None if residual is None else jnp.dtype(cfg.h_dtype))
  y, h = res[0].reshape(x.shape), None
  if residual is not None:
    h = res[1].reshape(x.shape)
  return y, h, stats_from_kernels(cfg, x.shape[:-1] + (1,), res[1 + (residual is not None):])


def _backward_one(cfg: NormConfig, x, scale, stats, dy, dh, *, dx_dtype, dres_dtype):
  """``(dx, dres, dscale, dbias)`` of one head (``dres`` None unless ``dres_dtype``)."""
  d = x.shape[-1]
  spec = _spec(cfg, x, has_gamma=scale is not None, has_bias=cfg.bias_dtype is not None)
  gam, _ = _rows(cfg, x, scale, None)
  res = kernels().launch_backward(
      x.reshape(1, -1, d), dy.reshape(1, -1, d), None if dh is None else dh.reshape(1, -1, d),
      gam,
      _stats_in(stats), spec=spec, dx_dtype=jnp.dtype(dx_dtype),
      dres_dtype=None if dres_dtype is None else jnp.dtype(dres_dtype))
  dx = res[0].reshape(x.shape)
  dres = res[1].reshape(x.shape) if dres_dtype is not None else None
  return (dx, dres, *params_like(cfg, scale, res[-2], res[-1]))


class TpuBackend(KernelBackend):
  """The Pallas TPU kernels behind :class:`~jaxnorm.backends.interface.Backend`'s methods,
  called with ``cfg.impl == "tpu"`` inside :func:`jaxnorm.backends.tpu.tpu_call.tpu_call`."""

  name = "tpu"
  platforms = PLATFORMS
  config_class = _config.TpuConfig
  config_example = "jaxnorm.backends.tpu.TpuConfig(interpret=True)"
  not_implemented = "the TPU kernels do not implement {op}"
  kernels = "the TPU kernels"
  auto_on_tpu = AUTO_ON_TPU  # the switch, per instance (a test flips it)

  @property
  def auto_platforms(self) -> tuple[str, ...]:
    """The platforms ``impl="auto"`` may run these kernels on: none until the switch is on."""
    return self.platforms if self.auto_on_tpu else ()

  def unavailable(self):
    """Why this JAX cannot run the kernels (no Pallas TPU), or None."""
    return _compat.missing()

  def shape_refusal(self, x2_shape, dtype):
    """Why the kernels cannot take ``x2: (rows, d)`` of ``dtype`` (after the shared refusals of
    :class:`~jaxnorm.backends._kernel_common.KernelBackend`: the table's, a mask, ``axis_name``,
    a non-manual mesh), or None: not 2-D, then the dtype and the shape."""
    if len(tuple(x2_shape)) != 2:
      return f"the kernels take a 2-D input (rows, d), got shape {tuple(x2_shape)}"
    return _config.refusal_of_dtype("x", dtype) or _config.refusal_of_shape(x2_shape)

  def launch(self, cfg, fn, *args, elsewhere: str = "raise"):
    """``fn(cfg, *args)`` on the kernels behind :func:`~jaxnorm.backends.tpu.tpu_call.tpu_call`
    (lowered per platform), after :func:`check_call` where the call is traced."""
    return tpu_call(cfg, fn, *args, elsewhere=elsewhere, check=check_call)

  def add_refusal(self, dtypes):
    """Why the fused kernels cannot take the residual add's ``(name, dtype)`` pairs, or None."""
    return next(filter(None, (_config.refusal_of_dtype(n, dt) for n, dt in dtypes)), None)

  def forward(self, cfg, x, scale, bias, mask):
    """``(y, stats)`` from the forward kernel (no mask: refused before)."""
    del mask
    y, _, stats = over_heads(cfg, lambda c, x, s, b: _forward_one(c, x, None, s, b),
                             "rpp", "rrr")(x, scale, bias)
    return y, stats

  def backward(self, cfg, x, scale, mask, stats, dy, dx_dtype=None):
    """``(dx, dscale, dbias)`` from the backward kernel; ``dx`` in ``dx_dtype`` (None: x's)."""
    del mask
    fn = functools.partial(_backward_one, dh=None, dx_dtype=dx_dtype or x.dtype,
                           dres_dtype=None)
    dx, _, dscale, dbias = over_heads(cfg, lambda c, *a: fn(c, *a), "rprr", "rrpp")(
        x, scale, stats, dy)
    return (dx, *param_sums(cfg, scale, dscale, dbias))

  def add_forward_only(self, cfg, x, residual, scale, bias, mask):
    """``(y, h)`` from the fused forward kernel."""
    y, h, _ = self.add_forward(cfg, x, residual, scale, bias, mask)
    return y, h

  def add_forward(self, cfg, x, residual, scale, bias, mask):
    """``(y, h, stats)`` from the fused forward kernel."""
    del mask
    return over_heads(cfg, _forward_one, "rrpp", "rrr")(x, residual, scale, bias)

  def add_backward(self, cfg, h, scale, mask, stats, dy, dh):
    """``(dx, dresidual, dscale, dbias)`` from the fused backward kernel."""
    del mask
    add = cfg.add
    split = cfg.residual_scale != 1.0 or add.x_dtype != add.residual_dtype
    fn = functools.partial(_backward_one, dx_dtype=add.x_dtype,
                           dres_dtype=add.residual_dtype if split else None)
    dx, dres, dscale, dbias = over_heads(cfg, lambda c, *a: fn(c, *a), "rprrr", "rrpp")(
        h, scale, stats, dy, dh)
    return (dx, dx if not split else dres, *param_sums(cfg, scale, dscale, dbias))


TPU = TpuBackend()
for _op in (LAYER_NORM, RMS_NORM):
  TPU.register(_op.name, refusal=TPU.option_refusal, **TPU.norm_roles())
TPU.register(GATED_RMS_NORM.name, **_gated.ROLES)
