"""Internal API: the row reductions, collectives, barriers and parameter rows every XLA formula is
built from.

Shared by the XLA backend's arithmetic (:mod:`jaxnorm.backends.xla.statistics`,
:mod:`jaxnorm.backends.xla.formulas`, gated RMSNorm's) and the differentiation layer's own XLA
steps (the memory-saving backward's recovery of ``x_hat``, which needs :func:`gamma`). ``cfg``
is the call's :class:`jaxnorm._norm_config.NormConfig` (its ``axis_name``,
``axis_index_groups``, ``epsilon``, ``epsilon_placement`` and casting plan), trusted as prepared.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm import _jax_compat
from jaxnorm import _math

__all__ = ["YNN_MIN_ELEMENTS", "as_row", "compute_dtype", "count", "cse_barrier", "first_pivot",
           "gamma", "match_vma", "normalizer", "on_ynn_rows", "param_row", "psum", "residual_add",
           "row_sums", "variance_path_factor"]


# XLA:CPU hands an instruction to YNNPACK only if it or an operand has at least this many
# elements (``kMinElements`` in XLA's ``IsInstructionPreferredByYnn``, xla/backends/cpu/
# ynn_support.cc): with fewer rows than this, the per-row statistics stay out of YNNPACK's
# fusions (see jaxnorm.backends.xla.formulas.forward_only and the statistics).
YNN_MIN_ELEMENTS = 4096


def on_ynn_rows(x) -> bool:
  """Whether ``x: (..., d)`` has :data:`YNN_MIN_ELEMENTS` rows or more (XLA:CPU's YNNPACK then
  takes its per-row statistics into its fusions)."""
  return math.prod(x.shape[:-1]) >= YNN_MIN_ELEMENTS


def compute_dtype(dtype) -> np.dtype:
  """Dtype of statistics and row reductions: at least float32, float64 stays float64."""
  return jnp.promote_types(dtype, jnp.float32)


def psum(cfg, x):
  if cfg.axis_name is None:
    return x
  return lax.psum(x, cfg.axis_name, axis_index_groups=cfg.axis_index_groups)


def row_sums(*arrays, mask=None):
  """Row sums (over the last axis, keepdims) of each array; masked-out entries count as 0.

  Separate ``jnp.sum`` calls rather than one variadic ``lax.reduce``: XLA:CPU lowers a
  variadic reduce with its generic loop emitter, which measured 1.5x slower than two
  vectorized sums over the same data.
  """
  if mask is not None:
    arrays = tuple(jnp.where(mask, a, 0) for a in arrays)
  return tuple(jnp.sum(a, axis=-1, keepdims=True) for a in arrays)


def match_vma(ct, primal_vma):
  """Sums a parameter cotangent over the mesh axes its primal is replicated on.

  Inside ``shard_map`` with the batch split over, say, "data", a parameter replicated over
  "data" receives per-shard gradient contributions: its cotangent is their sum.
  """
  extra = _jax_compat.varying_axes(ct) - primal_vma
  if extra:
    ct = lax.psum(ct, tuple(sorted(extra, key=str)))
  return ct


def count(cfg, mask, x_shape, dtype):
  """n: the number of elements (over all shards) the statistics average over, shape (..., 1)."""
  if mask is None:
    size = x_shape[-1]
    if cfg.axis_name is not None and cfg.axis_index_groups is None:
      # The axes' size is known when tracing: no collective of a constant (which JAX cannot
      # batch over a vmap axis inside shard_map: a bare AssertionError; the row sums' psum
      # then raises JAX's own message). Not with groups, which may differ in size.
      return jnp.full((1,) * len(x_shape), size * lax.axis_size(cfg.axis_name), dtype)
    if cfg.axis_name is None:  # a constant, not a traced op: nothing to trace
      return np.full((1,) * len(x_shape), size, dtype)
    n = jnp.full((1,) * len(x_shape), size, dtype)
  else:
    n = jnp.sum(mask, axis=-1, keepdims=True, dtype=dtype)
  return psum(cfg, n)


def normalizer(cfg, var, guard: bool = True):
  """rstd = 1/sqrt(v + eps) ("inside") or 1/(sqrt(v) + eps) ("outside"), NaN past the float
  range (0 with ``guard=False``): :func:`_math.rstd`."""
  return _math.rstd(var, cfg.epsilon, cfg.epsilon_placement == "outside", guard)


def variance_path_factor(cfg, rstd):
  """c in the backward's variance-path term (None for "inside").

  See :func:`jaxnorm._math.variance_path_factor`.
  """
  return _math.variance_path_factor(rstd, cfg.epsilon, cfg.epsilon_placement == "outside")


def cse_barrier(*arrays):
  """The arrays behind an ``optimization_barrier``: same values, opaque to XLA's CSE.

  XLA:CPU keeps a full-size ``(..., d)`` intermediate (``x - shift``, a broadcast ``rstd``, the
  float32 copy of a bfloat16 input) in memory when two of its fusions share it, instead of
  recomputing it inside each: one more write and read of ``x``'s size, and on a large array a
  freshly mapped buffer. Giving each consumer (a row sum, a column sum, the final map) its own
  barrier-wrapped view of the inputs stops common-subexpression elimination from merging their
  elementwise prologues, so each fuses with its own recomputation. Where a float32 ``x`` needs no
  convert and XLA fuses a shared ``x - shift`` into each loop (4096 rows or more, see
  :func:`jaxnorm.backends.xla.formulas.forward_only`), the forward alone goes without them. The
  barriers are removed before code generation and cost nothing at run time.

  Two barriers over the same operands in the same order are themselves merged (and constant
  operands do not tell them apart), so every call site passes a different tuple; where two sites
  need the same arrays, they pass them in a different order. See ``docs/perf-notes.md``.
  """
  return lax.optimization_barrier(arrays)


def first_pivot(x):
  """The row's first element, ``(..., 1)`` in the compute dtype: a pivot with no reduction.

  Sliced from a :func:`cse_barrier` view of ``x``: XLA:CPU cannot put a slice into the loop fusion
  of the row sums, and without the barrier it hoists the float32 convert of a bfloat16 ``x``
  out of that loop for the slice to share (a full-size float32 copy). With it, the slice is a
  small fusion of its own that reads one element per row, and the sums' loop reads ``x``.
  """
  (xv,) = cse_barrier(x)
  return xv[..., :1].astype(compute_dtype(x.dtype))


def as_row(p, ndim, dtype):
  """:func:`param_row` of a parameter, in ``dtype``."""
  return param_row(p, ndim).astype(dtype)


def param_row(p, ndim):
  """A ``(heads..., d)`` parameter as ``(1, ..., 1, heads..., d)`` (explicit rank, no rank
  promotion) in its own dtype, or None. ``heads`` is empty for a parameter shared by every
  row; per-head parameters line up with ``x``'s axes just before the normalized one."""
  return None if p is None else p.reshape((1,) * (ndim - p.ndim) + tuple(p.shape))


