r"""Internal API: the Pallas (Triton) kernels of gated RMSNorm, forward and backward.

Contract: ``x, z: (rows, d)`` (any of float32/bfloat16/float16, not necessarily the same),
``scale: (d,)`` or None, the row split into ``d // group_size`` groups of ``group_size``
features. All arithmetic is float32 and every output is rounded once (with a casting plan,
``cast``, :math:`\hat u` and :math:`\hat u\gamma` are rounded first, as the XLA backend's
:mod:`jaxnorm.backends.xla.gated` rounds them, and the backward rounds the cotangents there). With
:math:`g = \operatorname{silu}(z) = z\,s`, :math:`s = \sigma(z)`, per group (bars are means
over the group's ``k = group_size`` features):

.. math::

   u = x \ (\text{norm\_before\_gate}) \text{ or } x \odot g \ (\text{gate first}),\qquad
   r = (\overline{u^2} + \epsilon)^{-1/2},\qquad \hat u = u\, r,

   y = \gamma \odot \hat u \odot g \ (\text{norm first}),\qquad y = \gamma \odot \hat u
   \ (\text{gate first}).

Backward, with :math:`\operatorname{silu}'(z) = s\,(1 + z\,(1 - s))`:

* norm first: :math:`a = dy\,g\,\gamma`, :math:`dx = r\,(a - \hat u\,\overline{a \hat u})`,
  :math:`dz = dy\,\gamma\,\hat u\,\operatorname{silu}'(z)`,
  :math:`d\gamma = \sum_\text{rows} dy\,g\,\hat u`;
* gate first: :math:`a = dy\,\gamma`, :math:`du = r\,(a - \hat u\,\overline{a \hat u})`,
  :math:`dx = du\,g`, :math:`dz = du\,x\,\operatorname{silu}'(z)`,
  :math:`d\gamma = \sum_\text{rows} dy\,\hat u`.

(Derivation: ``docs/derivations.md``, "Gated RMSNorm".) The grid is (row tiles, groups): one
program normalizes ``block_rows`` rows of one group, ``block_d`` columns of the group at a
time (``block_d`` a power of two, the columns past the group masked; a group wider than
``block_d`` loops over column blocks). ``group_size == d`` is a one-axis grid, the plain RMSNorm
layout. The backward runs a fixed number of programs per group, each looping over its row tiles
and writing its float32 partial sums of :math:`d\gamma` into its row of a ``(programs, d)``
array (its group's columns), which
:func:`jaxnorm.backends.triton.backward.backward_kernel_dscale_dbias` then sums per column:
deterministic, no atomics. The block configuration (``block=``) is that of a ``(rows, group_size)``
input: :func:`jaxnorm.backends.triton.config.default_block_config` of it by default.
:func:`gated_refusal` says which calls the kernels cannot take; the launches trust their arguments.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxnorm.backends.triton import compat as pl

from jaxnorm import _math
from jaxnorm.backends.triton.backward import backward_kernel_dscale_dbias
from jaxnorm.backends.triton.common import backward_config, col_loop, compiler_params, ds
from jaxnorm.backends.triton.common import fori, iota
from jaxnorm.backends.triton.common import load
from jaxnorm.backends.triton.config import BlockConfig, default_block_config, gated_refusal

__all__ = ["GatedSpec", "gated_backward", "gated_forward", "gated_refusal"]


@dataclasses.dataclass(frozen=True)
class GatedSpec:
  """Static configuration of one gated launch (hashable: it parametrizes the jitted launches).

  ``block`` tiles one group: ``block.num_col_blocks * block.block_d >= group_size``.
  """

  rows: int
  d: int
  group_size: int
  has_scale: bool
  epsilon: float
  norm_before_gate: bool
  block: BlockConfig
  # casting= (jaxnorm._casting.CastPlan, compute dtype float32): where u_hat * gamma rounds;
  # None: nothing rounds before y ("float32").
  cast: Any = None

  @property
  def ngroups(self) -> int:
    return self.d // self.group_size


def _spec(x, scale, group_size, epsilon, norm_before_gate, block, cast) -> GatedSpec:
  rows, d = x.shape
  k = d if group_size is None else int(group_size)
  reason = gated_refusal(d, k, x.dtype)
  if reason is not None:
    raise ValueError(f"gated kernels: {reason}.")
  blk = block if block is not None else default_block_config(rows, k, x.dtype)
  # The column loop covers the group, whatever width the given block was sized for.
  blk = dataclasses.replace(blk, num_col_blocks=pl.cdiv(k, blk.block_d))
  return GatedSpec(rows=rows, d=d, group_size=k, has_scale=scale is not None,
                   epsilon=float(epsilon), norm_before_gate=bool(norm_before_gate), block=blk,
                   cast=cast)


def _group(spec: GatedSpec, axis: int):
  """This program's int32 group index (a constant ``0`` in the one-group grid)."""
  return pl.program_id(axis) if spec.ngroups > 1 else np.int32(0)


