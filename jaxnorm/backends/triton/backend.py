"""Internal API: the ``"triton"`` entry of the backend table (alias ``"pallas"``), the Triton
kernels written in Pallas behind it.

Launches the kernels of :mod:`jaxnorm.backends.triton.forward` and
:mod:`jaxnorm.backends.triton.backward` on ``(..., d)`` arrays: the rows flattened, the launch spec
derived from the call's :class:`~jaxnorm._norm_config.NormConfig`, the per-row statistics reshaped
to the XLA backend's ``(..., 1)`` layout (either backward consumes either forward's statistics),
per-head parameters mapped as one more grid axis. The residual add + norm runs the fused kernels
(one read of ``x`` and ``residual``) unless ``cfg.backend_config`` is a
:class:`DecomposedAddConfig` (the
decomposition the tests compare them with). The kernel modules are imported on first use
(:func:`kernels`), so this module and the table that holds it leave ``jax.experimental.pallas``
unimported.

:class:`TritonBackend` declares what it runs: its lowering platforms (:data:`PLATFORMS`), its
config class (:class:`~jaxnorm.backends.triton.config.PallasConfig`) and its table (:data:`TRITON`'s
``table``): LayerNorm's and RMSNorm's roles (the methods below; the kernels centre a row where the
op's declaration has ``mean_path``) and gated RMSNorm's
(:mod:`jaxnorm.backends.triton.gated_entry`), each op with a ``"refusal"`` entry.
:meth:`TritonBackend.refusal` says why it cannot take a call, an op without an entry first. The
choice of backend is :func:`jaxnorm.backends.table.resolve_impl`'s.
"""

from __future__ import annotations

import dataclasses
import types

import jax.numpy as jnp

from jaxnorm._gated_op import GATED_RMS_NORM
from jaxnorm._norm_config import NormConfig
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm.backends._kernel_common import (KernelBackend, over_heads, param_sums,
                                             params_like, stats_from_kernels)
from jaxnorm.backends.triton import compat as _compat
from jaxnorm.backends.triton import config as _config
from jaxnorm.backends.triton import gated_entry as _gated
from jaxnorm.backends.triton.kernel_call import kernel_call

__all__ = ["PLATFORMS", "TRITON", "DecomposedAddConfig", "TritonBackend", "kernels",
           "kernel_spec"]

# The lowering platforms the Triton kernels compile for (elsewhere: interpret mode only).
PLATFORMS = _config.GPU_PLATFORMS



def kernels():
  """The kernel modules (``common``, ``forward``, ``backward``), imported on first use.

  Only a kernel launch or lowering needs ``jax.experimental.pallas``: ``import jaxnorm`` and
  every XLA-path call leave it unimported (its API moves between JAX releases, and importing it
  costs time on every start).
  """
  from jaxnorm.backends.triton import backward, common, forward
  return types.SimpleNamespace(common=common, forward=forward, backward=backward)


def kernel_spec(cfg: NormConfig, x, scale, *, has_bias: bool, residual_scale: float = 1.0):
  """The kernels' launch spec for ``x: (..., d)`` from a checked config (no re-validation).

  ``cfg.op`` is one of the norm ops in the backend's table (:meth:`TritonBackend.refusal`
  refuses any other before a launch); the kernels centre the rows where it has ``mean_path``.
  """
  d = x.shape[-1]
  return kernels().common.kernel_spec(
      x.size // d, d, x.dtype, center=cfg.op.mean_path, has_scale=scale is not None,
      has_bias=has_bias, epsilon=cfg.epsilon, epsilon_placement=cfg.epsilon_placement,
      zero_centered_scale=cfg.zero_centered_scale, residual_scale=residual_scale,
      block=cfg.backend_config.block, cast=cfg.cast, op=cfg.op.name)


def stats_for_kernels(stats):
  """``(shift, delta, rstd)`` of shape ``(..., 1)`` as the kernels' float32 ``(rows,)``."""
  return tuple(None if s is None else s.reshape(-1).astype(jnp.float32) for s in stats)


