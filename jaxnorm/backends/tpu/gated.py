r"""Internal API: gated RMSNorm's TPU kernels and their entries in the TPU backend's table.

The kernels see each group of ``group_size`` features as a row: ``x: (rows, d)`` viewed as
``(rows * groups, group_size)`` (a free reshape), so every per-group statistic is a row
statistic of the norms' kind and each block is ``(block_rows, group_size)`` with ``block_rows``
a multiple of both the sublane count and the number of groups (row ``i`` of a block is group
``i % groups``). Per row, with :math:`g = \operatorname{silu}(z)` and
:math:`u = x` (gate last, ``norm_before_gate``) or :math:`x g` (gate first):

.. math::

   r = (\overline{u^2} + \epsilon)^{-1/2},\quad \hat u = u r,\quad
   p = \gamma \hat u\ (\text{rounded by the casting plan}),\quad y = p g\ \text{or}\ p,

and the backward of :mod:`jaxnorm.backends.xla.gated` (its formulas, the casting plan's
transposes), with ``dscale``'s summand summed per group in each block (one ``(groups, d/groups)``
row of partial sums per block, summed by XLA). ``gamma`` enters as float32 rows tiled to the
block (``(block_rows, group_size)``: row ``i`` holds group ``i % groups``'s scale). ``rstd`` is
``(rows, groups)`` float32, as the XLA backend's. Grid ``(row blocks,)``, "parallel".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm import _math
from jaxnorm.backends.tpu import compat as pl
from jaxnorm.backends.tpu import config as _config

__all__ = ["ROLES", "refusal"]


@dataclasses.dataclass(frozen=True)
class GatedSpec:
  """Static description of the launches of one call (hashable); the rows are the launch's."""

  k: int  # group_size (the true width)
  width: int  # the block's width: k, or k padded to a multiple of 128
  groups: int
  max_block_rows: int  # a multiple of the sublane count and of groups
  epsilon: float
  norm_before_gate: bool
  cast: Any  # the call's CastPlan, or None (nothing rounds before y)
  interpret: bool
  rows: int = 0  # rows of the grouped view in this launch (set by the launch)

  @property
  def block_rows(self) -> int:
    return self.rows if self.rows <= self.max_block_rows else self.max_block_rows


def refusal(op, x2_shape, dtype, options: dict) -> str | None:
  """Why the kernels cannot take gated RMSNorm on ``x2: (rows, d)`` with ``options``
  (``group_size`` divides ``d``: checked by the op; ``casting``: a plan rounding to float16 is
  refused where the call is traced), or None."""
  del op, options
  return _config.refusal_of_dtype("inputs", dtype) or _config.refusal_of_shape(x2_shape)


def _gate(z):
  s = jax.nn.sigmoid(z)
  return z * s, s * (1.0 + z * (1.0 - s))


def _times(a, b):
  return a if b is None else a * b


def _row_mean(spec: GatedSpec, a):
  return jnp.sum(a, axis=1, keepdims=True) / spec.k


def _affine(spec: GatedSpec, uh, gam):
  if spec.cast is None:
    return uh, _times(uh, gam)
  return spec.cast.affine_of(uh, gam, None)


def _forward_kernel(spec: GatedSpec, *refs):
  """Refs: ``x, z, [gamma], y, rstd``."""
  x_ref, z_ref, *rest = refs
  gam_ref = rest.pop(0) if len(rest) == 3 else None
  y_ref, r_ref = rest
  x = x_ref[...].astype(jnp.float32)
  g, _ = _gate(z_ref[...].astype(jnp.float32))
  u = x if spec.norm_before_gate else x * g
  r = _math.rstd(_row_mean(spec, u * u), spec.epsilon, False)
  _, p = _affine(spec, u * r, None if gam_ref is None else gam_ref[...])
  y_ref[...] = (p * g if spec.norm_before_gate else p).astype(y_ref.dtype)
  r_ref[...] = r


