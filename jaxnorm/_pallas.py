r"""The checked kernel API: LayerNorm/RMSNorm Pallas kernels (Triton backend) on ``(rows, d)``.

Normalization is memory-bound on a GPU, so the kernels move each byte once: the forward
(:mod:`jaxnorm._pallas_forward`) reads ``x`` once and writes ``y`` and the per-row statistics;
the backward (:mod:`jaxnorm._pallas_backward`) reads ``x`` and ``dy`` once and writes ``dx``,
with ``dscale``/``dbias`` summed deterministically by a second small kernel. Feature sizes larger
than one block (``d > _pallas_config.MAX_BLOCK_D``) loop over column blocks; blocks are powers
of two and loads are masked, so any ``d`` works.

Math (the same derived formulas as the XLA path in :mod:`jaxnorm._xla`), per row, with
:math:`\gamma` = ``scale`` or ``1 + scale`` (``zero_centered_scale``) or 1:

.. math::

   K = x_0,\quad \delta = \tfrac1d\sum_i (x_i - K),\quad
   v = \tfrac1d\sum_i (x_i - K - \delta)^2,\quad
   r = \frac{1}{\sqrt{v + \epsilon}}\ \text{("inside")}\ \text{or}\
       \frac{1}{\sqrt v + \epsilon}\ \text{("outside")},

   \hat x = (x - K - \delta)\, r \ \text{(LayerNorm)},\qquad \hat x = x\, r,\ v = \tfrac1d\sum_i
   x_i^2 \ \text{(RMSNorm)},\qquad y = \gamma \odot \hat x + \beta,

   g = dy \odot \gamma,\qquad
   dx = r\Big(g - \overline{g} - c\, \hat x\, \overline{g \hat x}\Big),\qquad
   d\text{scale} = \sum_\text{rows} dy \odot \hat x,\qquad d\beta = \sum_\text{rows} dy,

where the bars are row means, :math:`\overline g` is absent for RMSNorm, and :math:`c = 1`
("inside") or :math:`c = 1/(1 - \epsilon r)` ("outside", 0 on a zero-variance row). The
variance is taken with two passes over the row held in registers; the residuals ``shift``,
``delta``, ``rstd`` mean the same thing as on the XLA path, so either backward can consume them.

This module is the boundary of the kernels used on their own (tests, benchmarks): every function
checks its arguments, then calls the unchecked launches that :mod:`jaxnorm._core` and
:mod:`jaxnorm._fused` call directly with arguments they have checked already. Block sizes come
from :func:`jaxnorm._pallas_config.default_block_config`. On a CPU the kernels run in Pallas
interpret mode (``interpret=True``; the public ops take it as
``pallas=jaxnorm.PallasConfig(interpret=True)``).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm import _validation as v
from jaxnorm._pallas_backward import add_norm_backward, norm_backward
from jaxnorm._pallas_common import kernel_spec
from jaxnorm._pallas_config import supported
from jaxnorm._pallas_forward import add_norm_forward, norm_forward

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



def _check_x(x) -> tuple[int, int]:
  v.check_floating("x", x)
  if x.ndim != 2:
    raise ValueError(f"x must be 2-D (rows, d) for the Pallas kernels, got shape {x.shape}; "
                     f"reshape it to (-1, d) first.")
  ok, reason = supported(x.shape, x.dtype)
  if not ok:
    raise ValueError(f"x of shape {x.shape} and dtype {x.dtype} is not supported: {reason}.")
  return x.shape


def _check_vector(name: str, p, n: int, what: str) -> None:
  if p is None:
    return
  v.check_floating(name, p)
  if tuple(p.shape) != (n,):
    raise ValueError(f"{name} must have shape ({n},) ({what}), got shape {tuple(p.shape)}.")


def _check_like(name: str, a, x) -> None:
  v.check_floating(name, a)
  if tuple(a.shape) != tuple(x.shape):
    raise ValueError(f"{name} must have the shape of x {tuple(x.shape)}, got {tuple(a.shape)}.")


def _spec(x, *, center, has_scale, has_bias, epsilon, epsilon_placement, zero_centered_scale,
          residual_scale=1.0):
  rows, d = x.shape
  epsilon = v.check_epsilon(epsilon)
  v.check_choice("epsilon_placement", epsilon_placement, v.EPSILON_PLACEMENTS)
  v.check_bool("zero_centered_scale", zero_centered_scale)
  return kernel_spec(rows, d, x.dtype, center=center, has_scale=has_scale, has_bias=has_bias,
                     epsilon=epsilon, epsilon_placement=epsilon_placement,
                     zero_centered_scale=zero_centered_scale, residual_scale=residual_scale)


def _out_dtype(out_dtype, x):
  dt = jnp.dtype(out_dtype if out_dtype is not None else x.dtype)
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"out_dtype must be a floating dtype, got {dt}.")
  return dt


def layer_norm_fwd(x, scale, bias, *, epsilon, epsilon_placement="inside",
                   zero_centered_scale=False, out_dtype=None, interpret=False):
  r"""Fused LayerNorm forward: ``y`` and the float32 row statistics in one pass over ``x``.

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
  rows, d = _check_x(x)
  _check_vector("scale", scale, d, "the feature size of x")
  _check_vector("bias", bias, d, "the feature size of x")
  spec = _spec(x, center=True, has_scale=scale is not None, has_bias=bias is not None,
               epsilon=epsilon, epsilon_placement=epsilon_placement,
               zero_centered_scale=zero_centered_scale)
  return norm_forward(x, scale, bias, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                      interpret=bool(interpret))