def _flat(p):
  return None if p is None else p.reshape(-1)


# One head's launches (:func:`over_heads` maps them over the per-head axes).


def _forward_one(cfg: NormConfig, x, scale, bias):
  d = x.shape[-1]
  spec = kernel_spec(cfg, x, scale, has_bias=bias is not None)
  y, *stats = kernels().forward.norm_forward(
      x.reshape(-1, d), _flat(scale), _flat(bias), spec=spec, out_dtype=cfg.out_dtype,
      interpret=cfg.backend_config.interpret)
  return y.reshape(x.shape), stats_from_kernels(cfg, x.shape[:-1] + (1,), stats)


def _backward_one(cfg: NormConfig, x, scale, stats, dy):
  d = x.shape[-1]
  spec = kernel_spec(cfg, x, scale, has_bias=cfg.bias_dtype is not None)
  shift, delta, rstd = stats_for_kernels(stats)
  dx, dscale, dbias = kernels().backward.norm_backward(
      x.reshape(-1, d), dy.reshape(-1, d), _flat(scale), shift, delta, rstd, spec=spec,
      interpret=cfg.backend_config.interpret)
  return (dx.reshape(x.shape), *params_like(cfg, scale, dscale, dbias))


def _add_forward_one(cfg: NormConfig, x, residual, scale, bias):
  d = x.shape[-1]
  spec = kernel_spec(cfg, x, scale, has_bias=bias is not None, residual_scale=cfg.residual_scale)
  y, h, *stats = kernels().forward.add_norm_forward(
      x.reshape(-1, d), residual.reshape(-1, d), _flat(scale), _flat(bias), spec=spec,
      out_dtype=cfg.out_dtype, h_dtype=cfg.h_dtype, interpret=cfg.backend_config.interpret)
  return (y.reshape(x.shape), h.reshape(x.shape),
          stats_from_kernels(cfg, x.shape[:-1] + (1,), stats))


def _add_backward_one(cfg: NormConfig, h, scale, stats, dy, dh):
  d = h.shape[-1]
  spec = kernel_spec(cfg, h, scale, has_bias=cfg.bias_dtype is not None,
                     residual_scale=cfg.residual_scale)
  shift, delta, rstd = stats_for_kernels(stats)
  dx, dres, dscale, dbias = kernels().backward.add_norm_backward(
      h.reshape(-1, d), dy.reshape(-1, d), None if dh is None else dh.reshape(-1, d),
      _flat(scale), shift, delta, rstd, spec=spec, x_dtype=cfg.add.x_dtype,
      residual_dtype=cfg.add.residual_dtype, interpret=cfg.backend_config.interpret)
  return (dx.reshape(h.shape), dres.reshape(h.shape),
          *params_like(cfg, scale, dscale, dbias))


