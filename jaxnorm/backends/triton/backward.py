r"""Internal API: the backward Pallas kernels, plain norm and residual add + norm side by side.

Two kernels per backward, named by role as in JAX's Pallas ops:

* ``*_backward_kernel_dx`` (a fixed number of programs, each looping over its tiles of rows):
  one read of the input and ``dy``, the two row reductions in registers, one write of ``dx``;
  each program also accumulates its share of :math:`\sum_\text{rows} dy \odot \hat x` and
  :math:`\sum_\text{rows} dy` in float32 and writes it as one row of a ``(programs, d)``
  partial-sum array;
* :func:`backward_kernel_dscale_dbias`: sums those partial rows per column. No atomics, so
  ``dscale``/``dbias`` are deterministic, run to run.

Per row, with :math:`g = dy \odot \gamma` and the bars row means,

.. math::

   dx = r\Big(g - \overline{g} - c\, \hat x\, \overline{g \hat x}\Big),\qquad
   d\text{scale} = \sum_\text{rows} dy \odot \hat x,\qquad d\beta = \sum_\text{rows} dy,

:math:`\overline g` absent for RMSNorm, :math:`c = 1` ("inside") or :math:`1/(1 - \epsilon r)`
("outside"). :func:`add_norm_backward_kernel_dx` reads ``h`` in place of ``x``, adds the
cotangent ``dh`` to ``dx`` and, when the two input cotangents differ (``residual_scale != 1``
or another dtype), writes :math:`d\text{residual} = \alpha\, dx` from the same registers. Both
dx kernels run :func:`_dx_program`. The launches trust their arguments.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxnorm.backends.triton import compat as pl

from jaxnorm import _math
from jaxnorm.backends.triton.common import KernelSpec, backward_config, col_loop, compiler_params
from jaxnorm.backends.triton.common import ds, fori, gamma_row, iota, load, tile


def _tile_terms(spec: KernelSpec, x_ref, dy_ref, scale_ref, row0, col0, stats):
  """``(rds, cds, col_ok, mask, x_hat, (ds_term, db_term), g)`` of one tile, zero outside.

  ``ds_term = dy * x_hat`` and ``db_term = dy``, the summands of ``dscale`` and ``dbias``; with a
  casting mode ``dz * u`` and ``dq`` instead, and ``g`` rounded by each forward cast's
  transpose (:meth:`jaxnorm._casting.CastPlan.cotangents`).
  """
  rds, cds, _, col_ok, mask = tile(spec, row0, col0)
  x = load(x_ref, (rds, cds), mask)  # (br, bd)
  dy = load(dy_ref, (rds, cds), mask)  # (br, bd)
  if spec.center:
    shift, delta, r = stats
    xh = jnp.where(mask, ((x - shift[:, None]) - delta[:, None]) * r[:, None], 0.0)
  else:
    (r,) = stats
    xh = x * r[:, None]
  gam = gamma_row(spec, scale_ref, cds, col_ok)
  if spec.cast is not None:
    dq, dz, g = spec.cast.cotangents(dy, gam)
    u, _ = spec.cast.affine_of(xh, None, None)
    return rds, cds, col_ok, mask, xh, (dz * u, dq), g
  g = dy if gam is None else dy * gam
  return rds, cds, col_ok, mask, xh, (dy * xh, dy), g


def _row_coefficients(spec: KernelSpec, terms_at, r):
  """``(coef, mean_g, first)``: ``c * mean(g x_hat)``, ``mean(g)`` (LayerNorm) per row.

  ``first`` is the single column block's terms, kept to be reused (None when the kernel loops).
  """
  br, bd = spec.block.block_rows, spec.block.block_d
  first = None
  if spec.block.num_col_blocks == 1:
    first = terms_at(0)
    gx, gs = first[4] * first[6], first[6]
  else:
    def reduce_body(col0, sums):
      _, _, _, _, xh, _, g = terms_at(col0)
      return sums[0] + g * xh, sums[1] + g

    zero = jnp.zeros((br, bd), jnp.float32)
    gx, gs = col_loop(spec, reduce_body, (zero, zero))
  mean_gx = jnp.sum(gx, axis=1) / spec.d  # (br,)
  c = _math.variance_path_factor(r, spec.epsilon, spec.outside)
  coef = mean_gx if c is None else mean_gx * c  # (br,)
  mean_g = jnp.sum(gs, axis=1) / spec.d if spec.center else None
  return coef, mean_g, first


def _store_partials(spec: KernelSpec, ds_ref, db_ref, pid, cds, col_ok, ds, db, *, add: bool):
  """Writes (``add``: adds to) this program's row of the dscale/dbias partial sums."""
  for ref, value, present in ((ds_ref, ds, spec.has_scale), (db_ref, db, spec.has_bias)):
    if present:
      prev = load(ref, (pid, cds), col_ok) if add else 0.0
      pl.store(ref.at[pid, cds], prev + value, mask=col_ok)


