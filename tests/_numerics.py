"""Shared test numerics: the one tolerance table keyed by dtype and the comparison helpers.

:func:`assert_close` compares norm-wise: ``max|actual - expected| <= tol * max(max|expected|,
floor)``, which is the right measure for outputs and gradients whose entries pass through zero.
:func:`assert_allclose` compares element by element with ``rtol = atol = tol`` (the module and
kernel tests, whose quantities are of order one). Both take ``tol`` from :data:`TOL`.

Bitwise and last-place comparisons (``docs/bitwise.md`` lists every one the suite makes):
:func:`assert_bitwise` where equality holds by construction on every CPU (the same compiled
program on both sides, or exact operations), :func:`assert_ulp_close` where two different
programs compute the same formula (XLA:CPU may order a float reduction, or contract a multiply
and an add into an FMA, differently in each, and differently per instruction set: AVX2 vs
AVX-512); :func:`compiled` gives a jitted function's outputs and its optimized program, to show
that two sides are one program.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

# Relative (norm-wise) tolerance per dtype of the quantity compared.
TOL = {
    "float64": 1e-10,
    "float32": 2e-5,
    "float16": 4e-3,
    "bfloat16": 3e-2,
}


def tol_for(dtype) -> float:
  """The tolerance of :data:`TOL` for ``dtype`` (a dtype, a name or a scalar type)."""
  return TOL[jnp.dtype(dtype).name]


def loosest(*dtypes) -> np.dtype:
  """The dtype with the loosest tolerance: a result is as precise as its least precise input."""
  return max((jnp.dtype(d) for d in dtypes), key=tol_for)


def assert_allclose(actual, expected, dtype=None, *, what=""):
  """``np.testing.assert_allclose`` in float32 with ``rtol = atol = tol_for(dtype)``.

  ``dtype`` defaults to the dtype of ``actual``.
  """
  tol = tol_for(dtype if dtype is not None else actual.dtype)
  np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32),
                             rtol=tol, atol=tol, err_msg=what)


def assert_close(actual, expected, dtype=None, *, tol=None, floor=0.0, what=""):
  """Asserts ``max|actual - expected| <= tol * max(max|expected|, floor)``.

  ``floor`` is the natural magnitude of the quantity (e.g. the sum of absolute values that a
  gradient is a cancelling sum of): it keeps the check meaningful when the exact result is
  itself ~0, as LayerNorm's input gradient is for d <= 2.
  """
  dtype = dtype or expected.dtype
  tol = tol if tol is not None else tol_for(dtype)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
  a, e = _host_f32(actual).astype(np.float64), _host_f32(expected).astype(np.float64)
  if jnp.dtype(dtype) == jnp.float64:
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  # Where the oracle is finite, so must we be; where autodiff of the plain formula is not
  # (sqrt at a zero variance), the derived rule may legitimately be finite.
  fin = np.isfinite(e)
  assert np.all(np.isfinite(a)[fin]), f"{what}: non-finite where the reference is finite"
  denom = max(float(np.max(np.abs(e[fin]), initial=0.0)), float(floor), 1e-30)
  err = float(np.max(np.abs(a[fin] - e[fin]), initial=0.0)) / denom
  assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g} ({jnp.dtype(dtype).name})"


def _host_f32(a) -> np.ndarray:
  """``a`` (a JAX or NumPy array, any float dtype) as a float32 NumPy array, converted on the host.

  The same values as ``jnp.asarray(a, jnp.float32)`` (every float16/bfloat16 value is a float32),
  without compiling a convert for each new shape and dtype.
  """
  return np.asarray(a).astype(np.float32)


def random(key, shape, dtype, *, loc=0.0, scale=1.0):
  return (loc + scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def host_random(rng: np.random.Generator, shape, dtype, *, loc=0.0, scale=1.0):
  """:func:`random` drawn with NumPy on the host: for tests that draw many distinct shapes.

  ``jax.random.normal`` compiles once per new shape (about 0.5 s of CPU each on a CPU backend),
  which made the hypothesis tests spend most of their time drawing inputs.
  """
  a = loc + scale * rng.standard_normal(shape, dtype=np.float32)
  return jnp.asarray(a.astype(jnp.dtype(dtype)))


def host_mask(rng: np.random.Generator, shape, p=0.7):
  """A boolean mask with ``P(True) = p`` and the first element of every row True."""
  m = rng.random(shape) < p
  m[..., 0] = True
  return jnp.asarray(m)


# --------------------------------------------------------------------------- bits and ulps


def _ordered(a) -> np.ndarray:
  """A float array's values as integers in the order of the floats (-0 and +0 both 0), int64.

  Consecutive representable values differ by 1, so the difference of two is their distance in
  units in the last place of the dtype.
  """
  a = np.asarray(a)
  bits = a.view({2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]).astype(np.int64)
  sign = np.int64(1) << np.int64(8 * a.dtype.itemsize - 1)
  return np.where(bits < 0, -(bits & (sign - 1)), bits)


def ulp_distance(actual, expected) -> np.ndarray:
  """Elementwise distance in units in the last place of the (common) dtype, as float64.

  0 where both are the same NaN position or the same infinity; ``inf`` where only one is NaN.
  """
  a, e = np.asarray(actual), np.asarray(expected)
  assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
  dist = np.abs(_ordered(a).astype(np.float64) - _ordered(e).astype(np.float64))
  na, ne = np.isnan(a.astype(np.float32)), np.isnan(e.astype(np.float32))
  return np.where(na & ne, 0.0, np.where(na | ne, np.inf, dist))


def assert_bitwise(actual, expected, what=""):
  """Equal bits, element by element (NaN-safe); the message counts the differing elements and
  gives their largest distance in ulps."""
  a, e = np.asarray(actual), np.asarray(expected)
  assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != {e.dtype}"
  assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
  if a.dtype.kind != "f":
    n = int(np.sum(a != e))
    assert n == 0, f"{what}: {n} of {a.size} elements differ"
    return
  dist = ulp_distance(a, e)
  n = int(np.sum(dist != 0))
  assert n == 0, (f"{what}: {n} of {a.size} elements differ (by up to {dist.max():g} ulp of "
                  f"{a.dtype})")


def assert_ulp_close(actual, expected, max_ulp, *, of=None, what=""):
  """``actual`` within ``max_ulp`` units in the last place of ``expected`` (same dtype and shape).

  ``of=None``: element by element, in ulps of each expected element. ``of="max"``: in ulps of
  the largest ``|expected|`` (for cancelling sums such as gradients, whose small entries carry
  the rounding errors of their large terms); ``of=<array>``: element by element, in ulps of
  ``max(|expected|, |of|)`` (the magnitude a result's rounding errors scale with, e.g. the
  larger term of a sum). Non-finite values must agree exactly. The message gives the largest
  distance found and how many elements differ at all.
  """
  a, e = np.asarray(actual), np.asarray(expected)
  assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != {e.dtype}"
  assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
  fin = np.isfinite(e.astype(np.float32))
  assert np.array_equal(fin, np.isfinite(a.astype(np.float32))), f"{what}: non-finite differ"
  assert np.all(ulp_distance(a[~fin], e[~fin]) == 0), f"{what}: non-finite values differ"
  n_diff = int(np.sum(ulp_distance(a, e) != 0))
  e64 = np.abs(e.astype(np.float64))
  if of is None:
    dist = ulp_distance(a, e)
  else:
    if isinstance(of, str):
      assert of == "max", of
      mag = np.full(e.shape, float(np.max(e64[fin], initial=0.0)))
    else:
      mag = np.maximum(e64, np.abs(np.broadcast_to(np.asarray(of, np.float64), e.shape)))
    # One ulp at magnitude m: the spacing of the dtype at m (at least the smallest subnormal).
    spacing = np.spacing(np.where(fin, mag, 0.0).astype(a.dtype)).astype(np.float64)
    tiny = float(jnp.finfo(a.dtype).smallest_subnormal)
    dist = np.abs(a.astype(np.float64) - e.astype(np.float64)) / np.maximum(spacing, tiny)
  worst = float(np.max(np.where(fin, dist, 0.0), initial=0.0))
  assert worst <= max_ulp, (f"{what}: {worst:g} ulp of {a.dtype} > {max_ulp} ({n_diff} of "
                            f"{a.size} elements differ)")
  return worst


def compiled(f, *args, options=None, keep_unused=False):
  """``(outputs, program)``: ``jax.jit(f)`` run on ``args`` and its optimized XLA program as
  text without metadata and names (:func:`hlo_text`), from one compilation (with the XLA
  compiler ``options``, e.g. ``{"xla_allow_excess_precision": False}``; ``keep_unused``: keep
  every argument as a parameter of the program, as ``jax.jit``'s option of that name)."""
  exe = jax.jit(f, keep_unused=keep_unused).lower(*args).compile(options)
  return exe(*args), hlo_text(exe.as_text())


def hlo_text(text: str) -> str:
  """An optimized HLO module's text with what does not change the program removed.

  The source-location tables (file and function names, stack frames, which precede the first
  computation), each instruction's ``metadata``, and names: every ``%name`` (instructions,
  computations) is renamed by order of first appearance and parameter names in signatures are
  dropped. Two programs with equal texts are the same computation, wired the same way, so they
  compile to the same code and give the same bits.
  """
  text = text[text.index("\n%") if "\n%" in text else text.index("\nENTRY"):]
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  text = re.sub(r",? ?stack_frame_id=\d+", "", text)
  names = {}
  text = re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%{len(names)}"), text)
  return re.sub(r"[\w.\-]+: (?=[a-z][a-z0-9]*\[|\()", "", text)


def reductions(program: str) -> int:
  """How many reduce and reduce-window instructions a :func:`hlo_text` holds."""
  return len(re.findall(r" (?:reduce|reduce-window)\(", program))
