r"""Timing of jitted norm ops: the measuring library of the benchmark, the tuner and the speed study.

A sample enqueues ``k`` calls and blocks on the last one (``k`` is chosen so a sample lasts about
``sample_ms``; this hides the dispatch latency of microsecond GPU kernels); the reported time is
the median over ``repeats`` samples divided by ``k``. :func:`time_interleaved` samples several
functions in turn (one sample of each per round), so that load from other processes on a shared
machine falls on all of them alike and their ratios stay meaningful; :func:`time_fn` is its
one-function case.

Bytes that must move (``N = tokens * d`` elements, ``s_x`` the size of an element of ``x``,
``s_p`` of a parameter; statistics are not counted, a fused kernel may recompute them):

.. math::

   B_\mathrm{fwd} = 2 N s_x + n_p d s_p, \qquad
   B_\mathrm{bwd} = 3 N s_x + 2 n_p d s_p, \qquad
   B_\mathrm{fwd+bwd} = B_\mathrm{fwd} + B_\mathrm{bwd},

(forward: read ``x``, write ``y``, read the ``n_p`` parameter vectors; backward: read ``x`` and
``dy``, write ``dx``, read ``scale`` and write ``dscale``/``dbias``). The copy baseline is
``x * 2`` (read ``N``, write ``N``); its bandwidth is the practical ceiling. For the fused ops
(``h = x + residual``, ``(y, h)`` out, cotangents ``dy`` and ``dh`` in):

.. math::

   B_\mathrm{fwd} = 4 N s_x + n_p d s_p, \qquad
   B_\mathrm{bwd} = 4 N s_x + 2 n_p d s_p

(forward: read ``x`` and ``residual``, write ``h`` and ``y``; backward: read ``h``, ``dy`` and
``dh``, write ``dx``, which is also ``dresidual``). The opt-in ``jvp`` mode (primal and tangent,
:func:`jvp_call`) must move :math:`4 N s_x + 2 n_p d s_p` (read ``x`` and its tangent, write ``y``
and its tangent, read the parameters and their tangents), the fused ops
:math:`8 N s_x + n_p d s_p`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from experiments.bench.impls import FUSED_OPS

# The number of parameter vectors of each op of jaxnorm.OPS and of its residual add + norm op.
_N_PARAMS = {**{name: len(op.params) for name, op in jaxnorm.OPS.items()},
             **{op.add_fn.__name__: len(op.params) for op in jaxnorm.OPS.values() if op.add_fn}}

MODES = ("fwd", "bwd", "fwd+bwd")
# Opt-in (--modes ...,jvp): forward-mode primal + tangent, see jvp_call.
ALL_MODES = MODES + ("jvp",)


def _calls_per_sample(fn: Callable, args: tuple, sample_ms: float, tries: int = 5) -> int:
  """``k`` such that ``k`` calls of ``fn(*args)`` last about ``sample_ms`` (1 to 1000).

  From the fastest of ``tries`` single calls: on a loaded machine one call can take 10x its
  usual time, and a ``k`` of 1 for a microsecond call measures the per-sample overhead.
  """
  single = math.inf
  for _ in range(tries):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    single = min(single, time.perf_counter() - t0)
  return max(1, min(1000, int(math.ceil(sample_ms * 1e-3 / max(single, 1e-7)))))


CLOCKS = {
    # Elapsed time: what a caller waits for.
    "wall": time.perf_counter,
    # CPU time of this process, every thread summed: the work done, which other jobs on a
    # shared machine delay but do not add to (the threads of one call wait, they do not spin).
    "cpu": time.process_time,
}


def _sample(fn: Callable, args: tuple, k: int, clock: Callable[[], float] = time.perf_counter) -> float:
  """Seconds (of ``clock``) per call of ``k`` calls of ``fn(*args)`` enqueued back to back."""
  t0 = clock()
  out = None
  for _ in range(k):
    out = fn(*args)
  jax.block_until_ready(out)
  return (clock() - t0) / k


def time_interleaved(calls: dict[str, tuple[Callable, tuple]], *, repeats: int,
                     sample_ms: float, clock: str = "wall") -> dict[str, dict[str, float]]:
  """Median seconds per call of several functions, their samples interleaved.

  ``calls`` maps a name to ``(fn, args)`` (already compiled and warmed up). Each function gets
  its own ``k`` calls per sample, chosen so a sample lasts about ``sample_ms``; round ``r`` takes
  sample ``r`` of every function in turn, so slow phases of a shared machine hit all of them,
  starting at the ``r``-th function (the order rotates, so no function always runs first).
  ``clock``: a key of :data:`CLOCKS`, ``"wall"`` (elapsed) or ``"cpu"`` (the process's CPU time,
  all threads: steadier than elapsed time on a loaded machine, blind to idle waiting).

  Returns:
    Per name: ``median_s``, ``min_s``, ``max_s``, ``calls_per_sample``, ``samples`` and
    ``times_s`` (every sample, in round order: sample ``r`` of two names was taken in the same
    round, so their ratio per round pairs timings that saw the same load).
  """
  tick = CLOCKS[clock]
  ks = {name: _calls_per_sample(fn, args, sample_ms) for name, (fn, args) in calls.items()}
  samples: dict[str, list[float]] = {name: [] for name in calls}
  names = list(calls)
  for r in range(repeats):
    # The order rotates by one each round, so every function takes every position equally
    # often: with a fixed order, two runs of one program timed 0.73-0.89x (the second of a
    # pair) and 1.05-1.21x (the last of a round) of each other on the 2-core AMD EPYC
    # (docs/perf-notes.md, issue 45).
    for name in names[r % len(names):] + names[:r % len(names)]:
      fn, args = calls[name]
      samples[name].append(_sample(fn, args, ks[name], tick))
  return {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                 "calls_per_sample": ks[name], "samples": len(v), "times_s": v}
          for name, v in samples.items()}


def time_fn(fn: Callable, args: tuple, *, repeats: int, sample_ms: float) -> dict[str, float]:
  """Median seconds per call of ``fn(*args)`` (already compiled and warmed up by the caller).

  The one-function case of :func:`time_interleaved`, with the same statistics.
  """
  return time_interleaved({"fn": (fn, args)}, repeats=repeats, sample_ms=sample_ms)["fn"]


def _memory(compiled) -> dict[str, int] | None:
  try:
    ma = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every backend implements it.
    return None
  if ma is None:
    return None
  keys = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
          "alias_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes")
  out = {}
  for k in keys:
    v = getattr(ma, k, None)
    if isinstance(v, (int, np.integer)):
      out[k] = int(v)
  return out


def must_move_bytes(op: str, mode: str, rows: int, d: int, x_itemsize: int,
                    p_itemsize: int) -> int:
  """Bytes an implementation cannot avoid moving (see the module docstring)."""
  n_params = _N_PARAMS[op]
  n = rows * d
  if op in FUSED_OPS:  # read x, residual, write h, y; read h, dy, dh, write dx (= dresidual)
    fwd = 4 * n * x_itemsize + n_params * d * p_itemsize
    bwd = 4 * n * x_itemsize + 2 * n_params * d * p_itemsize
    jvp = 2 * fwd - n_params * d * p_itemsize  # the fwd again for the tangents
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd, "jvp": jvp}[mode]
  fwd = 2 * n * x_itemsize + n_params * d * p_itemsize
  bwd = 3 * n * x_itemsize + 2 * n_params * d * p_itemsize
  jvp = 4 * n * x_itemsize + 2 * n_params * d * p_itemsize  # read x, dot x; write y, dot y
  return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd, "jvp": jvp}[mode]


def jvp_call(f: Callable, inp: "Inputs", *, fused: bool = False) -> tuple[Callable, tuple]:
  r"""The ``jvp`` mode of one implementation: ``jax.jit`` of ``jax.jvp(f, primals, tangents)``.

  Times the primal and the tangent together, :math:`(y, \dot y) = (f(p), J_f(p)\,\dot p)`,
  with a tangent on every input: ``dy`` (and ``dh``) as the tangents of ``x`` (and
  ``residual``), the scale and bias themselves as their own tangents. Returns
  ``(call, args)``, compiled and warmed up by the caller like the other modes.
  """
  lead = (inp.x, inp.residual) if fused else (inp.x,)
  lead_t = (inp.dy, inp.dh) if fused else (inp.dy,)
  n = len(lead) + 2

  @jax.jit
  def call(*args):
    return jax.jvp(f, args[:n], args[n:])

  return call, (*lead, inp.scale, inp.bias, *lead_t, inp.scale, inp.bias)


def _functions(f: Callable, n_primals: int) -> dict[str, Callable]:
  """The jitted functions of one implementation ``f(*primals)``.

  ``fwd(*primals)``; ``make_vjp(*primals)`` (the ``vjp`` closure, its residuals outputs);
  ``bwd(vjp_fn, *cts)``, the closure passed as an argument, so XLA cannot fold its residuals;
  ``fwd+bwd(*primals, *cts)``. One cotangent is passed as is, several as a tuple (the fused
  ops' ``(dy, dh)``).
  """
  def cotangent(cts):
    return cts[0] if len(cts) == 1 else tuple(cts)

  @jax.jit
  def make_vjp(*primals):
    return jax.vjp(f, *primals)

  @jax.jit
  def bwd(vjp_fn, *cts):
    return vjp_fn(cotangent(cts))

  @jax.jit
  def fwd_bwd(*args):
    out, vjp_fn = jax.vjp(f, *args[:n_primals])
    return out, vjp_fn(cotangent(args[n_primals:]))

  return {"fwd": jax.jit(f), "make_vjp": make_vjp, "bwd": bwd, "fwd+bwd": fwd_bwd}


@dataclasses.dataclass
class Inputs:
  """The arrays of one benchmark entry (see :func:`make_inputs`)."""
  x: jax.Array
  scale: jax.Array
  bias: jax.Array
  dy: jax.Array
  residual: jax.Array  # the residual stream of the fused ops, (rows, d) in dtype
  dh: jax.Array  # the cotangent of h, (rows, d) in dtype


def make_inputs(rows: int, d: int, dtype: str, seed: int = 0) -> Inputs:
  """Random inputs of one benchmark entry, computed and blocked on before any timing.

  ``x = 2 N(0, 1) + 0.5`` and the cotangent ``dy = N(0, 1)``, both ``(rows, d)`` in ``dtype``;
  ``scale = 1 + 0.1 N(0, 1)`` and ``bias = 0.1 N(0, 1)``, both ``(d,)`` in float32; for the
  fused ops a residual ``N(0, 1)`` and a cotangent ``dh = N(0, 1)``, ``(rows, d)`` in ``dtype``.

  Args:
    rows: number of rows (tokens).
    d: feature size.
    dtype: dtype name of ``x`` and ``dy`` (``"float32"``, ``"bfloat16"``, ...).
    seed: the PRNG seed.

  Returns:
    The :class:`Inputs`.
  """
  kx, ks, kb, kd, kr, kh = jax.random.split(jax.random.key(seed), 6)
  dt = jnp.dtype(dtype)
  x = (2.0 * jax.random.normal(kx, (rows, d), jnp.float32) + 0.5).astype(dt)
  scale = 1.0 + 0.1 * jax.random.normal(ks, (d,), jnp.float32)
  bias = 0.1 * jax.random.normal(kb, (d,), jnp.float32)
  dy = jax.random.normal(kd, (rows, d), jnp.float32).astype(dt)
  residual = jax.random.normal(kr, (rows, d), jnp.float32).astype(dt)
  dh = jax.random.normal(kh, (rows, d), jnp.float32).astype(dt)
  return Inputs(*jax.block_until_ready((x, scale, bias, dy, residual, dh)))


def prepare_entry(f: Callable, inp: Inputs, *, modes: tuple[str, ...],
                  fused: bool = False) -> tuple[dict[str, tuple[Callable, tuple]], Any]:
  """Compiles and warms up one implementation at one (op, shape, dtype).

  ``fused``: ``f`` is a fused-op implementation ``f(x, residual, scale, bias) -> (y, h)``,
  differentiated with the cotangents ``(dy, dh)``. Returns ``({mode: (fn, args)}, memory)``: the
  calls to time and the ``memory_analysis`` of the jitted fwd+bwd.
  """
  lead = (inp.x, inp.residual) if fused else (inp.x,)
  fns = _functions(f, len(lead) + 2)
  cts = (inp.dy, inp.dh) if fused else (inp.dy,)
  args = {
      "fwd": (*lead, inp.scale, inp.bias),
      "fwd+bwd": (*lead, inp.scale, inp.bias, *cts),
  }
  compiled_fb = fns["fwd+bwd"].lower(*args["fwd+bwd"]).compile()
  memory = _memory(compiled_fb)
  calls = {}
  for mode in modes:
    if mode == "bwd":
      _, vjp_fn = jax.block_until_ready(fns["make_vjp"](*args["fwd"]))
      call, call_args = fns["bwd"], (vjp_fn, *cts)
    elif mode == "jvp":
      call, call_args = jvp_call(f, inp, fused=fused)
    else:
      call, call_args = fns[mode], args[mode]
    jax.block_until_ready(call(*call_args))  # compile + warm-up
    jax.block_until_ready(call(*call_args))
    calls[mode] = (call, call_args)
  return calls, memory


def copy_bandwidth(inp: Inputs, *, repeats: int, sample_ms: float) -> dict[str, float]:
  """Bandwidth of ``x * 2`` (reads and writes ``x`` once): the practical ceiling."""
  fn = jax.jit(lambda x: x * jnp.asarray(2, x.dtype))
  jax.block_until_ready(fn(inp.x))
  jax.block_until_ready(fn(inp.x))
  t = time_fn(fn, (inp.x,), repeats=repeats, sample_ms=sample_ms)
  nbytes = 2 * inp.x.size * inp.x.dtype.itemsize
  return {"median_s": t["median_s"], "bytes": nbytes, "gbps": nbytes / t["median_s"] / 1e9}