def rms_norm_fwd(x, scale, *, epsilon, epsilon_placement="inside", zero_centered_scale=False,
                 out_dtype=None, interpret=False):
  r"""Fused RMSNorm forward: ``y`` and the float32 ``rstd`` in one pass over ``x``.

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
  rows, d = _check_x(x)
  _check_vector("scale", scale, d, "the feature size of x")
  spec = _spec(x, center=False, has_scale=scale is not None, has_bias=False, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale)
  return norm_forward(x, scale, None, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                      interpret=bool(interpret))


def layer_norm_bwd(x, scale, shift, delta, rstd, dy, *, epsilon, epsilon_placement="inside",
                   zero_centered_scale=False, has_bias=True, interpret=False):
  r"""Fused LayerNorm backward from the residuals of :func:`layer_norm_fwd` (or the XLA path).

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
  rows, d = _check_x(x)
  _check_vector("scale", scale, d, "the feature size of x")
  for name, stat in (("shift", shift), ("delta", delta), ("rstd", rstd)):
    _check_vector(name, stat, rows, "one value per row of x")
  _check_like("dy", dy, x)
  spec = _spec(x, center=True, has_scale=scale is not None, has_bias=bool(has_bias),
               epsilon=epsilon, epsilon_placement=epsilon_placement,
               zero_centered_scale=zero_centered_scale)
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  return norm_backward(x, dy, scale, f32(shift), f32(delta), f32(rstd), spec=spec,
                       interpret=bool(interpret))


