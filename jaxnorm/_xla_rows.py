"""Internal API: the row reductions, collectives and barriers every XLA formula is built from.

Shared by the op declarations (:mod:`jaxnorm._norm_ops`, whose statistics are written with
them) and the formulas (:mod:`jaxnorm.backends.xla.formulas`). ``cfg`` is the call's
:class:`jaxnorm._norm_config.NormConfig` (its ``axis_name``, ``axis_index_groups``,
``epsilon`` and ``epsilon_placement``), trusted as prepared.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm import _jax_compat
from jaxnorm import _math

__all__ = ["compute_dtype", "count", "cse_barrier", "first_pivot", "match_vma", "normalizer",
           "psum", "row_sums", "variance_path_factor"]


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
    n = jnp.full((1,) * len(x_shape), size, dtype)
  else:
    n = jnp.sum(mask, axis=-1, keepdims=True, dtype=dtype)
  return psum(cfg, n)


def normalizer(cfg, var):
  """rstd = 1/sqrt(v + eps) ("inside") or 1/(sqrt(v) + eps) ("outside"): :func:`_math.rstd`."""
  return _math.rstd(var, cfg.epsilon, cfg.epsilon_placement == "outside")


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
  elementwise prologues, so each fuses with its own recomputation. Where YNNPACK takes the whole
  forward into one loop (4096 rows or more, see
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