def _dx_program(spec: KernelSpec, x_ref, dy_ref, scale_ref, stat_refs, ds_ref, db_ref, emit_dx):
  """One program of a dx kernel: its row tiles, then its row of the parameter partial sums.

  ``emit_dx(rds, cds, mask, dx)`` writes the float32 ``dx`` of a tile (the plain kernel stores
  it; the residual add adds ``dh`` first and may write ``dresidual`` too).
  """
  blk = spec.block
  br, bd = blk.block_rows, blk.block_d
  single = blk.num_col_blocks == 1
  pid = pl.program_id(0)
  zeros_col = jnp.zeros((bd,), jnp.float32)

  def row_tile(i, acc):
    row0 = (pid + i * blk.bwd_programs) * br  # past the last row: everything masked.
    rows_ds, _, row_ok, _, _ = tile(spec, row0, 0)
    stats = tuple(load(ref, (rows_ds,), row_ok) for ref in stat_refs)  # each (br,)
    r = stats[-1]
    terms_at = functools.partial(_tile_terms, spec, x_ref, dy_ref, scale_ref, row0, stats=stats)
    coef, mean_g, first = _row_coefficients(spec, terms_at, r)

    def dx_body(col0, acc):
      rds, cds, col_ok, mask, xh, pterms, g = first if single else terms_at(col0)
      inner = xh * coef[:, None]
      if spec.center:
        inner = inner + mean_g[:, None]
      emit_dx(rds, cds, mask, r[:, None] * (g - inner))
      ds_part, db_part = jnp.sum(pterms[0], axis=0), jnp.sum(pterms[1], axis=0)  # (bd,) each
      if single:
        return acc[0] + ds_part, acc[1] + db_part
      # Several column blocks: this program's partial row lives in global memory.
      _store_partials(spec, ds_ref, db_ref, pid, cds, col_ok, ds_part, db_part, add=True)
      return acc

    return col_loop(spec, dx_body, acc)

  if not single:

    def zero_body(col0, carry):
      cds, col_ok = ds(col0, bd), col0 + iota(bd) < spec.d
      _store_partials(spec, ds_ref, db_ref, pid, cds, col_ok, zeros_col, zeros_col, add=False)
      return carry

    col_loop(spec, zero_body, 0)
  steps = pl.cdiv(pl.cdiv(spec.rows, br), blk.bwd_programs)
  ds_acc, db_acc = fori(steps, row_tile, (zeros_col, zeros_col))
  if single:
    cds, col_ok = ds(0, bd), iota(bd) < spec.d
    _store_partials(spec, ds_ref, db_ref, pid, cds, col_ok, ds_acc, db_acc, add=False)


def _split_refs(spec: KernelSpec, refs, n_in: int, n_out: int):
  """``(inputs, scale_ref, stat_refs, outputs, ds_ref, db_ref)`` of a dx kernel's refs."""
  refs = list(refs)
  inputs = [refs.pop(0) for _ in range(n_in)]
  scale_ref = refs.pop(0) if spec.has_scale else None
  stat_refs = [refs.pop(0) for _ in range(3 if spec.center else 1)]
  outputs = [refs.pop(0) for _ in range(n_out)]
  ds_ref = refs.pop(0) if spec.has_scale else None
  db_ref = refs.pop(0) if spec.has_bias else None
  return inputs, scale_ref, stat_refs, outputs, ds_ref, db_ref


def norm_backward_kernel_dx(spec: KernelSpec, *refs):
  """dx of LayerNorm/RMSNorm: refs ``x, dy, [scale], *stats, dx, [dscale_parts], [dbias_parts]``."""
  (x_ref, dy_ref), scale_ref, stat_refs, (dx_ref,), ds_ref, db_ref = _split_refs(spec, refs, 2, 1)

  def emit_dx(rds, cds, mask, dx):
    pl.store(dx_ref.at[rds, cds], dx.astype(dx_ref.dtype), mask=mask)

  _dx_program(spec, x_ref, dy_ref, scale_ref, stat_refs, ds_ref, db_ref, emit_dx)


def add_norm_backward_kernel_dx(spec: KernelSpec, has_dh: bool, split_dx: bool, *refs):
  """dx (+ dh) of the residual add + norm: refs ``h, dy, [dh], [scale], *stats, dx, [dresidual],
  [dscale_parts], [dbias_parts]``; ``dresidual = residual_scale * dx`` when ``split_dx``."""
  n_in, n_out = 2 + has_dh, 1 + split_dx
  inputs, scale_ref, stat_refs, outputs, ds_ref, db_ref = _split_refs(spec, refs, n_in, n_out)
  h_ref, dy_ref = inputs[:2]
  dh_ref = inputs[2] if has_dh else None
  dx_ref = outputs[0]
  dres_ref = outputs[1] if split_dx else None
  alpha = spec.residual_scale

  def emit_dx(rds, cds, mask, dx):
    if dh_ref is not None:
      dx = dx + load(dh_ref, (rds, cds), mask)
    pl.store(dx_ref.at[rds, cds], dx.astype(dx_ref.dtype), mask=mask)
    if dres_ref is not None:
      dres = dx if alpha == 1.0 else alpha * dx
      pl.store(dres_ref.at[rds, cds], dres.astype(dres_ref.dtype), mask=mask)

  _dx_program(spec, h_ref, dy_ref, scale_ref, stat_refs, ds_ref, db_ref, emit_dx)


