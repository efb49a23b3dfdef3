r"""Internal API: the forward Pallas kernels, plain norm and residual add + norm side by side.

One program per tile of ``block_rows`` rows: one read of the input, the row statistics in
float32 registers, one write of ``y`` and of the per-row statistics. Per row of ``d`` features:

.. math::

   K = x_0,\quad \delta = \tfrac1d\sum_i (x_i - K),\quad
   v = \tfrac1d\sum_i (x_i - K - \delta)^2,\quad \hat x = (x - K - \delta)\, r
   \quad\text{(LayerNorm)},\qquad v = \tfrac1d\sum_i x_i^2,\ \hat x = x\, r
   \quad\text{(RMSNorm)},\qquad y = \gamma \odot \hat x + \beta.

:func:`add_norm_forward_kernel` normalizes :math:`h = \mathrm{round}_h(x + \alpha\, r)` (the add
in float32, rounded once to ``h``'s dtype, so the statistics are those of the stored ``h``) and
writes ``h`` beside ``y``. Both kernels run the same per-tile body, :func:`_normalize_tile`.
The launches :func:`norm_forward` and :func:`add_norm_forward` trust their arguments.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxnorm.backends.triton import compat as pl

from jaxnorm.backends.triton.common import KernelSpec, col_loop, compiler_params, gamma_row
from jaxnorm.backends.triton.common import load, rstd
from jaxnorm.backends.triton.common import iota, plan_of, tile


def _row_statistics(spec: KernelSpec, load_x, x0, mask0):
  """``(shift, delta, rstd)`` (LayerNorm) or ``(None, None, rstd)`` of a tile, each ``(br,)``."""
  d = spec.d
  single = spec.block.num_col_blocks == 1
  row = (lambda col0: (x0, mask0)) if single else load_x  # noqa: E731
  if not spec.center:

    def sq_body(col0, acc):
      x, _ = row(col0)
      return acc + x * x

    var = jnp.sum(col_loop(spec, sq_body, jnp.zeros_like(x0)), axis=1) / d
    return None, None, rstd(spec, var)
  # Pivot K = x[:, 0] (column 0 is always in the first block).
  first = iota(spec.block.block_d)[None, :] == 0
  shift = jnp.sum(jnp.where(first, x0, 0.0), axis=1)  # (br,)

  def sum_body(col0, acc):
    x, mask = row(col0)
    return acc + jnp.where(mask, x - shift[:, None], 0.0)

  delta = jnp.sum(col_loop(spec, sum_body, jnp.zeros_like(x0)), axis=1) / d  # (br,)

  def var_body(col0, acc):
    x, mask = row(col0)
    xc = jnp.where(mask, (x - shift[:, None]) - delta[:, None], 0.0)
    return acc + xc * xc

  var = jnp.sum(col_loop(spec, var_body, jnp.zeros_like(x0)), axis=1) / d
  return shift, delta, rstd(spec, var)


def _normalize_tile(spec: KernelSpec, load_x, scale_ref, bias_ref, y_ref, stat_refs,
                    h_ref=None):
  """The per-tile body of both forward kernels: statistics, then ``y`` (and ``h``) per block.

  ``load_x(col0) -> (x, mask)`` reads the normalized row's column block in float32 (``x`` or
  the rounded ``h``); ``h_ref`` (the residual add) also receives that row.
  """
  row0 = pl.program_id(0) * spec.block.block_rows
  rows_ds, _, row_ok, _, _ = tile(spec, row0, 0)
  single = spec.block.num_col_blocks == 1
  x0, mask0 = load_x(0)
  shift, delta, r = _row_statistics(spec, load_x, x0, mask0)

  def out_body(col0, carry):
    x, _ = (x0, mask0) if single else load_x(col0)
    rds, cds, _, col_ok, mask = tile(spec, row0, col0)
    xc = ((x - shift[:, None]) - delta[:, None]) if spec.center else x
    gam = gamma_row(spec, scale_ref, cds, col_ok)
    b = load(bias_ref, (cds,), col_ok)[None, :] if spec.has_bias else None
    # The casting mode's output map (jaxnorm._casting), the XLA path's own rule.
    y = plan_of(spec).normalized_affine(xc, r[:, None], gam, b)
    pl.store(y_ref.at[rds, cds], y.astype(y_ref.dtype), mask=mask)
    if h_ref is not None:
      pl.store(h_ref.at[rds, cds], x.astype(h_ref.dtype), mask=mask)
    return carry

  col_loop(spec, out_body, 0)
  stats = (shift, delta, r) if spec.center else (r,)
  for ref, value in zip(stat_refs, stats):
    pl.store(ref.at[rows_ds], value, mask=row_ok)


def _split_refs(spec: KernelSpec, refs, n_in: int, n_out: int):
  """``(inputs, scale_ref, bias_ref, outputs, stat_refs)`` of a forward kernel's refs."""
  refs = list(refs)
  inputs = [refs.pop(0) for _ in range(n_in)]
  scale_ref = refs.pop(0) if spec.has_scale else None
  bias_ref = refs.pop(0) if spec.has_bias else None
  outputs = [refs.pop(0) for _ in range(n_out)]
  return inputs, scale_ref, bias_ref, outputs, refs


