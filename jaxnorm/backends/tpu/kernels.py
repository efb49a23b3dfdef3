r"""Internal API: the Pallas TPU kernels, forward and backward, plain norm and residual add + norm.

One program per block of ``block_rows`` whole rows (:mod:`jaxnorm.backends.tpu.config`: the
TPU's tiling), the grid's one axis "parallel" (Mosaic may split it over a chip's TensorCores):

* **forward** (:func:`forward_kernel`): one read of ``x`` (with the residual add, of ``x`` and
  ``residual``: :math:`h = \mathrm{rd}_h(x + \alpha r)`, written beside ``y``), the row
  statistics in float32 as the Triton kernels compute them (pivot :math:`K = x_0`,
  :math:`\delta = \overline{x - K}`, :math:`v = \overline{(x - K - \delta)^2}`; RMSNorm:
  :math:`v = \overline{x^2}`), ``y`` by the call's casting plan (:mod:`jaxnorm._casting`), the
  statistics as ``(rows, 1)`` float32 columns (the XLA backend's layout);
* **backward** (:func:`backward_kernel`): one read of ``x`` (or ``h``), ``dy`` (and ``dh``),
  :math:`dx = r\,(g - \overline g - c\,\hat x\,\overline{g \hat x})` with
  :math:`g = \gamma\, dy` rounded by each forward cast's transpose; each program writes its
  block's column sums of ``dscale``'s and ``dbias``'s summands as one row of a
  ``(blocks, 1, d)`` float32 array, which XLA sums (no atomics: deterministic run to run).

The effective scale :math:`\gamma` (``scale`` or ``1 + scale``, formed as the plan forms it) and
the bias come in as ``(1, d)`` float32 rows, formed in XLA by the launch (:func:`launch_forward`),
so no kernel converts to float16. Rows of the last block past the array are masked out of the
parameter sums (their values are undefined; their stores are dropped). With a padded width
(``TpuConfig(pad_features=True)``) the padding lanes are zero in every operand and masked out
of LayerNorm's centred sums. Everything here trusts its arguments.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm import _math
from jaxnorm.backends.tpu import compat as pl
from jaxnorm.backends.tpu.config import vmem_limit_bytes

__all__ = ["Spec", "backward_kernel", "forward_kernel", "launch_backward", "launch_forward"]


@dataclasses.dataclass(frozen=True)
class Spec:
  """Static description of one launch (hashable)."""

  rows: int
  d: int  # the true feature width
  width: int  # the block's width: d, or d padded to a multiple of 128
  block_rows: int
  center: bool  # LayerNorm (True) or RMSNorm (False)
  has_gamma: bool
  has_bias: bool  # forward: a bias is added; backward: dbias is produced
  epsilon: float
  outside: bool  # epsilon_placement == "outside"
  plan: Any  # the call's jaxnorm._casting.CastPlan (float32 compute)
  interpret: bool
  op: str  # the op's name (the launches' names)
  residual_scale: float = 1.0  # alpha of the residual add
  add: bool = False  # a residual add + norm call (the launches' names)

  @property
  def padded(self) -> bool:
    return self.width != self.d


def _iota(shape, dim):
  return lax.broadcasted_iota(jnp.int32, shape, dim)


def _lane_ok(spec: Spec, shape):
  """None, or the ``(br, width)`` mask of the true feature lanes (padded widths only)."""
  return _iota(shape, 1) < spec.d if spec.padded else None


def _masked(ok, a):
  return a if ok is None else jnp.where(ok, a, 0.0)


def _statistics(spec: Spec, x):
  """``(shift, delta, rstd)`` of a float32 block, each ``(br, 1)`` (RMSNorm: only ``rstd``)."""
  d = spec.d
  if not spec.center:  # padding lanes are zeros: no mask needed
    return None, None, _math.rstd(jnp.sum(x * x, axis=1, keepdims=True) / d, spec.epsilon,
                                  spec.outside)
  ok = _lane_ok(spec, x.shape)
  shift = x[:, 0:1]  # the pivot: column 0 of the row
  t = _masked(ok, x - shift)
  delta = jnp.sum(t, axis=1, keepdims=True) / d
  tc = _masked(ok, t - delta)
  var = jnp.sum(tc * tc, axis=1, keepdims=True) / d
  return shift, delta, _math.rstd(var, spec.epsilon, spec.outside)


def _split(refs, counts):
  """``refs`` cut into consecutive groups of the given sizes (a size 0 group: [])."""
  refs, out = list(refs), []
  for n in counts:
    out.append(refs[:n])
    refs = refs[n:]
  return out


def forward_kernel(spec: Spec, has_add: bool, *refs):
  """Refs: ``x, [residual], [gamma], [bias], y, [h], *stats`` (stats ``(br, 1)`` blocks)."""
  (x_ref, *res), gam, bias, (y_ref, *h), stat_refs = _split(
      refs, (1 + has_add, spec.has_gamma, spec.has_bias, 1 + has_add, 3 if spec.center else 1))
  x = x_ref[...].astype(jnp.float32)
  if has_add:
    r = res[0][...].astype(jnp.float32)
    x = x + (r if spec.residual_scale == 1.0 else spec.residual_scale * r)
    hv = x.astype(h[0].dtype)
    h[0][...] = hv
    x = hv.astype(jnp.float32)  # the statistics and y are those of the stored h
  shift, delta, r = _statistics(spec, x)
  xc = (x - shift) - delta if spec.center else x
  g = gam[0][...] if gam else None
  b = bias[0][...] if bias else None
  y_ref[...] = spec.plan.normalized_affine(xc, r, g, b).astype(y_ref.dtype)
  for ref, value in zip(stat_refs, (shift, delta, r) if spec.center else (r,)):
    ref[...] = value


def backward_kernel(spec: Spec, has_dh: bool, split: bool, *refs):
  """Refs: ``x, dy, [dh], [gamma], *stats, dx, [dresidual], [dscale_part], [dbias_part]``;
  ``dresidual = alpha dx`` written when ``split``."""
  (x_ref, dy_ref, *dh), gam, stat_refs, (dx_ref, *dres), ds, db = _split(
      refs, (2 + has_dh, spec.has_gamma, 3 if spec.center else 1, 1 + split, spec.has_gamma,
             spec.has_bias))
  x = x_ref[...].astype(jnp.float32)
  dy = dy_ref[...].astype(jnp.float32)
  stats = [ref[...] for ref in stat_refs]
  r = stats[-1]
  if spec.center:
    xh = _masked(_lane_ok(spec, x.shape), ((x - stats[0]) - stats[1]) * r)
  else:
    xh = x * r
  plan = spec.plan
  dq, dz, g = plan.cotangents(dy, gam[0][...] if gam else None)
  u, _ = plan.affine_of(xh, None, None)
  coef = jnp.sum(g * xh, axis=1, keepdims=True) / spec.d
  c = _math.variance_path_factor(r, spec.epsilon, spec.outside)
  inner = xh * (coef if c is None else coef * c)
  if spec.center:
    inner = inner + jnp.sum(g, axis=1, keepdims=True) / spec.d
  dx = r * (g - inner)
  if has_dh:
    dx = dx + dh[0][...].astype(jnp.float32)
  dx_ref[...] = dx.astype(dx_ref.dtype)
  if split:
    alpha = spec.residual_scale
    dres[0][...] = (dx if alpha == 1.0 else alpha * dx).astype(dres[0].dtype)
  # Rows past the array in the last block hold undefined values: out of the parameter sums.
  row_ok = pl.program_id(1) * spec.block_rows + _iota(x.shape, 0) < spec.rows
  for refs_, term in ((ds, dz * u), (db, dq)):
    if refs_:
      refs_[0][...] = jnp.sum(jnp.where(row_ok, term, 0.0), axis=0, keepdims=True)


def _call(kernel, spec: Spec, args, in_kinds, out_shapes, out_kinds, name: str):
  """``pallas_call`` over ``(groups, row blocks)``; every operand has a leading group axis
  (squeezed out of the kernel's view). Kinds: "row" ``(G, rows, width)``, "param"
  ``(G, 1, width)``, "stat" ``(G, rows, 1)``, "part" ``(G, blocks, 1, width)``."""
  br, w, sq = spec.block_rows, spec.width, pl.Squeezed
  specs = {
      "row": lambda: pl.BlockSpec((sq(), br, w), lambda g, i: (g, i, 0)),
      "param": lambda: pl.BlockSpec((sq(), 1, w), lambda g, i: (g, 0, 0)),
      "stat": lambda: pl.BlockSpec((sq(), br, 1), lambda g, i: (g, i, 0)),
      "part": lambda: pl.BlockSpec((sq(), sq(), 1, w), lambda g, i: (g, i, 0, 0)),
  }
  groups = args[0].shape[0]
  rows_io = [a.dtype.itemsize for a, k in zip(args, in_kinds) if k == "row"]
  rows_io += [o.dtype.itemsize for o, k in zip(out_shapes, out_kinds) if k == "row"]
  params = dict(dimension_semantics=("parallel", "parallel"))
  limit = vmem_limit_bytes(br, w, rows_io)
  if limit is not None:
    params["vmem_limit_bytes"] = limit
  return pl.pallas_call(
      kernel,
      out_shape=out_shapes,
      grid=(groups, pl.cdiv(spec.rows, br)),
      in_specs=[specs[k]() for k in in_kinds],
      out_specs=[specs[k]() for k in out_kinds],
      compiler_params=pl.CompilerParams(**params),
      interpret=pl.interpret_mode() if spec.interpret else False,
      name=name,
  )(*args)


def _pad(spec: Spec, a):
  """``a`` (``(G, rows, d)`` or ``(G, 1, d)``) with zero lanes up to the block's width."""
  if a is None or not spec.padded:
    return a
  return jnp.pad(a, ((0, 0), (0, 0), (0, spec.width - spec.d)))


def _unpad(spec: Spec, a):
  return a if not spec.padded else a[..., :spec.d]


def _forward(x, residual, gamma, bias, *, spec: Spec, out_dtype, h_dtype):
  has_add = residual is not None
  groups, rows = x.shape[0], spec.rows
  row_args = [x] + ([residual] if has_add else [])
  params = [p for p in (gamma, bias) if p is not None]
  args = [_pad(spec, a) for a in row_args + params]
  kinds = ["row"] * len(row_args) + ["param"] * len(params)
  outs = [jax.ShapeDtypeStruct((groups, rows, spec.width), out_dtype)]
  outs += [jax.ShapeDtypeStruct((groups, rows, spec.width), h_dtype)] if has_add else []
  n_stats = 3 if spec.center else 1
  outs += [jax.ShapeDtypeStruct((groups, rows, 1), jnp.float32)] * n_stats
  out_kinds = ["row"] * (1 + has_add) + ["stat"] * n_stats
  name = f"jaxnorm_tpu_{'add_' if spec.add else ''}{spec.op}_fwd"
  res = _call(functools.partial(forward_kernel, spec, has_add), spec, args, kinds, outs,
              out_kinds, name)
  return tuple(_unpad(spec, a) for a in res[:1 + has_add]) + tuple(res[1 + has_add:])


def _backward(x, dy, dh, gamma, stats, *, spec: Spec, dx_dtype, dres_dtype):
  has_dh, split = dh is not None, dres_dtype is not None
  groups, rows, w = x.shape[0], spec.rows, spec.width
  nb = -(-rows // spec.block_rows)
  row_args = [x, dy] + ([dh] if has_dh else [])
  args = [_pad(spec, a) for a in row_args + ([gamma] if spec.has_gamma else [])] + list(stats)
  kinds = ["row"] * len(row_args) + ["param"] * spec.has_gamma + ["stat"] * len(stats)
  outs = [jax.ShapeDtypeStruct((groups, rows, w), dx_dtype)]
  outs += [jax.ShapeDtypeStruct((groups, rows, w), dres_dtype)] if split else []
  n_parts = spec.has_gamma + spec.has_bias
  outs += [jax.ShapeDtypeStruct((groups, nb, 1, w), jnp.float32)] * n_parts
  out_kinds = ["row"] * (1 + split) + ["part"] * n_parts
  name = f"jaxnorm_tpu_{'add_' if spec.add else ''}{spec.op}_bwd"
  res = list(_call(functools.partial(backward_kernel, spec, has_dh, split), spec, args, kinds,
                   outs, out_kinds, name))
  cts = [_unpad(spec, a) for a in res[:1 + split]]
  sums = [_unpad(spec, jnp.sum(p, axis=(1, 2))) for p in res[1 + split:]]  # (G, d) each
  dscale = sums.pop(0) if spec.has_gamma else None
  dbias = sums.pop(0) if spec.has_bias else None
  return (*cts, dscale, dbias)


def _grouped(launch, **static):
  """``launch(*arrays, **static)`` whose ``jax.vmap`` is one launch with more groups: a batch
  axis of any operand is merged into the leading group axis of all of them (unbatched ones
  broadcast), so no ``pallas_call`` is ever batched by ``vmap`` (whose grid axis TPU interpret
  mode's ``dimension_semantics`` do not follow in jax 0.10.2; Mosaic's own lowering does)."""

  @jax.custom_batching.custom_vmap
  def f(*args):
    return launch(*args, **static)

  @f.def_vmap
  def rule(axis_size, in_batched, *args):
    def merge(a, batched):
      a = a if batched else jnp.broadcast_to(a, (axis_size,) + a.shape)
      return a.reshape((axis_size * a.shape[1],) + a.shape[2:])

    merged = jax.tree.map(merge, args, tuple(in_batched))
    outs = f(*merged)
    split = jax.tree.map(lambda o: o.reshape((axis_size, -1) + o.shape[1:]), outs)
    return split, jax.tree.map(lambda _: True, outs)

  return f


@functools.partial(jax.jit, static_argnames=("spec", "out_dtype", "h_dtype"))
def launch_forward(x, residual, gamma, bias, *, spec: Spec, out_dtype, h_dtype=None):
  """``(y, [h], *stats)`` of ``x: (G, rows, d)`` (``residual`` None: the plain op) for ``G``
  groups (heads, or ``vmap``'s batch: one more grid axis); ``gamma`` and ``bias``: float32
  ``(G, 1, d)`` rows or None; stats ``(G, rows, 1)`` float32."""
  return _grouped(_forward, spec=spec, out_dtype=out_dtype, h_dtype=h_dtype)(
      x, residual, gamma, bias)


@functools.partial(jax.jit, static_argnames=("spec", "dx_dtype", "dres_dtype"))
def launch_backward(x, dy, dh, gamma, stats, *, spec: Spec, dx_dtype, dres_dtype=None):
  """``(dx, [dresidual], dscale, dbias)`` (float32 ``(G, d)`` sums, None where absent) from
  ``x: (G, rows, d)`` (or ``h``), ``dy`` (and ``dh``: the residual add, None for none or the
  plain op) and the ``(G, rows, 1)`` float32 statistics; ``dres_dtype`` not None: write
  ``dresidual`` too."""
  return _grouped(_backward, spec=spec, dx_dtype=dx_dtype, dres_dtype=dres_dtype)(
      x, dy, dh, gamma, tuple(stats))