def _group_tile(spec: GatedSpec, row0, group, col0):
  """``(rows_ds, cols_ds, row_ok, col_ok, mask)`` of a tile of column block ``col0`` of a group."""
  br, bd, k = spec.block.block_rows, spec.block.block_d, spec.group_size
  row_ok = row0 + iota(br) < spec.rows
  col_ok = col0 + iota(bd) < k
  start = col0 if isinstance(group, np.integer) and group == 0 else group * k + col0
  return ds(row0, br), ds(start, bd), row_ok, col_ok, row_ok[:, None] & col_ok[None, :]


def _sigmoid(z):
  """``1 / (1 + exp(-z))`` in float32 (0 for very negative z, 1 for very positive)."""
  return 1.0 / (1.0 + jnp.exp(-z))


def _rstd(spec: GatedSpec, sum_sq):
  """:math:`r` of each row of a tile from its per-element ``u^2`` partial sums ``(br, bd)``."""
  return _math.rstd(jnp.sum(sum_sq, axis=1) / spec.group_size, spec.epsilon, False)


def _loop_tiles(spec: GatedSpec, terms_at, acc_body, init):
  """``col_loop`` over a group's column blocks reusing the single block's loaded ``first``."""
  first = terms_at(0) if spec.block.num_col_blocks == 1 else None
  return col_loop(spec, lambda col0, acc: acc_body(first if first is not None
                                                   else terms_at(col0), acc), init), first


# ---------------------------------------------------------------------------------- forward


def gated_forward_kernel(spec: GatedSpec, *refs):
  """Gated RMSNorm forward of one (row tile, group): refs ``x, z, [scale], y, rstd``."""
  x_ref, z_ref = refs[:2]
  scale_ref = refs[2] if spec.has_scale else None
  y_ref, rstd_ref = refs[2 + spec.has_scale:]
  row0 = pl.program_id(0) * spec.block.block_rows
  group = _group(spec, 1)
  zero = jnp.zeros((spec.block.block_rows, spec.block.block_d), jnp.float32)

  def terms_at(col0):
    rds, cds, _, col_ok, mask = _group_tile(spec, row0, group, col0)
    x, z = load(x_ref, (rds, cds), mask), load(z_ref, (rds, cds), mask)
    g = z * _sigmoid(z)  # 0 where masked
    u = x if spec.norm_before_gate else x * g
    return rds, cds, col_ok, mask, u, g

  sum_sq, first = _loop_tiles(spec, terms_at, lambda t, acc: acc + t[4] * t[4], zero)
  r = _rstd(spec, sum_sq)  # (br,)

  def out_body(col0, carry):
    rds, cds, col_ok, mask, u, g = first if first is not None else terms_at(col0)
    y = u * r[:, None]
    gam = load(scale_ref, (cds,), col_ok)[None, :] if spec.has_scale else None
    if spec.cast is not None:
      _, y = spec.cast.affine_of(y, gam, None)  # rounded where the mode rounds
    elif gam is not None:
      y = y * gam
    if spec.norm_before_gate:
      y = y * g
    pl.store(y_ref.at[rds, cds], y.astype(y_ref.dtype), mask=mask)
    return carry

  col_loop(spec, out_body, 0)
  rows_ds, _, row_ok, _, _ = _group_tile(spec, row0, group, 0)
  pl.store(rstd_ref.at[rows_ds, group], r, mask=row_ok)