def gamma(cfg, scale, ndim, dtype=None):
  r"""The effective per-feature multiplier :math:`\gamma` as a ``(1, ..., 1, d)`` row, or None.

  :math:`\gamma = s` or :math:`1 + s` (``zero_centered_scale``), formed as the call's casting
  mode forms it (:meth:`jaxnorm._casting.CastPlan.gamma_of`: in the scale's dtype for "llama"
  and "t5") and returned in the compute dtype. The one place the XLA forward, the backward, the
  tangent and the Jacobian get it from (the kernels call the same ``gamma_of``). ``dtype``: the
  input's dtype (it fixes the compute dtype); default ``scale.dtype``.
  """
  if scale is None:
    return None
  plan = cfg.plan(scale.dtype if dtype is None else dtype)
  return plan.gamma_of(param_row(scale, ndim), cfg.zero_centered_scale)


def residual_add(cfg, x, residual):
  """``h = x + alpha * residual`` of the residual add + norm (``cfg.residual_scale`` is alpha),
  added in at least float32 and rounded once to ``cfg.h_dtype``: the add every backend shares
  (:class:`jaxnorm.backends.interface.Backend` composes it with a plain op's entries)."""
  ct = compute_dtype(jnp.promote_types(cfg.h_dtype, jnp.promote_types(x.dtype,
                                                                      residual.dtype)))
  r = residual.astype(ct)
  if cfg.residual_scale != 1.0:
    r = cfg.residual_scale * r
  return (x.astype(ct) + r).astype(cfg.h_dtype)