def norm_forward_kernel(spec: KernelSpec, *refs):
  """LayerNorm/RMSNorm forward of one tile: refs ``x, [scale], [bias], y, *stats``."""
  (x_ref,), scale_ref, bias_ref, (y_ref,), stat_refs = _split_refs(spec, refs, 1, 1)
  row0 = pl.program_id(0) * spec.block.block_rows

  def load_x(col0):
    rds, cds, _, _, mask = tile(spec, row0, col0)
    return load(x_ref, (rds, cds), mask), mask

  _normalize_tile(spec, load_x, scale_ref, bias_ref, y_ref, stat_refs)


def add_norm_forward_kernel(spec: KernelSpec, *refs):
  """Residual add + norm forward of one tile.

  Refs: ``x, residual, [scale], [bias], y, h, *stats``.
  """
  (x_ref, res_ref), scale_ref, bias_ref, (y_ref, h_ref), stat_refs = _split_refs(spec, refs, 2, 2)
  row0 = pl.program_id(0) * spec.block.block_rows
  alpha = spec.residual_scale

  def load_h(col0):
    rds, cds, _, _, mask = tile(spec, row0, col0)
    res = load(res_ref, (rds, cds), mask)
    h = load(x_ref, (rds, cds), mask) + (res if alpha == 1.0 else alpha * res)
    # Rounded to h's dtype first: y and the statistics are those of the stored h, so the
    # backward, which reads h back, differentiates exactly the function computed here.
    return h.astype(h_ref.dtype).astype(jnp.float32), mask

  _normalize_tile(spec, load_h, scale_ref, bias_ref, y_ref, stat_refs, h_ref=h_ref)


def _launch(kernel, spec: KernelSpec, args, outs, *, interpret: bool, name: str):
  """``pallas_call`` of a forward kernel over the row tiles; ``outs`` precede the statistics."""
  rows = spec.rows
  stat = jax.ShapeDtypeStruct((rows,), jnp.float32)
  out_shape = list(outs) + ([stat, stat, stat] if spec.center else [stat])
  return pl.pallas_call(
      functools.partial(kernel, spec),
      out_shape=out_shape,
      grid=(pl.cdiv(rows, spec.block.block_rows),),
      compiler_params=compiler_params(spec),
      interpret=interpret,
      name=name,
  )(*args)


def _params(spec: KernelSpec, scale, bias):
  return ([scale] if spec.has_scale else []) + ([bias] if spec.has_bias else [])


@functools.partial(jax.jit, static_argnames=("spec", "out_dtype", "interpret"))
def norm_forward(x, scale, bias, *, spec: KernelSpec, out_dtype, interpret: bool):
  """``(y, shift, delta, rstd)`` (LayerNorm) or ``(y, rstd)`` of ``x: (rows, d)``."""
  y = jax.ShapeDtypeStruct(x.shape, out_dtype)
  return tuple(_launch(norm_forward_kernel, spec, [x] + _params(spec, scale, bias), [y],
                       interpret=interpret, name=f"jaxnorm_{spec.op}_fwd"))


@functools.partial(jax.jit, static_argnames=("spec", "out_dtype", "h_dtype", "interpret"))
def add_norm_forward(x, residual, scale, bias, *, spec: KernelSpec, out_dtype, h_dtype,
                     interpret: bool):
  """``(y, h, shift, delta, rstd)`` (LayerNorm) or ``(y, h, rstd)``, ``h = x + alpha residual``."""
  outs = [jax.ShapeDtypeStruct(x.shape, out_dtype), jax.ShapeDtypeStruct(x.shape, h_dtype)]
  return tuple(_launch(add_norm_forward_kernel, spec, [x, residual] + _params(spec, scale, bias),
                       outs, interpret=interpret, name=f"jaxnorm_add_{spec.op}_fwd"))