@functools.partial(jax.jit, static_argnames=("spec", "out_dtype", "interpret"))
def _forward(x, z, scale, *, spec: GatedSpec, out_dtype, interpret: bool):
  grid = (pl.cdiv(spec.rows, spec.block.block_rows),)
  grid += (spec.ngroups,) if spec.ngroups > 1 else ()
  args = [x, z] + ([scale] if spec.has_scale else [])
  y, r = pl.pallas_call(
      functools.partial(gated_forward_kernel, spec),
      out_shape=[jax.ShapeDtypeStruct(x.shape, out_dtype),
                 jax.ShapeDtypeStruct((spec.rows, spec.ngroups), jnp.float32)],
      grid=grid,
      compiler_params=compiler_params(spec),
      interpret=interpret,
      name="jaxnorm_gated_rms_norm_fwd",
  )(*args)
  return y, r


def gated_forward(x, z, scale, *, group_size, epsilon, norm_before_gate, out_dtype, interpret,
                  block=None, cast=None):
  """Gated RMSNorm forward: ``(y, rstd)`` of ``x, z: (rows, d)`` (module docstring).

  One read of ``x`` and ``z`` and one write of ``y`` when a group fits one column block (a
  wider group reads them twice, as the plain forward does); float32 arithmetic, ``y`` rounded
  once.

  Args:
    x: ``(rows, d)`` float32/bfloat16/float16.
    z: the gate pre-activation, ``(rows, d)``, a kernel dtype (may differ from ``x``'s).
    scale: ``(d,)`` (:math:`\\gamma`) or None.
    group_size: features per group (must divide ``d``), or None for the whole row.
    epsilon: added to the mean square (Python float).
    norm_before_gate: True: ``y = gamma * (x r) * silu(z)``; False: ``u = x * silu(z)``,
      ``y = gamma * (u r)``.
    out_dtype: dtype of ``y``.
    interpret: run in Pallas interpret mode (off a GPU).
    block: a :class:`~jaxnorm.backends.triton.config.BlockConfig` for a ``(rows, group_size)`` input
      (its column-block count is recomputed for the group), or None for the default.
    cast: the call's :class:`jaxnorm._casting.CastPlan` (compute dtype float32), or None for
      "float32": ``y = rd_O(rd_P(rd_A(u r) gamma) g)`` (norm first) or ``rd_O(rd_P(rd_A(u r)
      gamma))``, as the XLA backend's :mod:`jaxnorm.backends.xla.gated`.

  Returns:
    ``y`` of ``x``'s shape in ``out_dtype``, and ``rstd``, float32 ``(rows, d // group_size)``.

  Raises:
    ValueError: a call :func:`gated_refusal` refuses (the backend asks it first).
  """
  spec = _spec(x, scale, group_size, epsilon, norm_before_gate, block, cast)
  if spec.rows == 0:
    return (jnp.zeros(x.shape, out_dtype), jnp.zeros((0, spec.ngroups), jnp.float32))
  return _forward(x, z, scale, spec=spec, out_dtype=jnp.dtype(out_dtype), interpret=interpret)


# --------------------------------------------------------------------------------- backward


