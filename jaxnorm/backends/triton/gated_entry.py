"""Internal API: gated RMSNorm's entries in the Triton backend's table (the roles it runs and the
calls its kernels refuse; :data:`jaxnorm.backends.triton.backend.TRITON`).

The roles take the op's :class:`~jaxnorm._gated_op.GatedConfig` and ``(..., d)`` arrays, as
the XLA backend's entries for the op do (:mod:`jaxnorm.backends.xla.gated`), and
return the same shapes and dtypes: the rows are flattened for the kernels of
:mod:`jaxnorm.backends.triton.gated` and the per-group ``rstd`` reshaped back. This module imports
no Pallas: the kernel module is imported where a role runs, so asking :func:`refusal` (every
``impl="auto"`` call does) leaves ``jax.experimental.pallas`` unimported.
"""

from __future__ import annotations

from jaxnorm.backends.triton.config import gated_refusal

__all__ = ["ROLES", "backward", "forward", "forward_only", "refusal"]


def refusal(op, x2_shape, dtype, options: dict) -> str | None:
  """Why the kernels cannot take a call of ``op`` on ``x2: (rows, d)`` whose inputs promote to
  ``dtype`` with the op's ``options`` (:attr:`jaxnorm._gated_op.GatedOp.options`: any
  ``group_size`` the kernels tile; both orders of ``norm_before_gate`` and every ``casting``
  mode are implemented), or None."""
  del op
  return gated_refusal(int(x2_shape[1]), options.get("group_size"), dtype)


def _rows(a):
  return a.reshape(-1, a.shape[-1])


def _kw(cfg):
  return dict(group_size=cfg.group_size, epsilon=cfg.epsilon,
              norm_before_gate=cfg.norm_before_gate, interpret=cfg.backend_config.interpret,
              block=cfg.backend_config.block, cast=cfg.cast)


def forward(cfg, x, z, scale):
  """``(y, rstd)`` from the forward kernel: ``y`` shaped like ``x`` in ``cfg.out_dtype``,
  ``rstd: (..., groups)`` in float32."""
  from jaxnorm.backends.triton import gated
  y, rstd = gated.gated_forward(_rows(x), _rows(z), scale, out_dtype=cfg.out_dtype, **_kw(cfg))
  return y.reshape(x.shape), rstd.reshape(x.shape[:-1] + rstd.shape[-1:])


def forward_only(cfg, x, z, scale):
  """``y`` from the forward kernel."""
  return forward(cfg, x, z, scale)[0]


def backward(cfg, x, z, scale, rstd, dy):
  """``(dx, dz, dscale)`` from the backward kernels (``dscale`` float32, None without a scale)."""
  from jaxnorm.backends.triton import gated
  dx, dz, dscale = gated.gated_backward(_rows(x), _rows(z), scale, _rows(rstd), _rows(dy),
                                        **_kw(cfg))
  return dx.reshape(x.shape), dz.reshape(z.shape), dscale


ROLES = dict(refusal=refusal, forward_only=forward_only, forward=forward, backward=backward)
"""The op's entries in the Triton backend's table
(:data:`jaxnorm.backends.triton.backend.TRITON`)."""