def rms_norm_bwd(x, scale, rstd, dy, *, epsilon, epsilon_placement="inside",
                 zero_centered_scale=False, interpret=False):
  r"""Fused RMSNorm backward from the ``rstd`` residual.

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
  rows, d = _check_x(x)
  _check_vector("scale", scale, d, "the feature size of x")
  _check_vector("rstd", rstd, rows, "one value per row of x")
  _check_like("dy", dy, x)
  spec = _spec(x, center=False, has_scale=scale is not None, has_bias=False, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale)
  dx, dscale, _ = norm_backward(x, dy, scale, None, None, rstd.astype(jnp.float32), spec=spec,
                                interpret=bool(interpret))
  return dx, dscale



def _check_dtype(name: str, dtype) -> jnp.dtype:
  reason = v.kernel_problem(dtypes=((name, dtype),))
  if reason is not None:
    raise ValueError(f"{reason}.")
  return jnp.dtype(dtype)


def _add_spec(x, residual, scale, bias, *, center, has_bias, residual_scale, epsilon,
              epsilon_placement, zero_centered_scale):
  rows, d = _check_x(x)
  _check_like("residual", residual, x)
  _check_dtype("residual", residual.dtype)
  _check_vector("scale", scale, d, "the feature size of x")
  _check_vector("bias", bias, d, "the feature size of x")
  return _spec(x, center=center, has_scale=scale is not None, has_bias=has_bias, epsilon=epsilon,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               residual_scale=v.check_residual_scale(residual_scale))


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
  spec = _add_spec(x, residual, scale, bias, center=True, has_bias=bias is not None,
                   residual_scale=residual_scale, epsilon=epsilon,
                   epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale)
  h_dtype = _check_dtype("h_dtype", h_dtype or jnp.promote_types(x.dtype, residual.dtype))
  return add_norm_forward(x, residual, scale, bias, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                          h_dtype=h_dtype, interpret=bool(interpret))


def add_rms_norm_fwd(x, residual, scale, *, epsilon, residual_scale=1.0, h_dtype=None,
                     epsilon_placement="inside", zero_centered_scale=False, out_dtype=None,
                     interpret=False):
  r"""Fused residual add + RMSNorm forward (see :func:`add_layer_norm_fwd`).

  .. math::

     h = \mathrm{round}_{h}(x + \alpha\, r), \qquad y = \gamma \odot h\, r_h

  Returns:
    ``(y, h, rstd)``.
  """
  spec = _add_spec(x, residual, scale, None, center=False, has_bias=False,
                   residual_scale=residual_scale, epsilon=epsilon,
                   epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale)
  h_dtype = _check_dtype("h_dtype", h_dtype or jnp.promote_types(x.dtype, residual.dtype))
  return add_norm_forward(x, residual, scale, None, spec=spec, out_dtype=_out_dtype(out_dtype, x),
                          h_dtype=h_dtype, interpret=bool(interpret))


def _add_bwd(h, scale, stats, dy, dh, *, center, has_bias, residual_scale, x_dtype,
             residual_dtype, epsilon, epsilon_placement, zero_centered_scale, interpret):
  rows, d = _check_x(h)
  _check_vector("scale", scale, d, "the feature size of h")
  for name, stat in zip(("shift", "delta", "rstd") if center else ("rstd",), stats):
    _check_vector(name, stat, rows, "one value per row of h")
  _check_like("dy", dy, h)
  if dh is not None:
    _check_like("dh", dh, h)
  x_dtype = _check_dtype("x_dtype", x_dtype or h.dtype)
  residual_dtype = _check_dtype("residual_dtype", residual_dtype or h.dtype)
  residual_scale = v.check_residual_scale(residual_scale)
  spec = _spec(h, center=center, has_scale=scale is not None, has_bias=bool(has_bias),
               epsilon=epsilon, epsilon_placement=epsilon_placement,
               zero_centered_scale=zero_centered_scale, residual_scale=residual_scale)
  f32 = [s.astype(jnp.float32) for s in stats]
  shift, delta, rstd = f32 if center else (None, None, f32[0])
  return add_norm_backward(h, dy, dh, scale, shift, delta, rstd, spec=spec, x_dtype=x_dtype,
                           residual_dtype=residual_dtype, interpret=bool(interpret))


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
  return _add_bwd(h, scale, (shift, delta, rstd), dy, dh, center=True, has_bias=has_bias,
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
      h, scale, (rstd,), dy, dh, center=False, has_bias=False, residual_scale=residual_scale,
      x_dtype=x_dtype, residual_dtype=residual_dtype, epsilon=epsilon,
      epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
      interpret=interpret)
  return dx, dres, dscale