def _backward_terms(spec: GatedSpec, refs, row0, group, r, col0):
  """Everything one tile contributes, float32 and zero where masked.

  ``(rds, cds, col_ok, mask, a, uh, dz_factor, ds_term, g)``: the cotangent ``a`` of ``uh``,
  the normalized ``uh``, what ``dz`` is made of, the summand of ``dscale`` and the gate.
  """
  x_ref, z_ref, dy_ref, scale_ref = refs
  rds, cds, _, col_ok, mask = _group_tile(spec, row0, group, col0)
  x, z, dy = (load(ref, (rds, cds), mask) for ref in (x_ref, z_ref, dy_ref))
  s = _sigmoid(z)
  g = z * s
  dsilu = s * (1.0 + z * (1.0 - s))
  gam = load(scale_ref, (cds,), col_ok)[None, :] if spec.has_scale else None
  if spec.cast is not None:
    return _backward_terms_cast(spec, x, g, dsilu, dy, gam, r, (rds, cds, col_ok, mask))
  dyg = dy if gam is None else dy * gam  # dy * gamma
  if spec.norm_before_gate:
    uh = x * r[:, None]
    a = dyg * g
    # dz = dy gamma uh silu'(z), complete already; dscale term dy g uh.
    return rds, cds, col_ok, mask, a, uh, dyg * uh * dsilu, dy * g * uh, g
  uh = (x * g) * r[:, None]
  # dz = du x silu'(z): the factor x silu'(z) here, du once the row mean is known.
  return rds, cds, col_ok, mask, dyg, uh, x * dsilu, dy * uh, g


def _backward_terms_cast(spec: GatedSpec, x, g, dsilu, dy, gam, r, tile):
  """:func:`_backward_terms` under the casting plan ``spec.cast``: the cotangent of ``p =
  rd_P(rd_A(uh) gamma)`` rounded to P (``dp``), that of ``uh`` ``rd_A(rd_P(dp gamma))``, the
  ``dscale`` summand ``dp * rd_A(uh)`` and, norm first, ``dz = dy p silu'(z)`` at the rounded
  ``p`` (the XLA backend's :func:`jaxnorm.backends.xla.gated.backward`)."""
  uh = (x if spec.norm_before_gate else x * g) * r[:, None]
  u, p = spec.cast.affine_of(uh, gam, None)
  _, dp, a = spec.cast.cotangents(dy * g if spec.norm_before_gate else dy, gam)
  dz_part = dy * p * dsilu if spec.norm_before_gate else x * dsilu
  return (*tile, a, uh, dz_part, dp * u, g)


def gated_backward_kernel(spec: GatedSpec, *refs):
  """dx, dz of one program (its row tiles of one group) and its partial ``dscale`` row.

  Refs: ``x, z, dy, [scale], rstd, dx, dz, [dscale_parts]``.
  """
  refs = list(refs)
  x_ref, z_ref, dy_ref = refs[:3]
  scale_ref = refs[3] if spec.has_scale else None
  rstd_ref, dx_ref, dz_ref = refs[3 + spec.has_scale:6 + spec.has_scale]
  ds_ref = refs[6 + spec.has_scale] if spec.has_scale else None
  blk = spec.block
  br, bd = blk.block_rows, blk.block_d
  single = blk.num_col_blocks == 1
  pid = pl.program_id(0)
  group = _group(spec, 1)
  zero_col = jnp.zeros((bd,), jnp.float32)
  zero = jnp.zeros((br, bd), jnp.float32)

  def store_partial(col0, value, add):
    _, cds, _, col_ok, _ = _group_tile(spec, 0, group, col0)
    prev = load(ds_ref, (pid, cds), col_ok) if add else 0.0
    pl.store(ds_ref.at[pid, cds], prev + value, mask=col_ok)

  def row_tile(i, acc):
    row0 = (pid + i * blk.bwd_programs) * br  # past the last row: everything masked
    rows_ds, _, row_ok, _, _ = _group_tile(spec, row0, group, 0)
    r = load(rstd_ref, (rows_ds, group), row_ok)  # (br,), 0 on masked rows
    terms_at = functools.partial(_backward_terms, spec, (x_ref, z_ref, dy_ref, scale_ref),
                                 row0, group, r)
    sum_au, first = _loop_tiles(spec, terms_at, lambda t, a: a + t[4] * t[5], zero)
    coef = jnp.sum(sum_au, axis=1) / spec.group_size  # mean(a uh), (br,)

    def out_body(col0, acc):
      rds, cds, _, mask, a, uh, dz_part, ds_term, g = first if single else terms_at(col0)
      du = r[:, None] * (a - uh * coef[:, None])
      if spec.norm_before_gate:
        dx, dz = du, dz_part
      else:
        dx, dz = du * g, du * dz_part
      pl.store(dx_ref.at[rds, cds], dx.astype(dx_ref.dtype), mask=mask)
      pl.store(dz_ref.at[rds, cds], dz.astype(dz_ref.dtype), mask=mask)
      if not spec.has_scale:
        return acc
      part = jnp.sum(ds_term, axis=0)  # (bd,)
      if single:
        return acc + part
      store_partial(col0, part, add=True)  # several column blocks: the row lives in memory
      return acc

    return col_loop(spec, out_body, acc)

  if spec.has_scale and not single:
    col_loop(spec, lambda col0, c: (store_partial(col0, zero_col, add=False), c)[1], 0)
  steps = pl.cdiv(pl.cdiv(spec.rows, br), blk.bwd_programs)
  acc = fori(steps, row_tile, zero_col)
  if spec.has_scale and single:
    store_partial(0, acc, add=False)