class TritonBackend(KernelBackend):
  """The Triton kernels behind :class:`~jaxnorm.backends.interface.Backend`'s methods.

  Called with ``cfg.impl == "triton"``, inside
  :func:`jaxnorm.backends.triton.kernel_call.kernel_call` (:func:`jaxnorm.backends.table.run` puts
  it there).
  """

  name = "triton"
  platforms = PLATFORMS
  config_class = _config.PallasConfig
  config_example = "jaxnorm.PallasConfig(interpret=True)"
  not_implemented = "the Pallas kernels do not implement {op}"
  kernels = "the Pallas kernels"

  def unavailable(self):
    """Why this JAX cannot run the kernels (its Pallas has no Triton backend), or None
    (:func:`jaxnorm.backends.triton.compat.missing`, which imports no Pallas)."""
    return _compat.missing()

  def shape_refusal(self, x2_shape, dtype):
    """Why the kernels cannot take ``x2: (rows, d)`` of ``dtype``, or None
    (:func:`~jaxnorm.backends.triton.config.supported`). Asked last by
    :meth:`~jaxnorm.backends._kernel_common.KernelBackend.refusal`, after the table's refusal
    (an op without entries by name; the norm ops: no option away from its default), a mask,
    ``axis_name`` and a non-manual mesh."""
    ok, reason = _config.supported(x2_shape, dtype)
    return None if ok else reason

  # fn(cfg, *args) behind the kernel-call primitive, lowered per platform: the primitive's own
  # function, so that a call enters this module once (its table's entry), not twice.
  launch = staticmethod(kernel_call)

  def add_refusal(self, dtypes):
    """Why the fused kernels cannot take the residual add's ``(name, dtype)`` pairs, or None."""
    return _config.kernel_problem(dtypes=dtypes)

  def forward(self, cfg, x, scale, bias, mask):
    """``(y, stats)`` from the forward kernel (no mask: refused at preparation)."""
    del mask
    return over_heads(cfg, _forward_one, "rpp", "rr")(x, scale, bias)

  def backward(self, cfg, x, scale, mask, stats, dy, dx_dtype=None):
    """``(dx, dscale, dbias)`` from the backward kernels."""
    del mask
    dx, dscale, dbias = over_heads(cfg, _backward_one, "rprr", "rpp")(x, scale, stats, dy)
    dx = dx.astype(x.dtype if dx_dtype is None else dx_dtype)
    return (dx, *param_sums(cfg, scale, dscale, dbias))

  def add_forward_only(self, cfg, x, residual, scale, bias, mask):
    """``(y, h)`` from the fused forward kernel."""
    if not _fused_add(cfg):
      return super().add_forward_only(cfg, x, residual, scale, bias, mask)
    y, h, _ = self.add_forward(cfg, x, residual, scale, bias, mask)
    return y, h

  def add_forward(self, cfg, x, residual, scale, bias, mask):
    """``(y, h, stats)`` from the fused forward kernel."""
    if not _fused_add(cfg):
      return super().add_forward(cfg, x, residual, scale, bias, mask)
    return over_heads(cfg, _add_forward_one, "rrpp", "rrr")(x, residual, scale, bias)

  def add_backward(self, cfg, h, scale, mask, stats, dy, dh):
    """``(dx, dresidual, dscale, dbias)`` from the fused backward kernels."""
    if not _fused_add(cfg):
      return super().add_backward(cfg, h, scale, mask, stats, dy, dh)
    dx, dres, dscale, dbias = over_heads(cfg, _add_backward_one, "rprrr", "rrpp")(
        h, scale, stats, dy, dh)
    return (dx, dres, *param_sums(cfg, scale, dscale, dbias))


@dataclasses.dataclass(frozen=True)
class DecomposedAddConfig(_config.PallasConfig):
  """A :class:`~jaxnorm.backends.triton.config.PallasConfig` under which the residual add + norm
  runs as the add in XLA and the plain op's kernels instead of the fused kernels: the decomposition
  the tests compare the fused kernels with. Not public. A distinct class, so a config of either kind
  is a distinct static argument (no cached program of one is reused for the other)."""

  @classmethod
  def of(cls, pallas: _config.PallasConfig) -> "DecomposedAddConfig":
    """The same kernel settings (interpret, block) as ``pallas``, with the add decomposed."""
    return cls(**{f.name: getattr(pallas, f.name) for f in dataclasses.fields(pallas)})


def _fused_add(cfg: NormConfig) -> bool:
  """Whether the residual add + norm of ``cfg`` runs the fused kernels (see DecomposedAddConfig)."""
  return not isinstance(cfg.backend_config, DecomposedAddConfig)


TRITON = TritonBackend()
for _op in (LAYER_NORM, RMS_NORM):
  TRITON.register(_op.name, refusal=TRITON.option_refusal, **TRITON.norm_roles())
TRITON.register(GATED_RMS_NORM.name, **_gated.ROLES)