def _backward_kernel(spec: GatedSpec, *refs):
  """Refs: ``x, z, [gamma], rstd, dy, dx, dz, [dscale_part]``."""
  has_gamma = len(refs) == 8  # x, z, gamma, rstd, dy; dx, dz, part (6 without a scale)
  x_ref, z_ref, *rest = refs
  gam = rest.pop(0)[...] if has_gamma else None
  r_ref, dy_ref, dx_ref, dz_ref, *part = rest
  x = x_ref[...].astype(jnp.float32)
  g, dg = _gate(z_ref[...].astype(jnp.float32))
  dy = dy_ref[...].astype(jnp.float32)
  r = r_ref[...]
  u = x if spec.norm_before_gate else x * g
  uh = u * r
  dn = dy * g if spec.norm_before_gate else dy  # the cotangent of p
  if spec.cast is None:
    a, term, p = _times(dn, gam), dn * uh, None
  else:
    ur, p = spec.cast.affine_of(uh, gam, None)
    _, dp, a = spec.cast.cotangents(dn, gam)
    term = dp * ur
  du = r * (a - uh * _row_mean(spec, a * uh))
  if spec.norm_before_gate:
    dx = du
    dz = (dy * p if p is not None else _times(dy * uh, gam)) * dg
  else:
    dx, dz = du * g, du * x * dg
  dx_ref[...] = dx.astype(dx_ref.dtype)
  dz_ref[...] = dz.astype(dz_ref.dtype)
  if part:
    # Row i of the block is group i % groups (block_rows is a multiple of groups); rows past
    # the array hold undefined values.
    i = lax.broadcasted_iota(jnp.int32, term.shape, 0)
    ok = pl.program_id(0) * spec.block_rows + i < spec.rows
    which = lax.rem(i, jnp.int32(spec.groups))
    sums = [jnp.sum(jnp.where(ok & (which == j), term, 0.0), axis=0, keepdims=True)
            for j in range(spec.groups)]
    part[0][...] = sums[0] if spec.groups == 1 else jnp.concatenate(sums, axis=0)


def _call(kernel, spec: GatedSpec, args, kinds, outs, out_kinds, name):
  br, w, sq = spec.block_rows, spec.width, pl.Squeezed
  specs = {
      "row": lambda: pl.BlockSpec((br, w), lambda i: (i, 0)),
      "gamma": lambda: pl.BlockSpec((br, w), lambda i: (0, 0)),
      "stat": lambda: pl.BlockSpec((br, 1), lambda i: (i, 0)),
      "part": lambda: pl.BlockSpec((sq(), spec.groups, w), lambda i: (i, 0, 0)),
  }
  itemsizes = [a.dtype.itemsize for a, k in zip(list(args) + list(outs), kinds + out_kinds)
               if k in ("row", "gamma")]
  params = dict(dimension_semantics=("parallel",))
  limit = _config.vmem_limit_bytes(br, w, itemsizes)
  if limit is not None:
    params["vmem_limit_bytes"] = limit
  return pl.pallas_call(
      functools.partial(kernel, spec), out_shape=outs, grid=(pl.cdiv(spec.rows, br),),
      in_specs=[specs[k]() for k in kinds], out_specs=[specs[k]() for k in out_kinds],
      compiler_params=pl.CompilerParams(**params),
      interpret=pl.interpret_mode() if spec.interpret else False, name=name)(*args)


def _pad(spec: GatedSpec, a):
  return a if spec.width == spec.k else jnp.pad(a, ((0, 0), (0, spec.width - spec.k)))