def _reduce_partials(parts, spec: GatedSpec, interpret: bool):
  """``dscale``: the float32 ``(programs, d)`` partial rows summed per column."""
  n, d = parts.shape
  blk = spec.block
  block_rows = min(blk.reduce_block_rows, pl.next_power_of_2(n))
  return pl.pallas_call(
      functools.partial(backward_kernel_dscale_dbias, 1, n, d, block_rows, blk.reduce_block_d),
      out_shape=jax.ShapeDtypeStruct((d,), jnp.float32),
      grid=(pl.cdiv(d, blk.reduce_block_d),),
      compiler_params=pl.compiler_params(num_warps=4, num_stages=1),
      interpret=interpret,
      name="jaxnorm_gated_rms_norm_param_reduce",
  )(parts)


@functools.partial(jax.jit, static_argnames=("spec", "interpret"))
def _backward(x, z, scale, rstd, dy, *, spec: GatedSpec, interpret: bool):
  grid = (spec.block.bwd_programs,) + ((spec.ngroups,) if spec.ngroups > 1 else ())
  outs = [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(z.shape, z.dtype)]
  if spec.has_scale:
    outs.append(jax.ShapeDtypeStruct((spec.block.bwd_programs, spec.d), jnp.float32))
  args = [x, z, dy] + ([scale] if spec.has_scale else []) + [rstd]
  res = pl.pallas_call(
      functools.partial(gated_backward_kernel, spec),
      out_shape=outs,
      grid=grid,
      compiler_params=compiler_params(spec),
      interpret=interpret,
      name="jaxnorm_gated_rms_norm_bwd",
  )(*args)
  dscale = _reduce_partials(res[2], spec, interpret) if spec.has_scale else None
  return res[0], res[1], dscale


def gated_backward(x, z, scale, rstd, dy, *, group_size, epsilon, norm_before_gate, interpret,
                   block=None, cast=None):
  """Gated RMSNorm backward: ``(dx, dz, dscale)`` from the forward's inputs, ``rstd`` and ``dy``.

  Args:
    x, z, scale, group_size, epsilon, norm_before_gate, interpret, block, cast: as given to
      :func:`gated_forward` (``block`` its forward configuration; the backward's own rows,
      warps and stages are taken from its ``bwd_*`` fields).
    rstd: the forward's float32 ``(rows, d // group_size)``.
    dy: the cotangent of ``y``, ``(rows, d)``, any kernel dtype.

  Returns:
    ``dx`` in ``x``'s dtype, ``dz`` in ``z``'s dtype (float32 arithmetic, rounded once), and
    ``dscale``, float32 ``(d,)`` (None without a scale), summed deterministically: each program
    writes float32 partial sums into one row of a ``(programs, d)`` array, then one reduction.

  Raises:
    ValueError: a call :func:`gated_refusal` refuses.
  """
  spec = _spec(x, scale, group_size, epsilon, norm_before_gate, block, cast)
  if spec.rows == 0:
    return (jnp.zeros(x.shape, x.dtype), jnp.zeros(z.shape, z.dtype),
            jnp.zeros((spec.d,), jnp.float32) if spec.has_scale else None)
  spec = dataclasses.replace(spec, block=backward_config(spec.block))
  return _backward(x, z, scale, rstd, dy, spec=spec, interpret=interpret)
