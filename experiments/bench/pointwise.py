"""``python -m experiments bench-pointwise``: does a kernel pay for DyT/Derf? Measured, not assumed.

For each shape and dtype, interleaved in one process (:func:`experiments.bench.timing.time_interleaved`):

* ``copy``: ``x * 2`` (read N, write N), the memory floor of any elementwise op;
* ``jaxnorm``: :func:`jaxnorm.dyt` / :func:`jaxnorm.derf` (the derived rules), forward, and the
  backward: ``jax.vjp``'s closure, made by one jitted program and applied to a cotangent by
  another that takes it as an argument (its residuals are inputs, never constants XLA could
  fold);
* ``autodiff``: the same through :mod:`jaxnorm.reference` (JAX's own derivatives);
* ``add+op``: the residual add ``h = x + r`` then the op, one jitted program returning ``(y, h)``
  (what the model runs; read 2N, write 2N), against ``add`` alone (``x + r``: read 2N, write N).

Ratios to ``copy`` say how close each is to the memory floor; ``add+op / add`` says what the op
costs once XLA has fused it with the add. Writes ``pointwise-<tag>-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jaxnorm
from experiments.bench.cli import parse_dtypes, parse_shapes
from experiments.bench.timing import time_interleaved
from experiments.bench.output import add_run_args, bench_meta, write_outputs


def pointwise_ops() -> tuple[str, ...]:
  """The names of the pointwise ops of :data:`jaxnorm.OPS`, in the table's order (read when
  called, so an op added with ``jaxnorm.ops.table.register`` is one)."""
  return tuple(name for name, op in jaxnorm.OPS.items() if op.family == "pointwise")


def _fns(op_name: str, dtype):
  op, ref = jaxnorm.OPS[op_name].fn, jaxnorm.OPS[op_name].reference
  # The scalars (alpha, and Derf's shift) are the parameters before scale and bias.
  n_scalars = len([p for p in jaxnorm.OPS[op_name].params if p not in ("scale", "bias")])

  def params(d):
    scal = tuple(jnp.asarray(v, jnp.float32) for v in (0.5, 0.1)[:n_scalars])
    return scal + (jnp.ones((d,), jnp.float32), jnp.zeros((d,), jnp.float32))

  def fwd(f):
    return jax.jit(lambda x, p: f(x, *p))

  def bwd(f):
    """``(bwd, make_vjp)``: the vjp closure made by one jitted program, applied by another
    that takes it as an argument (its residuals are inputs there, never folded constants)."""
    make_vjp = jax.jit(lambda x, p: jax.vjp(lambda x, p: f(x, *p), x, p)[1])
    return jax.jit(lambda pull, dy: pull(dy)), make_vjp

  def add_op(f):
    return jax.jit(lambda x, r, p: (f(x + r, *p), x + r))

  return params, {"jaxnorm": op, "autodiff": ref}, fwd, bwd, add_op


def bench(shapes, dtypes, ops, repeats: int, sample_ms: float):
  """Rows of median seconds and ratios for every (op, shape, dtype)."""
  rows = []
  for dt_name in dtypes:
    dtype = jnp.dtype(dt_name)
    for shape in shapes:
      keys = jax.random.split(jax.random.key(0), 3)
      x = jax.random.normal(keys[0], shape, dtype)
      r = jax.random.normal(keys[1], shape, dtype)
      dy = jax.random.normal(keys[2], shape, dtype)
      for op_name in ops:
        params, impls, fwd, bwd, add_op = _fns(op_name, dtype)
        p = params(shape[-1])
        calls = {"copy": (jax.jit(lambda x: x * 2), (x,)),
                 "add": (jax.jit(lambda x, r: x + r), (x, r))}
        for name, f in impls.items():
          calls[f"{name} fwd"] = (fwd(f), (x, p))
          apply, make_vjp = bwd(f)
          calls[f"{name} bwd"] = (apply, (jax.block_until_ready(make_vjp(x, p)), dy))
          calls[f"{name} add+op"] = (add_op(f), (x, r, p))
        for fn, args in calls.values():
          jax.block_until_ready(fn(*args))
        t = time_interleaved(calls, repeats=repeats, sample_ms=sample_ms)
        med = {k: v["median_s"] for k, v in t.items()}
        rows.append({"op": op_name, "shape": list(shape), "dtype": dt_name,
                     "median_s": med, "times_s": {k: v["times_s"] for k, v in t.items()},
                     "over_copy": {k: med[k] / med["copy"] for k in med},
                     "add_op_over_add": {n: med[f"{n} add+op"] / med["add"] for n in impls}})
  return rows


def _markdown(meta, rows) -> str:
  out = [f"# DyT/Derf against the memory floor ({meta['device']}, {meta['date']})", "",
         f"`{meta['command']}`; {meta['repeats']} interleaved rounds; medians; time / copy "
         "(`x * 2`) of the same shape; load average at the start {load}.".format(**meta), "",
         "| op | shape | dtype | copy us | jaxnorm fwd | autodiff fwd | jaxnorm bwd | autodiff bwd "
         "| jaxnorm add+op / add | autodiff add+op / add |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    oc, ao = r["over_copy"], r["add_op_over_add"]
    out.append(f"| {r['op']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | "
               f"{r['median_s']['copy'] * 1e6:.1f} | {oc['jaxnorm fwd']:.2f} | "
               f"{oc['autodiff fwd']:.2f} | {oc['jaxnorm bwd']:.2f} | {oc['autodiff bwd']:.2f} | "
               f"{ao['jaxnorm']:.2f} | {ao['autodiff']:.2f} |")
  return "\n".join(out) + "\n"


def main(argv=None) -> int:
  """Parses the options, runs :func:`bench`, prints the table and writes JSON + markdown."""
  parser = argparse.ArgumentParser(prog="python -m experiments bench-pointwise",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", type=parse_shapes, default="1024x256,4096x1024,2048x4096",
                      help="ROWSxD,... (default: %(default)s)")
  parser.add_argument("--dtypes", type=parse_dtypes, default="float32,bfloat16")
  parser.add_argument("--ops", default=",".join(pointwise_ops()),
                      help="pointwise ops of jaxnorm.OPS (default: all of them, %(default)s)")
  add_run_args(parser)
  args = parser.parse_args(argv)
  shapes = args.shapes  # parse_shapes: ((rows, d), ...), checked by the parser
  ops = args.ops.split(",")
  bad = [o for o in ops if o not in pointwise_ops()]
  if bad:
    parser.error(f"--ops: {bad} are not pointwise ops of jaxnorm.OPS")
  if args.repeats < 3:
    parser.error(f"--repeats must be >= 3, got {args.repeats}")
  rows = bench(shapes, args.dtypes, ops, args.repeats, args.sample_ms)
  meta = bench_meta("python -m experiments bench-pointwise " + " ".join(argv or []),
                    args.repeats)
  write_outputs(args.out, "pointwise", args.tag, meta, rows, _markdown(meta, rows))
  return 0