def backward_kernel_dscale_dbias(n_parts: int, rows: int, d: int, block_rows: int, block_d: int,
                                 *refs):
  """Sums the ``(rows, d)`` float32 partials over rows, ``block_d`` columns per program."""
  part_refs, out_refs = refs[:n_parts], refs[n_parts:]
  col0 = pl.program_id(0) * block_d
  cds = ds(col0, block_d)
  col_ok = col0 + iota(block_d) < d

  def body(i, accs):
    row0 = i * block_rows
    row_ok = row0 + iota(block_rows) < rows
    mask = row_ok[:, None] & col_ok[None, :]
    return tuple(acc + load(ref, (ds(row0, block_rows), cds), mask)
                 for acc, ref in zip(accs, part_refs))

  init = tuple(jnp.zeros((block_rows, block_d), jnp.float32) for _ in part_refs)
  accs = fori(pl.cdiv(rows, block_rows), body, init)
  for acc, out_ref in zip(accs, out_refs):
    pl.store(out_ref.at[cds], jnp.sum(acc, axis=0).astype(out_ref.dtype), mask=col_ok)


def _param_grads(parts, scale, spec: KernelSpec, interpret: bool):
  """``(dscale, dbias)`` from the dx kernel's partial-sum outputs (None where absent)."""
  if not parts:
    return None, None
  n, d = parts[0].shape
  blk = spec.block
  dtypes = ([scale.dtype] if spec.has_scale else []) + ([jnp.float32] if spec.has_bias else [])
  block_rows = min(blk.reduce_block_rows, pl.next_power_of_2(n))
  sums = list(pl.pallas_call(
      functools.partial(backward_kernel_dscale_dbias, len(parts), n, d, block_rows,
                        blk.reduce_block_d),
      out_shape=[jax.ShapeDtypeStruct((d,), dt) for dt in dtypes],
      grid=(pl.cdiv(d, blk.reduce_block_d),),
      compiler_params=pl.compiler_params(num_warps=4, num_stages=1),
      interpret=interpret,
      name="jaxnorm_norm_param_reduce",
  )(*parts))
  dscale = sums.pop(0) if spec.has_scale else None
  dbias = sums.pop(0) if spec.has_bias else None
  return dscale, dbias


def _launch(kernel, spec: KernelSpec, args, outs, scale, *, interpret: bool, name: str):
  """The dx kernel then the reduction: ``(*outs, dscale, dbias)`` (None where absent)."""
  part = jax.ShapeDtypeStruct((spec.block.bwd_programs, spec.d), jnp.float32)
  out_shape = list(outs) + [part] * (spec.has_scale + spec.has_bias)
  res = list(pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(spec.block.bwd_programs,),
      compiler_params=compiler_params(spec),
      interpret=interpret,
      name=name,
  )(*args))
  return (*res[:len(outs)], *_param_grads(res[len(outs):], scale, spec, interpret))


def _inputs(spec: KernelSpec, scale, shift, delta, r):
  return ([scale] if spec.has_scale else []) + ([shift, delta, r] if spec.center else [r])


@functools.partial(jax.jit, static_argnames=("spec", "interpret"))
def norm_backward(x, dy, scale, shift, delta, rstd, *, spec: KernelSpec, interpret: bool):
  """``(dx, dscale, dbias)`` from ``x: (rows, d)``, ``dy`` and the float32 ``(rows,)`` stats."""
  spec = dataclasses.replace(spec, block=backward_config(spec.block))
  return _launch(functools.partial(norm_backward_kernel_dx, spec), spec,
                 [x, dy] + _inputs(spec, scale, shift, delta, rstd),
                 [jax.ShapeDtypeStruct(x.shape, x.dtype)], scale, interpret=interpret,
                 name=f"jaxnorm_{spec.op}_bwd")


@functools.partial(jax.jit, static_argnames=("spec", "x_dtype", "residual_dtype", "interpret"))
def add_norm_backward(h, dy, dh, scale, shift, delta, rstd, *, spec: KernelSpec, x_dtype,
                      residual_dtype, interpret: bool):
  """``(dx, dresidual, dscale, dbias)``; ``dresidual`` is ``dx`` itself when they coincide."""
  spec = dataclasses.replace(spec, block=backward_config(spec.block))
  split_dx = spec.residual_scale != 1.0 or x_dtype != residual_dtype
  outs = [jax.ShapeDtypeStruct(h.shape, x_dtype)]
  outs += [jax.ShapeDtypeStruct(h.shape, residual_dtype)] if split_dx else []
  kernel = functools.partial(add_norm_backward_kernel_dx, spec, dh is not None, split_dx)
  args = [h, dy] + ([] if dh is None else [dh]) + _inputs(spec, scale, shift, delta, rstd)
  res = _launch(kernel, spec, args, outs, scale, interpret=interpret,
                name=f"jaxnorm_add_{spec.op}_bwd")
  dx, dscale, dbias = res[0], res[-2], res[-1]
  return dx, (res[1] if split_dx else dx), dscale, dbias
