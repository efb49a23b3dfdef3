r"""Test helper: the checked kernel API, LayerNorm/RMSNorm Pallas kernels on ``(rows, d)``.

It lived in the library as ``jaxnorm.backends.triton.api``; only the tests use it, and it imports the
ops' argument preparation, above the kernels, so it is here (issue 45).

Normalization is memory-bound on a GPU, so the kernels move each byte once: the forward
(:mod:`jaxnorm.backends.triton.forward`) reads ``x`` once and writes ``y`` and the per-row statistics;
the backward (:mod:`jaxnorm.backends.triton.backward`) reads ``x`` and ``dy`` once and writes ``dx``,
with ``dscale``/``dbias`` summed deterministically by a second small kernel. Feature sizes larger
than one block (``d > config.MAX_BLOCK_D``) loop over column blocks; blocks are powers
of two and loads are masked, so any ``d`` works.

The kernels compute the same derived formulas as the XLA path (:mod:`jaxnorm.backends.xla.formulas`): the
shifted-data statistics with the row's first element as pivot, the forward, and the backward's
direct, mean and variance paths, as derived in ``docs/derivations.md`` (in a kernel the
variance takes two passes over the row held in registers). The residuals ``shift``,
``delta``, ``rstd`` mean the same thing on both paths, so either backward can consume them.

This module is the boundary of the kernels used on their own (tests): every function
describes its call with the ops' own :func:`jaxnorm.ops.norm.args.prepare` (one check per rule, the
same messages as the ops), checks what only this API takes (2-D ``x``, per-row statistics,
cotangents), and launches the kernels from the launch spec the ops derive
(:func:`jaxnorm.backends.triton.backend.kernel_spec`). Block sizes come
from :func:`jaxnorm.backends.triton.config.default_block_config`. On a CPU the kernels run in Pallas
interpret mode (``interpret=True``; the public ops take it as
``pallas=jaxnorm.PallasConfig(interpret=True)``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxnorm.ops.norm import args as _norm_args
from jaxnorm import _validation as v
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm.backends.triton.backend import kernel_spec
from jaxnorm.backends.triton.backward import add_norm_backward, norm_backward
from jaxnorm.backends.triton.config import PallasConfig, kernel_problem, supported
from jaxnorm.backends.triton.forward import add_norm_forward, norm_forward

__all__ = [
    "add_layer_norm_bwd",
    "add_layer_norm_fwd",
    "add_rms_norm_bwd",
    "add_rms_norm_fwd",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "rms_norm_bwd",
    "rms_norm_fwd",
]


def _spec(x, scale, bias, *, op, epsilon, epsilon_placement, zero_centered_scale, interpret,
          has_bias=None, residual_scale=1.0, x_name="x"):
  """The launch spec of a kernel-API call, from the ops' own :func:`jaxnorm.ops.norm.args.prepare`.

  One description of a call and one check per rule: ``prepare`` checks ``x``, ``scale``, ``bias``,
  ``epsilon`` and the choices exactly as for the public ops and builds the
  :class:`~jaxnorm._norm_config.NormConfig` that :func:`jaxnorm.backends.triton.backend.kernel_spec` turns
  into the launch spec, as the ops do. What is the kernel API's own contract is checked here on
  top: ``x`` is 2-D, non-empty and of a dtype the kernels take
  (:func:`jaxnorm.backends.triton.config.supported`, the ops' own statement of it), and the parameters are
  one ``(d,)`` row (no per-head parameters: map the kernels over heads yourself). Whether the
  platform compiles the kernels is Pallas's to say when the call is lowered (``interpret=True``
  runs anywhere).
  ``has_bias``: whether the spec has a bias (a backward's ``dbias``); default ``bias is not
  None``. ``x_name``: what the messages call ``x`` (``h`` in the fused backward).
  """
  v.check_bool("interpret", interpret)
  cfg, _, _, _ = _norm_args.prepare(
      x, scale, bias, op=op, epsilon=epsilon, axis=-1, mask=None,
      epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
      axis_name=None, axis_index_groups=None, dtype=None, impl="xla", x_name=x_name)
  if x.ndim != 2:
    raise ValueError(f"{x_name} must be 2-D (rows, d) for the Pallas kernels, got shape "
                     f"{tuple(x.shape)}; reshape it to (-1, d) first.")
  ok, reason = supported(x.shape, x.dtype)
  if not ok:
    raise ValueError(f"{x_name} of shape {tuple(x.shape)} and dtype {x.dtype} is not supported "
                     f"by the Pallas kernels: {reason}.")
  if cfg.heads:
    raise ValueError(f"scale and bias of the kernel functions must have shape ({x.shape[1]},) "
                     f"(one row shared by every row of {x_name}), got "
                     f"{[None if p is None else tuple(p.shape) for p in (scale, bias)]}; map "
                     f"the kernels over the heads for per-head parameters.")
  # The Triton backend's own view of the call: its config alone (as the dispatch hands it over).
  cfg = dataclasses.replace(cfg, backend_config=PallasConfig())
  return kernel_spec(cfg, x, scale, has_bias=bias is not None if has_bias is None
                     else v.check_bool("has_bias", has_bias),
                     residual_scale=residual_scale)


def _check_rows(name: str, stat, rows: int, x_name: str = "x") -> None:
  """A per-row statistic: floating, shape ``(rows,)``."""
  v.check_floating(name, stat)
  if tuple(stat.shape) != (rows,):
    raise ValueError(f"{name} must have shape ({rows},) (one value per row of {x_name}), got "
                     f"shape {tuple(stat.shape)}.")


def _check_like(name: str, a, x, x_name: str = "x") -> None:
  """A cotangent: floating, the shape of ``x``."""
  v.check_floating(name, a)
  if tuple(a.shape) != tuple(x.shape):
    raise ValueError(f"{name} must have the shape of {x_name} {tuple(x.shape)}, got "
                     f"{tuple(a.shape)}.")


def _out_dtype(out_dtype, x):
  """``y``'s dtype: ``out_dtype`` checked, default ``x.dtype``."""
  dt = v.check_out_dtype("out_dtype", out_dtype)
  return jnp.dtype(x.dtype) if dt is None else dt


def layer_norm_fwd(x, scale, bias, *, epsilon, epsilon_placement="inside",
                   zero_centered_scale=False, out_dtype=None, interpret=False):
  r"""LayerNorm forward kernel: ``y`` and the float32 row statistics in one pass over ``x``.

  .. math::

     y = \gamma \odot (x - K - \delta)\, r + \beta, \quad K = x_{:,0},\
     \delta = \overline{x - K},\ r = (v + \epsilon)^{-1/2} \text{ or } (\sqrt v + \epsilon)^{-1}

  Args:
    x: ``(rows, d)`` float32, bfloat16 or float16.
    scale: ``(d,)`` or None.
    bias: ``(d,)`` or None.
    epsilon: non-negative Python float.
    epsilon_placement: "inside" (``rsqrt(var + eps)``) or "outside" (``1/(sqrt(var) + eps)``).
    zero_centered_scale: multiply by ``1 + scale`` instead of ``scale``.
    out_dtype: dtype of ``y`` (default: ``x.dtype``).
    interpret: run the kernels in Pallas interpret mode (any backend, slow).

  Returns:
    ``(y, shift, delta, rstd)``: ``y: (rows, d)`` in ``out_dtype``; ``shift`` (the pivot
    ``x[:, 0]``), ``delta`` (mean of ``x - shift``) and ``rstd``, each float32 ``(rows,)``. The
    row mean is ``shift + delta``.
  """
  spec = _spec(x, scale, bias, op=LAYER_NORM, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               interpret=interpret)
  return norm_forward(x, scale, bias, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                      interpret=interpret)


def rms_norm_fwd(x, scale, *, epsilon, epsilon_placement="inside", zero_centered_scale=False,
                 out_dtype=None, interpret=False):
  r"""RMSNorm forward kernel: ``y`` and the float32 ``rstd`` in one pass over ``x``.

  .. math::

     y = \gamma \odot x\, r, \quad r = (\overline{x^2} + \epsilon)^{-1/2} \text{ or }
     (\sqrt{\overline{x^2}} + \epsilon)^{-1}

  Args:
    x: ``(rows, d)`` float32, bfloat16 or float16.
    scale: ``(d,)`` or None.
    epsilon: non-negative Python float.
    epsilon_placement: "inside" or "outside" (see :func:`layer_norm_fwd`).
    zero_centered_scale: multiply by ``1 + scale`` instead of ``scale``.
    out_dtype: dtype of ``y`` (default: ``x.dtype``).
    interpret: run the kernels in Pallas interpret mode.

  Returns:
    ``(y, rstd)``: ``y: (rows, d)`` in ``out_dtype``, ``rstd`` float32 ``(rows,)``.
  """
  spec = _spec(x, scale, None, op=RMS_NORM, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               interpret=interpret)
  return norm_forward(x, scale, None, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                      interpret=interpret)


def layer_norm_bwd(x, scale, shift, delta, rstd, dy, *, epsilon, epsilon_placement="inside",
                   zero_centered_scale=False, has_bias=True, interpret=False):
  r"""LayerNorm backward kernels from the residuals of :func:`layer_norm_fwd` (or the XLA path).

  .. math::

     \hat x = (x - K - \delta)\, r,\quad g = dy \odot \gamma,\quad
     dx = r\big(g - \overline g - c\,\hat x\,\overline{g\hat x}\big),\quad
     d\text{scale} = \textstyle\sum_\text{rows} dy \odot \hat x,\quad
     d\beta = \textstyle\sum_\text{rows} dy

  with :math:`c = 1` ("inside") or :math:`1/(1 - \epsilon r)` ("outside", 0 where that
  denominator is not positive).

  Args:
    x: ``(rows, d)`` primal input.
    scale: ``(d,)`` or None.
    shift, delta, rstd: float32 ``(rows,)`` statistics (see :func:`layer_norm_fwd`).
    dy: ``(rows, d)`` cotangent of ``y``.
    epsilon, epsilon_placement, zero_centered_scale: as in the forward.
    has_bias: whether to compute ``dbias``.
    interpret: run the kernels in Pallas interpret mode.

  Returns:
    ``(dx, dscale, dbias)``: ``dx`` in ``x.dtype``; ``dscale`` in ``scale.dtype`` or None;
    ``dbias`` float32 ``(d,)`` (the bias is not an input; the caller casts it) or None.
  """
  spec = _spec(x, scale, None, op=LAYER_NORM, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               interpret=interpret, has_bias=has_bias)
  for name, stat in (("shift", shift), ("delta", delta), ("rstd", rstd)):
    _check_rows(name, stat, spec.rows)
  _check_like("dy", dy, x)
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  return norm_backward(x, dy, scale, f32(shift), f32(delta), f32(rstd), spec=spec,
                       interpret=interpret)


def rms_norm_bwd(x, scale, rstd, dy, *, epsilon, epsilon_placement="inside",
                 zero_centered_scale=False, interpret=False):
  r"""RMSNorm backward kernels from the ``rstd`` residual.

  .. math::

     \hat x = x\, r,\quad g = dy \odot \gamma,\quad
     dx = r\big(g - c\,\hat x\,\overline{g\hat x}\big),\quad
     d\text{scale} = \textstyle\sum_\text{rows} dy \odot \hat x

  Args:
    x: ``(rows, d)`` primal input.
    scale: ``(d,)`` or None.
    rstd: float32 ``(rows,)``.
    dy: ``(rows, d)`` cotangent of ``y``.
    epsilon, epsilon_placement, zero_centered_scale: as in the forward.
    interpret: run the kernels in Pallas interpret mode.

  Returns:
    ``(dx, dscale)``: ``dx`` in ``x.dtype``; ``dscale`` in ``scale.dtype`` or None.
  """
  spec = _spec(x, scale, None, op=RMS_NORM, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               interpret=interpret)
  _check_rows("rstd", rstd, spec.rows)
  _check_like("dy", dy, x)
  dx, dscale, _ = norm_backward(x, dy, scale, None, None, rstd.astype(jnp.float32), spec=spec,
                                interpret=interpret)
  return dx, dscale



def _check_dtype(name: str, dtype) -> jnp.dtype:
  """A dtype the kernels store (``h_dtype``, the cotangents' dtypes)."""
  reason = kernel_problem(dtypes=((name, dtype),))
  if reason is not None:
    raise ValueError(f"{reason}.")
  return jnp.dtype(dtype)


def _add_fwd(x, residual, scale, bias, *, op, residual_scale, h_dtype, epsilon,
             epsilon_placement, zero_centered_scale, out_dtype, interpret):
  """The checks and the launch of both fused residual add + norm forwards.

  :func:`_spec` of the forward, ``residual`` checked as the fused ops do, ``h_dtype`` defaulted
  to the promoted dtype of ``x`` and ``residual``; returns :func:`add_norm_forward`'s tuple.
  """
  spec = _spec(x, scale, bias, op=op, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               interpret=interpret, residual_scale=v.check_residual_scale(residual_scale))
  v.check_floating("residual", residual)
  v.check_residual_shape(residual.shape, x.shape)
  _check_dtype("residual", residual.dtype)
  h_dtype = _check_dtype("h_dtype", h_dtype or jnp.promote_types(x.dtype, residual.dtype))
  return add_norm_forward(x, residual, scale, bias, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                          h_dtype=h_dtype, interpret=interpret)


def add_layer_norm_fwd(x, residual, scale, bias, *, epsilon, residual_scale=1.0, h_dtype=None,
                       epsilon_placement="inside", zero_centered_scale=False, out_dtype=None,
                       interpret=False):
  r"""Fused residual add + LayerNorm forward: one read of ``x`` and ``residual``, one write of
  ``h``, ``y`` and the row statistics.

  .. math::

     h = \mathrm{round}_{h}(x + \alpha\, r), \qquad y = \gamma \odot (h - K - \delta)\, r_h + \beta

  with the statistics of :func:`layer_norm_fwd` taken of the rounded ``h`` (``alpha`` is
  ``residual_scale``, the add runs in float32 and is rounded once to ``h_dtype``).

  Args:
    x: ``(rows, d)`` float32, bfloat16 or float16.
    residual: ``(rows, d)``, the same shape, float32, bfloat16 or float16.
    scale: ``(d,)`` or None.
    bias: ``(d,)`` or None.
    epsilon: non-negative Python float.
    residual_scale: Python float :math:`\alpha` multiplying ``residual``.
    h_dtype: dtype of ``h`` (default: the promoted dtype of ``x`` and ``residual``).
    epsilon_placement: "inside" or "outside".
    zero_centered_scale: multiply by ``1 + scale`` instead of ``scale``.
    out_dtype: dtype of ``y`` (default: ``x.dtype``).
    interpret: run the kernels in Pallas interpret mode.

  Returns:
    ``(y, h, shift, delta, rstd)``: ``y`` in ``out_dtype``, ``h`` in ``h_dtype``, and the float32
    ``(rows,)`` statistics of ``h`` as in :func:`layer_norm_fwd`.
  """
  return _add_fwd(x, residual, scale, bias, op=LAYER_NORM, residual_scale=residual_scale,
                  h_dtype=h_dtype, epsilon=epsilon, epsilon_placement=epsilon_placement,
                  zero_centered_scale=zero_centered_scale, out_dtype=out_dtype,
                  interpret=interpret)


def add_rms_norm_fwd(x, residual, scale, *, epsilon, residual_scale=1.0, h_dtype=None,
                     epsilon_placement="inside", zero_centered_scale=False, out_dtype=None,
                     interpret=False):
  r"""Fused residual add + RMSNorm forward (see :func:`add_layer_norm_fwd`).

  .. math::

     h = \mathrm{round}_{h}(x + \alpha\, r), \qquad y = \gamma \odot h\, r_h

  Returns:
    ``(y, h, rstd)``.
  """
  return _add_fwd(x, residual, scale, None, op=RMS_NORM, residual_scale=residual_scale,
                  h_dtype=h_dtype, epsilon=epsilon, epsilon_placement=epsilon_placement,
                  zero_centered_scale=zero_centered_scale, out_dtype=out_dtype,
                  interpret=interpret)


def _add_bwd(h, scale, stats, dy, dh, *, op, has_bias, residual_scale, x_dtype,
             residual_dtype, epsilon, epsilon_placement, zero_centered_scale, interpret):
  """The checks and the launch of both fused backwards (``h`` in the role of ``x``)."""
  spec = _spec(h, scale, None, op=op, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               interpret=interpret, has_bias=has_bias,
               residual_scale=v.check_residual_scale(residual_scale), x_name="h")
  for name, stat in zip(op.residuals, stats):
    _check_rows(name, stat, spec.rows, "h")
  _check_like("dy", dy, h, "h")
  if dh is not None:
    _check_like("dh", dh, h, "h")
  x_dtype = _check_dtype("x_dtype", x_dtype or h.dtype)
  residual_dtype = _check_dtype("residual_dtype", residual_dtype or h.dtype)
  f32 = [s.astype(jnp.float32) for s in stats]
  named = dict(zip(op.residuals, f32))
  shift, delta, rstd = (named.get(k) for k in ("shift", "delta", "rstd"))
  return add_norm_backward(h, dy, dh, scale, shift, delta, rstd, spec=spec, x_dtype=x_dtype,
                           residual_dtype=residual_dtype, interpret=interpret)


def add_layer_norm_bwd(h, scale, shift, delta, rstd, dy, dh, *, epsilon, residual_scale=1.0,
                       x_dtype=None, residual_dtype=None, epsilon_placement="inside",
                       zero_centered_scale=False, has_bias=True, interpret=False):
  r"""Fused residual add + LayerNorm backward: reads ``h``, ``dy`` and ``dh``, writes ``dx`` once.

  .. math::

     dx = dh + r\big(g - \overline g - c\,\hat x\,\overline{g\hat x}\big), \qquad
     d\text{residual} = \alpha\, dx

  (the LayerNorm backward of :func:`layer_norm_bwd` at ``h``, plus the cotangent of ``h``).
  When ``residual_scale == 1`` and both dtypes agree, ``dresidual`` *is* ``dx`` (one array);
  otherwise the kernel writes both from the same registers.

  Args:
    h: ``(rows, d)`` the ``h`` of the forward.
    scale: ``(d,)`` or None.
    shift, delta, rstd: float32 ``(rows,)`` statistics of ``h``.
    dy: ``(rows, d)`` cotangent of ``y``.
    dh: ``(rows, d)`` cotangent of ``h``, or None for zero.
    epsilon, epsilon_placement, zero_centered_scale: as in the forward.
    residual_scale: the forward's :math:`\alpha`.
    x_dtype, residual_dtype: dtypes of the two input cotangents (default ``h.dtype``).
    has_bias: whether to compute ``dbias``.
    interpret: run the kernels in Pallas interpret mode.

  Returns:
    ``(dx, dresidual, dscale, dbias)``; ``dbias`` in float32 (the caller casts it) or None.
  """
  return _add_bwd(h, scale, (shift, delta, rstd), dy, dh, op=LAYER_NORM, has_bias=has_bias,
                  residual_scale=residual_scale, x_dtype=x_dtype, residual_dtype=residual_dtype,
                  epsilon=epsilon, epsilon_placement=epsilon_placement,
                  zero_centered_scale=zero_centered_scale, interpret=interpret)


def add_rms_norm_bwd(h, scale, rstd, dy, dh, *, epsilon, residual_scale=1.0, x_dtype=None,
                     residual_dtype=None, epsilon_placement="inside", zero_centered_scale=False,
                     interpret=False):
  r"""Fused residual add + RMSNorm backward (see :func:`add_layer_norm_bwd`).

  .. math::

     dx = dh + r\big(g - c\,\hat x\,\overline{g\hat x}\big), \qquad d\text{residual} = \alpha\, dx

  Returns:
    ``(dx, dresidual, dscale)``.
  """
  dx, dres, dscale, _ = _add_bwd(
      h, scale, (rstd,), dy, dh, op=RMS_NORM, has_bias=False, residual_scale=residual_scale,
      x_dtype=x_dtype, residual_dtype=residual_dtype, epsilon=epsilon,
      epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
      interpret=interpret)
  return dx, dres, dscale
