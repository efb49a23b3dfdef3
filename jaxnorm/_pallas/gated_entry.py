"""Internal API: gated RMSNorm's entry in the Triton backend, the roles the backend runs
(:meth:`jaxnorm._pallas.backend.TritonBackend.role`) and the calls its kernels refuse.

The roles take the op's :class:`~jaxnorm._gated.GatedConfig` and ``(..., d)`` arrays, as the
op's XLA formulas do (:data:`jaxnorm._gated.GATED_RMS_NORM`'s ``xla_roles``), and return the
same shapes and dtypes: the rows are flattened for the kernels of :mod:`jaxnorm._pallas.gated`
and the per-group ``rstd`` reshaped back. This module imports no Pallas: the kernel module is
imported where a role runs, so asking :func:`refusal` (every ``impl="auto"`` call does) leaves
``jax.experimental.pallas`` unimported.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm import _validation as v

__all__ = ["backward", "forward", "forward_only", "gated_refusal", "refusal"]


def gated_refusal(d: int, group_size: int | None, dtype) -> str | None:
  """Why the gated kernels cannot take rows of ``d`` features in groups of ``group_size``.

  Args:
    d: the feature size (the trailing axis of ``x`` and ``z``).
    group_size: features per group, or None for one group of ``d``.
    dtype: the dtype of one input; call once per input (``x``, ``z``, ``scale``): each must be
      float32, bfloat16 or float16.

  Returns:
    The reason (a phrase without a final period), or None when the kernels can run the call.
    Any group size that divides ``d`` is taken (widths that are not powers of two are masked,
    groups wider than one block loop over column blocks).
  """
  if not isinstance(d, int) or isinstance(d, bool) or d < 1:
    return f"the gated kernels need a positive feature size d, got {d!r}"
  if group_size is not None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
      return f"the gated kernels need a positive int group_size, got {group_size!r}"
    if d % group_size:
      return (f"the gated kernels need group_size to divide the feature size: "
              f"{d} % {group_size} = {d % group_size}")
  try:
    dt = jnp.dtype(dtype)
  except TypeError:
    return f"the gated kernels take float32, bfloat16 or float16 inputs, got {dtype!r}"
  return v.kernel_problem(dtypes=(("inputs", dt),))


def refusal(x2_shape, dtype, options: dict) -> str | None:
  """Why the kernels cannot take a call on ``x2: (rows, d)`` whose inputs promote to ``dtype``
  with the op's ``options`` (``group_size``, ``norm_before_gate``: both orders are
  implemented), or None."""
  return gated_refusal(int(x2_shape[1]), options.get("group_size"), dtype)


def _rows(a):
  return a.reshape(-1, a.shape[-1])


def _kw(cfg):
  return dict(group_size=cfg.group_size, epsilon=cfg.epsilon,
              norm_before_gate=cfg.norm_before_gate, interpret=cfg.pallas.interpret,
              block=cfg.pallas.block)


def forward(cfg, x, z, scale):
  """``(y, rstd)`` from the forward kernel: ``y`` shaped like ``x`` in ``cfg.out_dtype``,
  ``rstd: (..., groups)`` in float32."""
  from jaxnorm._pallas import gated
  y, rstd = gated.gated_forward(_rows(x), _rows(z), scale, out_dtype=cfg.out_dtype, **_kw(cfg))
  return y.reshape(x.shape), rstd.reshape(x.shape[:-1] + rstd.shape[-1:])


def forward_only(cfg, x, z, scale):
  """``y`` from the forward kernel."""
  return forward(cfg, x, z, scale)[0]


def backward(cfg, x, z, scale, rstd, dy):
  """``(dx, dz, dscale)`` from the backward kernels (``dscale`` float32, None without a scale)."""
  from jaxnorm._pallas import gated
  dx, dz, dscale = gated.gated_backward(_rows(x), _rows(z), scale, _rows(rstd), _rows(dy),
                                        **_kw(cfg))
  return dx.reshape(x.shape), dz.reshape(z.shape), dscale