def _gamma_rows(spec: GatedSpec, gam):
  """The ``(groups, group_size)`` float32 scale tiled to one block of the grouped view (row
  ``i`` holds group ``i % groups``'s), or None."""
  if gam is None:
    return None
  return _pad(spec, jnp.tile(gam, (spec.block_rows // spec.groups, 1)))


def _spec(cfg, x) -> GatedSpec:
  d = x.shape[-1]
  k, tcfg = cfg.group_size, cfg.backend_config
  groups = d // k
  sub = max(_config.sublanes(dt) for dt in (x.dtype, cfg.out_dtype))
  step = sub * groups // math.gcd(sub, groups)  # a multiple of the sublanes and the groups
  if tcfg.block_rows is not None:
    if tcfg.block_rows % step:
      raise ValueError(f"TpuConfig.block_rows must be a multiple of {step} for gated "
                       f"RMSNorm in {groups} groups, got {tcfg.block_rows}.")
    br = tcfg.block_rows
  else:
    br = max(step, (_config.TARGET_TILE // _config.padded_width(k, True)) // step * step)
  return GatedSpec(k=k, width=_config.padded_width(k, tcfg.pad_features), groups=groups,
                   max_block_rows=br, epsilon=cfg.epsilon,
                   norm_before_gate=cfg.norm_before_gate, cast=cfg.cast,
                   interpret=tcfg.interpret)


def _batched(launch, merge_rows: int, **static):
  """``launch(*arrays, **static)`` whose ``jax.vmap`` never batches a ``pallas_call`` (see
  :mod:`jaxnorm.backends.tpu.kernels`): with ``merge_rows`` (the forward: its first
  ``merge_rows`` operands are row arrays, its results per row) and an unbatched scale, one
  launch on the batch's rows (the rows of the grouped view are independent); otherwise (the
  backward, whose ``dscale`` is per batch member, or a batched scale) one launch per member,
  stacked."""

  @jax.custom_batching.custom_vmap
  def f(*args):
    return launch(*args, **static)

  @f.def_vmap
  def rule(axis_size, in_batched, *args):
    args = [a if a is None or b else jnp.broadcast_to(a, (axis_size,) + a.shape)
            for a, b in zip(args, in_batched)]
    if merge_rows and not any(in_batched[merge_rows:]):
      rows = [a.reshape((-1,) + a.shape[2:]) for a in args[:merge_rows]]
      outs = jax.tree.map(lambda o: o.reshape((axis_size, -1) + o.shape[1:]),
                          f(*rows, *args[merge_rows:]))
    else:
      each = [f(*[None if a is None else a[i] for a in args]) for i in range(axis_size)]
      outs = jax.tree.map(lambda *o: jnp.stack(o), *each)
    return outs, jax.tree.map(lambda _: True, outs)

  return f


def _launch_forward(x, z, gam, *, spec: GatedSpec, out_dtype):
  spec = dataclasses.replace(spec, rows=x.shape[0])
  gam = _gamma_rows(spec, gam)
  args = [_pad(spec, x), _pad(spec, z)] + ([] if gam is None else [gam])
  kinds = ["row", "row"] + ([] if gam is None else ["gamma"])
  outs = [jax.ShapeDtypeStruct((spec.rows, spec.width), out_dtype),
          jax.ShapeDtypeStruct((spec.rows, 1), jnp.float32)]
  y, r = _call(_forward_kernel, spec, args, kinds, outs, ["row", "stat"],
               "jaxnorm_tpu_gated_rms_norm_fwd")
  return y[:, :spec.k], r


def _launch_backward(x, z, rstd, dy, gam, *, spec: GatedSpec):
  spec = dataclasses.replace(spec, rows=x.shape[0])
  gam = _gamma_rows(spec, gam)
  nb = -(-spec.rows // spec.block_rows)
  args = [_pad(spec, x), _pad(spec, z)] + ([] if gam is None else [gam])
  args += [rstd, _pad(spec, dy)]
  kinds = ["row", "row"] + ([] if gam is None else ["gamma"]) + ["stat", "row"]
  outs = [jax.ShapeDtypeStruct((spec.rows, spec.width), x.dtype),
          jax.ShapeDtypeStruct((spec.rows, spec.width), z.dtype)]
  out_kinds = ["row", "row"]
  if gam is not None:
    outs.append(jax.ShapeDtypeStruct((nb, spec.groups, spec.width), jnp.float32))
    out_kinds.append("part")
  res = _call(_backward_kernel, spec, args, kinds, outs, out_kinds,
              "jaxnorm_tpu_gated_rms_norm_bwd")
  dscale = None if gam is None else jnp.sum(res[2], axis=0)[:, :spec.k].reshape(-1)
  return res[0][:, :spec.k], res[1][:, :spec.k], dscale


@functools.partial(jax.jit, static_argnames=("spec", "out_dtype"))
def launch_forward(x, z, gam, *, spec: GatedSpec, out_dtype):
  """``(y, rstd)`` of the grouped view ``x, z: (rows, group_size)``; ``gam``: the float32
  ``(groups, group_size)`` scale or None; ``rstd: (rows, 1)``."""
  return _batched(_launch_forward, 2, spec=spec, out_dtype=out_dtype)(x, z, gam)


@functools.partial(jax.jit, static_argnames=("spec",))
def launch_backward(x, z, rstd, dy, gam, *, spec: GatedSpec):
  """``(dx, dz, dscale)`` of the grouped view (``dscale`` float32 ``(d,)``, None without a
  scale)."""
  return _batched(_launch_backward, 0, spec=spec)(x, z, rstd, dy, gam)


def _grouped(spec: GatedSpec, a):
  return a.reshape(-1, spec.k)


def _gam(spec: GatedSpec, scale):
  return None if scale is None else scale.astype(jnp.float32).reshape(spec.groups, spec.k)


def forward(cfg, x, z, scale):
  """``(y, rstd)``: ``y`` like ``x`` in ``cfg.out_dtype``, ``rstd: (..., groups)`` float32."""
  spec = _spec(cfg, x)
  y, r = launch_forward(_grouped(spec, x), _grouped(spec, z), _gam(spec, scale), spec=spec,
                        out_dtype=jnp.dtype(cfg.out_dtype))
  return y.reshape(x.shape), r.reshape(x.shape[:-1] + (spec.groups,))


def forward_only(cfg, x, z, scale):
  """``y`` from the forward kernel."""
  return forward(cfg, x, z, scale)[0]


def backward(cfg, x, z, scale, rstd, dy):
  """``(dx, dz, dscale)``: ``dscale`` float32 ``(d,)`` (None without a scale)."""
  spec = _spec(cfg, x)
  dx, dz, dscale = launch_backward(_grouped(spec, x), _grouped(spec, z),
                                   rstd.reshape(-1, 1).astype(jnp.float32),
                                   _grouped(spec, dy), _gam(spec, scale), spec=spec)
  return dx.reshape(x.shape), dz.reshape(z.shape), dscale


ROLES = dict(refusal=refusal, forward_only=forward_only, forward=forward, backward=backward)
"""The op's entries in the TPU backend's table."""
