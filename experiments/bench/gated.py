"""``python -m experiments bench-gated``: gated RMSNorm's derived rules against the unfused
``jax.numpy`` composition, and both against the memory floor of their own bytes.

For each shape, dtype and gate order, interleaved in one process
(:func:`experiments.bench.timing.time_interleaved`):

* ``floor fwd``: ``x + z`` (read 2N, write N: the forward's own traffic), ``floor bwd``:
  ``(x + dy, z + dy)`` (read 3N, write 2N: the backward's);
* ``jaxnorm-<impl> fwd/bwd``: :func:`jaxnorm.gated_rms_norm` with ``impl`` ("auto": the
  Triton kernels on a GPU, the XLA formulas elsewhere; "xla"; "triton" on a GPU only);
* ``jnp fwd/bwd``: :func:`jaxnorm.reference.gated_rms_norm`, the composition MaxText and Haliax
  write (``rms_norm(x) * silu(z)``), differentiated by JAX.

The backward is ``jax.vjp``'s closure, made by one jitted program and applied by another that
takes it as an argument (its residuals are inputs, never constants XLA could fold). Ratios are
``floor / time`` (1.0 = at the memory floor) and ``jnp / jaxnorm`` (above 1: jaxnorm faster).
Writes ``gated-<tag>-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jaxnorm
from experiments.argtypes import positive_int
from experiments.bench.cli import parse_dtypes, parse_shapes
from experiments.bench.timing import time_interleaved
from experiments.bench.output import add_run_args, bench_meta, write_outputs


def _vjp_pair(f):
  """``(apply, make)``: ``make(x, z, s)`` builds the vjp closure, ``apply(pull, dy)`` runs it."""
  make = jax.jit(lambda x, z, s: jax.vjp(f, x, z, s)[1])
  return jax.jit(lambda pull, dy: pull(dy)), make


def _calls(x, z, s, dy, impls, group_size, norm_before_gate):
  kw = dict(group_size=group_size, norm_before_gate=norm_before_gate)
  fns = {f"jaxnorm-{impl}": (lambda impl: lambda x, z, s: jaxnorm.gated_rms_norm(
      x, z, s, impl=impl, **kw))(impl) for impl in impls}
  fns["jnp"] = lambda x, z, s: jaxnorm.reference.gated_rms_norm(x, z, s, **kw)
  calls = {"floor fwd": (jax.jit(lambda x, z: x + z), (x, z)),
           "floor bwd": (jax.jit(lambda x, z, dy: (x + dy, z + dy)), (x, z, dy))}
  for name, f in fns.items():
    calls[f"{name} fwd"] = (jax.jit(f), (x, z, s))
    apply, make = _vjp_pair(f)
    calls[f"{name} bwd"] = (apply, (jax.block_until_ready(make(x, z, s)), dy))
  return list(fns), calls


def bench(shapes, dtypes, impls, orders, group_size, repeats: int, sample_ms: float):
  """Rows of median seconds and ratios for every (shape, dtype, gate order)."""
  rows = []
  for dt_name in dtypes:
    dtype = jnp.dtype(dt_name)
    for shape in shapes:
      k = jax.random.split(jax.random.key(0), 4)
      x, z, dy = (jax.random.normal(kk, shape, dtype) for kk in k[:3])
      s = (1.0 + 0.1 * jax.random.normal(k[3], shape[-1:])).astype(dtype)
      for nbg in orders:
        names, calls = _calls(x, z, s, dy, impls, group_size, nbg)
        for fn, args in calls.values():
          jax.block_until_ready(fn(*args))
        t = time_interleaved(calls, repeats=repeats, sample_ms=sample_ms)
        med = {c: v["median_s"] for c, v in t.items()}
        rows.append({
            "shape": list(shape), "dtype": dt_name, "norm_before_gate": nbg,
            "group_size": group_size, "median_s": med,
            "times_s": {c: v["times_s"] for c, v in t.items()},
            "of_floor": {f"{n} {p}": med[f"floor {p}"] / med[f"{n} {p}"]
                         for n in names for p in ("fwd", "bwd")},
            "jnp_over": {f"{n} {p}": med[f"jnp {p}"] / med[f"{n} {p}"]
                         for n in names if n != "jnp" for p in ("fwd", "bwd")}})
  return rows


def _markdown(meta, rows) -> str:
  names = sorted({k.rsplit(" ", 1)[0] for r in rows for k in r["of_floor"]})
  jn = [n for n in names if n != "jnp"]
  head = (["shape", "dtype", "gate", "floor fwd us"]
          + [f"{n} {p} / floor" for n in names for p in ("fwd", "bwd")]
          + [f"jnp / {n} {p}" for n in jn for p in ("fwd", "bwd")])
  out = [f"# Gated RMSNorm against the unfused composition ({meta['device']}, {meta['date']})",
         "", f"`{meta['command']}`; {meta['repeats']} interleaved rounds; medians; "
         f"`x / floor` = floor time / its time (1.0 = memory floor of its own bytes); "
         f"`jnp / x` > 1: jaxnorm faster; group_size {meta['group_size']}; load average at the "
         f"start {meta['load']}.", "", "| " + " | ".join(head) + " |",
         "|" + "---|" * len(head)]
  for r in rows:
    cells = [("x".join(map(str, r["shape"]))), r["dtype"],
             "last" if r["norm_before_gate"] else "first",
             f"{r['median_s']['floor fwd'] * 1e6:.1f}"]
    cells += [f"{r['of_floor'][f'{n} {p}']:.2f}" for n in names for p in ("fwd", "bwd")]
    cells += [f"{r['jnp_over'][f'{n} {p}']:.2f}" for n in jn for p in ("fwd", "bwd")]
    out.append("| " + " | ".join(cells) + " |")
  return "\n".join(out) + "\n"


def main(argv=None) -> int:
  """Parses the options, runs :func:`bench`, prints the table and writes JSON + markdown."""
  parser = argparse.ArgumentParser(prog="python -m experiments bench-gated",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", type=parse_shapes, default="4096x1024,2048x4096",
                      help="ROWSxD,... (default: %(default)s)")
  parser.add_argument("--dtypes", type=parse_dtypes, default="float32,bfloat16")
  parser.add_argument("--impls", default="auto",
                      help="jaxnorm impls, comma-separated: auto, xla, triton (GPU)")
  parser.add_argument("--orders", default="last,first",
                      help="gate orders: last (norm_before_gate=True), first")
  parser.add_argument("--group-size", type=positive_int, default=None)
  add_run_args(parser)
  args = parser.parse_args(argv)
  shapes = args.shapes  # parse_shapes: ((rows, d), ...), checked by the parser
  orders = args.orders.split(",")
  if set(orders) - {"last", "first"}:
    parser.error(f"--orders takes last and/or first, got {args.orders!r}")
  impls = args.impls.split(",")
  if set(impls) - {"auto", "xla", "triton"}:
    parser.error(f"--impls takes auto, xla, triton, got {args.impls!r}")
  if args.repeats < 3:
    parser.error(f"--repeats must be >= 3, got {args.repeats}")
  rows = bench(shapes, args.dtypes, impls, [o == "last" for o in orders],
               args.group_size, args.repeats, args.sample_ms)
  meta = bench_meta("python -m experiments bench-gated " + " ".join(argv or []), args.repeats,
                    group_size=args.group_size)
  write_outputs(args.out, "gated", args.tag, meta, rows, _markdown(meta, rows))
  return 0
