"""Hypothesis strategies for the inputs of derivative rules: dtypes, shapes, adversarial arrays.

An array is built row by row (a row is a 1-D slice along the last axis, what a norm reduces
over): each row has a *kind* (:data:`ROW_KINDS`) and its values come from a NumPy generator
seeded by a drawn integer. Hypothesis shrinks the kinds towards ``"normal"``, the seed towards
0 and the shape towards the smallest, so a failure shrinks to a small array with only the rows
that matter. Importing this module registers two hypothesis profiles (:data:`CI_PROFILE`,
:data:`THOROUGH_PROFILE`); loading one is the caller's choice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, settings, strategies as st

from jaxnorm import _validation

__all__ = ["CI_PROFILE", "ROW_KINDS", "THOROUGH_PROFILE", "arrays", "dtypes", "masks", "shapes"]

# "normal": loc + scale * N(0, 1). "large_mean": a mean 1e2, 1e3 or 1e4 times the spread (where
# E[x^2] - E[x]^2 loses every digit). "constant": one value (a zero variance). "tiny": values
# near the bottom of the dtype's normal range that still square within it (float16: ~1e-3).
# "huge": large values whose squares still fit float32 (float16: ~1e3, so they overflow a
# float16 square). "nan", "inf": one non-finite element in an otherwise normal row.
ROW_KINDS = ("normal", "large_mean", "constant", "tiny", "huge", "nan", "inf")
_FINITE_KINDS = ROW_KINDS[:5]

CI_PROFILE = "jaxnorm.testing.ci"
THOROUGH_PROFILE = "jaxnorm.testing.thorough"
settings.register_profile(
    CI_PROFILE, deadline=None, derandomize=True, max_examples=10, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    THOROUGH_PROFILE, deadline=None, max_examples=500, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _dtype_name(name: str, dtype) -> str:
  """The name of ``dtype``, a floating dtype or its name (:func:`jaxnorm._validation.check_dtype`:
  ``TypeError`` naming the argument ``name`` otherwise)."""
  return _validation.check_dtype(name, dtype).name


def dtypes(allowed=("float32", "bfloat16", "float16")) -> st.SearchStrategy:
  """Floating dtypes (shrinking towards the first of ``allowed``).

  Args:
    allowed: dtypes or names; float64 needs ``jax.enable_x64`` where the rule runs.

  Returns:
    A strategy of ``numpy.dtype`` values.
  """
  if isinstance(allowed, str) or not isinstance(allowed, (tuple, list)):
    raise TypeError(f"allowed must be a tuple of dtypes, got {allowed!r}; e.g. "
                    f"allowed=('float32',).")
  names = [_dtype_name(f"allowed[{i}]", d) for i, d in enumerate(allowed)]
  if not names:
    raise ValueError("dtypes(allowed=...) needs at least one dtype, got none.")
  return st.sampled_from([jnp.dtype(n) for n in names])


def shapes(*, min_rank: int = 1, max_rank: int = 3, max_side: int = 4,
           last=(1, 2, 3, 7, 16, 33, 100, 256)) -> st.SearchStrategy:
  """Array shapes: leading sides in ``[1, max_side]``, the last side drawn from ``last``.

  Args:
    min_rank: the smallest rank (>= 1).
    max_rank: the largest rank (>= min_rank).
    max_side: the largest leading side (the batch and sequence axes of a row-wise op).
    last: the sizes of the last (reduced, feature) axis, small first: hypothesis shrinks
      towards the first. A strategy of ints is taken as is.

  Returns:
    A strategy of shape tuples.
  """
  if not (isinstance(min_rank, int) and isinstance(max_rank, int) and 1 <= min_rank <= max_rank):
    raise ValueError(f"shapes needs 1 <= min_rank <= max_rank, got min_rank={min_rank!r}, "
                     f"max_rank={max_rank!r}.")
  if not isinstance(max_side, int) or max_side < 1:
    raise ValueError(f"max_side must be an int >= 1, got {max_side!r}.")
  last_st = last if isinstance(last, st.SearchStrategy) else st.sampled_from(tuple(last))

  @st.composite
  def build(draw):
    rank = draw(st.integers(min_rank, max_rank))
    lead = [draw(st.integers(1, max_side)) for _ in range(rank - 1)]
    return tuple(lead) + (draw(last_st),)

  return build()


def _row(rng, kind, d, dtype, loc, scale):
  fi = jnp.finfo(dtype)
  if kind == "large_mean":
    ratio = float(rng.choice([1e2, 1e3, 1e4]))
    return (rng.choice([-1.0, 1.0]) * ratio + rng.standard_normal(d)) * scale
  if kind == "constant":
    return np.full(d, loc + scale * rng.standard_normal())
  if kind == "tiny":
    return rng.standard_normal(d) * max(1e-6, float(fi.tiny) * 16)
  if kind == "huge":
    return rng.standard_normal(d) * (1e3 if fi.bits <= 16 and fi.maxexp <= 16 else 2.0 ** 32)
  row = loc + scale * rng.standard_normal(d)
  if kind in ("nan", "inf"):
    row[int(rng.integers(d))] = np.nan if kind == "nan" else rng.choice([-np.inf, np.inf])
  return row


def arrays(dtype, shape, *, loc: float = 0.0, scale: float = 1.0, kinds=_FINITE_KINDS,
           nonfinite: bool = False) -> st.SearchStrategy:
  """Arrays whose rows (slices along the last axis) are each of a drawn kind (:data:`ROW_KINDS`).

  Args:
    dtype: a floating dtype or a strategy of them (:func:`dtypes`).
    shape: a shape tuple or a strategy of them (:func:`shapes`); rank >= 1.
    loc: the mean of the "normal" and "constant" rows.
    scale: their spread (and the spread of "large_mean" rows).
    kinds: the row kinds to draw from; the first is what rows shrink to. Default: the finite
      ones.
    nonfinite: also draw "nan" and "inf" rows (pass ``nonfinite="match"`` or ``"any"`` to
      :func:`jaxnorm.testing.check_rule` accordingly).

  Returns:
    A strategy of ``jax.Array`` values of that dtype and shape.
  """
  kinds = _validation.check_subset("kinds", kinds, ROW_KINDS)
  kinds += ("nan", "inf") if _validation.check_bool("nonfinite", nonfinite) else ()
  if not kinds:
    raise ValueError(f"kinds must be a non-empty subset of {ROW_KINDS}, got {kinds!r}.")
  dtype_st = dtype if isinstance(dtype, st.SearchStrategy) else st.just(_dtype_name("dtype", dtype))
  shape_st = shape if isinstance(shape, st.SearchStrategy) else st.just(tuple(shape))

  @st.composite
  def build(draw):
    dt = jnp.dtype(_dtype_name("dtype", draw(dtype_st)))
    shp = tuple(int(s) for s in draw(shape_st))
    if not shp:
      raise ValueError("arrays needs a shape of rank >= 1 (rows along the last axis), got ().")
    rows = int(np.prod(shp[:-1]))
    row_kinds = draw(st.lists(st.sampled_from(kinds), min_size=rows, max_size=rows))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    values = np.stack([_row(rng, k, shp[-1], dt, loc, scale) for k in row_kinds]) if rows else (
        np.zeros((0, shp[-1])))
    with np.errstate(over="ignore", invalid="ignore"):
      values = values.reshape(shp).astype(dt)
    if dt == np.float64:  # stays float64 outside the scope: check_rule runs it with x64 on
      with jax.enable_x64(True):
        return jnp.asarray(values)
    return jnp.asarray(values)

  return build()


def masks(shape, *, p: float = 0.7) -> st.SearchStrategy:
  """Boolean masks (True: the element takes part in the statistics) with at least one True in
  every row (slice along the last axis), so that no normalized group is empty.

  Args:
    shape: a shape tuple or a strategy of them; rank >= 1.
    p: the probability of True of each element but the one per row that is always True.

  Returns:
    A strategy of boolean ``jax.Array`` values (held fixed by
    :func:`jaxnorm.testing.check_rule`: not a floating leaf).
  """
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"masks needs 0 <= p <= 1, got p={p!r}.")
  shape_st = shape if isinstance(shape, st.SearchStrategy) else st.just(tuple(shape))

  @st.composite
  def build(draw):
    shp = tuple(int(s) for s in draw(shape_st))
    if not shp:
      raise ValueError("masks needs a shape of rank >= 1 (rows along the last axis), got ().")
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    m = rng.random(shp) < p
    if shp[-1]:
      keep = rng.integers(shp[-1], size=shp[:-1])
      np.put_along_axis(m, keep[..., None], True, axis=-1)
    return jnp.asarray(m)

  return build()
