r"""Op-level benchmark of LayerNorm and RMSNorm: ``python -m experiments bench [options]``.

One run times, for each (op, implementation, shape, dtype), three jitted functions

* ``fwd``      ``y = f(x, scale, bias)``;
* ``bwd``      the backward pass alone: the ``vjp`` closure of ``f`` (its residuals are inputs)
  applied to a random cotangent ``dy``;
* ``fwd+bwd``  ``y`` and the cotangents ``(dx, dscale, dbias)`` in one jitted function,
* ``jvp``      (opt-in, ``--modes jvp``) forward mode: ``jax.jvp`` of ``f``, the primal and the
  tangent for tangents on every input (:func:`experiments.bench.timing.jvp_call`),

and reports the median time of many samples after warm-up, the achieved bandwidth against the
bytes the op *must* move, the copy bandwidth measured in the same run, the LayerNorm/RMSNorm
time ratio, and the ``compiled.memory_analysis()`` of the jitted fwd+bwd.

Fused residual add + norm (ops ``add_layer_norm``, ``add_rms_norm``: ``h = x + residual``,
``(y, h)`` out, cotangents ``dy`` and ``dh`` in) is timed for the fused op against the add
followed by the plain op (``unfused-xla``, ``unfused-pallas``) and against the add followed
by Flax's norm (``flax-linen``), in the same three modes. Every row of one (op, shape, dtype)
is measured against the bytes the *fused* op must move:

.. math::

   B_\mathrm{fwd} = 4 N s_x + n_p d s_p, \qquad
   B_\mathrm{bwd} = 4 N s_x + 2 n_p d s_p

(forward: read ``x`` and ``residual``, write ``h`` and ``y``; backward: read ``h``, ``dy`` and
``dh``, write ``dx``, which is also ``dresidual``). An unfused add + norm must move
``5N`` elements forward (the norm re-reads ``h``) and ``6N`` backward (the add of ``dh`` re-reads
the norm's ``dx``) unless the compiler fuses the two, which XLA can do on its own path but not
across a ``pallas_call``.

The bytes that must move and the timing method (samples of ``k`` calls, implementations of one
(op, shape, dtype, mode) sampled interleaved, ``--repeats`` rounds) are in
:mod:`experiments.bench.timing`; the compared implementations (``--impls``, ``--fused-impls``) in
:mod:`experiments.bench.impls`.

Outputs: a table on stdout, ``bench.json`` (device, versions, date, command, every entry) and
``bench.md`` (markdown tables, among them the ratios to Flax side by side, one column per mode)
under ``--out`` (default ``results/bench``, ignored by git). ``--clock cpu`` times the process's
CPU time instead of elapsed time: on a machine shared with other jobs its ratios move less (the
bandwidth columns then count CPU seconds of all threads, not elapsed ones).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import sys

import jax

import jaxnorm

from experiments.argtypes import folder, positive_float, positive_int
from experiments.bench import tables
from experiments.bench.impls import (ALL_OPS, EPSILON, FUSED_IMPLEMENTATIONS, FUSED_OPS, IMPLEMENTATIONS,
                                     NotApplicable, fused_implementations, implementations)
from experiments.bench.timing import (ALL_MODES, CLOCKS, MODES, copy_bandwidth, make_inputs, must_move_bytes,
                                      prepare_entry, time_interleaved)

GPU_SHAPES = ((8192, 1024), (4096, 4096), (16384, 4096), (32768, 8192))
CPU_SHAPES = ((1024, 64), (4096, 256), (8192, 1024))
DTYPES = ("float32", "bfloat16")


def versions() -> dict[str, str]:
  """Versions of Python, JAX, jaxlib, Flax and tokamax (``"not installed"`` where absent)."""
  out = {"python": platform.python_version(), "jax": jax.__version__}
  for name in ("jaxlib", "flax", "tokamax"):
    try:
      out[name] = importlib.import_module(name).__version__
    except Exception:  # noqa: BLE001
      out[name] = "not installed"
  return out


def machine() -> dict:
  """The CPU model, its vector extensions (from ``/proc/cpuinfo``), the load average, XLA_FLAGS."""
  model, flags, ids = platform.processor() or platform.machine(), [], {}
  try:
    with open("/proc/cpuinfo") as fh:
      for line in fh:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
          model = value.strip()
        elif key in ("vendor_id", "cpu family", "model", "stepping"):
          ids[key.replace(" ", "_")] = value.strip()
        elif key == "flags":
          flags = value.split()
          break
  except OSError:
    pass
  vector = sorted(f for f in flags if f.startswith(("sse", "ssse", "avx", "fma", "f16c", "amx")))
  load = os.getloadavg() if hasattr(os, "getloadavg") else None
  return {"cpu_model": model, "cpu_ids": ids, "vector_extensions": vector, "cpu_count": os.cpu_count(),
          "loadavg": None if load is None else [round(v, 2) for v in load],
          "xla_flags": os.environ.get("XLA_FLAGS", "")}


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
  """The ``argparse`` type of ``--shapes``: ``TOKENSxD,...`` -> ``((tokens, d), ...)``."""
  shapes = []
  for item in text.split(","):
    item = item.strip().lower()
    if not item:
      continue
    try:
      rows, d = (int(v) for v in item.split("x"))
    except ValueError:
      raise argparse.ArgumentTypeError(
          f"--shapes expects comma-separated TOKENSxD pairs such as 8192x1024, got {item!r}"
      ) from None
    if rows <= 0 or d <= 0:
      raise argparse.ArgumentTypeError(f"--shapes entries must be positive, got {item!r}")
    shapes.append((rows, d))
  if not shapes:
    raise argparse.ArgumentTypeError("--shapes is empty")
  return tuple(shapes)


def parse_list(choices: tuple[str, ...], flag: str):
  """The ``argparse`` type of ``flag``: a comma-separated, non-empty subset of ``choices``."""
  def parse(text: str) -> tuple[str, ...]:
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in items if s not in choices]
    if bad or not items:
      raise argparse.ArgumentTypeError(f"{flag} expects a comma-separated subset of {choices}, "
                                       f"got {text!r}")
    return items
  return parse


def parse_dtypes(text: str) -> tuple[str, ...]:
  """The ``argparse`` type of ``--dtypes``: a subset of float32, bfloat16, float16."""
  return parse_list(("float32", "bfloat16", "float16"), "--dtypes")(text)


def build_parser() -> argparse.ArgumentParser:
  """The ``argparse`` parser of ``python -m experiments bench``.

  ``--shapes`` (``TOKENSxD,...``), ``--dtypes``, ``--ops``, ``--impls`` and ``--modes`` take
  comma-separated lists checked against the known choices; ``--shapes``, ``--repeats`` and
  ``--sample-ms`` default to None, which :func:`main` replaces by per-backend defaults.
  """
  p = argparse.ArgumentParser(
      prog="python -m experiments bench",
      description="Time LayerNorm/RMSNorm implementations (fwd, bwd, fwd+bwd) against the copy "
                  "bandwidth; write a table, JSON and markdown.")
  p.add_argument("--shapes", type=parse_shapes, default=None,
                 help="TOKENSxD,... (default: GPU %s; CPU %s)" % (
                     ",".join(f"{r}x{d}" for r, d in GPU_SHAPES),
                     ",".join(f"{r}x{d}" for r, d in CPU_SHAPES)))
  p.add_argument("--dtypes", type=parse_dtypes, default=DTYPES,
                 help="comma-separated dtypes (default: float32,bfloat16)")
  p.add_argument("--ops", type=parse_list(ALL_OPS, "--ops"), default=ALL_OPS,
                 help="subset of " + ",".join(ALL_OPS) + " (the add_* ops: fused residual add)")
  p.add_argument("--impls", type=parse_list(IMPLEMENTATIONS, "--impls"),
                 default=IMPLEMENTATIONS, help="subset of " + ",".join(IMPLEMENTATIONS))
  p.add_argument("--fused-impls", type=parse_list(FUSED_IMPLEMENTATIONS, "--fused-impls"),
                 default=FUSED_IMPLEMENTATIONS,
                 help="implementations of the add_* ops: subset of " +
                      ",".join(FUSED_IMPLEMENTATIONS))
  p.add_argument("--modes", type=parse_list(ALL_MODES, "--modes"), default=MODES,
                 help="subset of fwd,bwd,fwd+bwd,jvp (default: fwd,bwd,fwd+bwd; jvp: forward "
                      "mode, primal and tangent together)")
  p.add_argument("--repeats", type=positive_int, default=None,
                 help="timed samples per entry (default: 50 on GPU, 10 on CPU)")
  p.add_argument("--sample-ms", type=positive_float, default=None,
                 help="target duration of one sample (default: 5 on GPU, 1 on CPU)")
  p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                 help="what a sample measures: wall (elapsed time, default) or cpu (the process's "
                      "CPU time, all threads: steadier on a machine shared with other jobs)")
  p.add_argument("--out", type=folder, default=os.path.join("results", "bench"),
                 help="output directory for bench.json and bench.md")
  p.add_argument("--interpret", action="store_true",
                 help="run the Pallas entries (jaxnorm-pallas, unfused-pallas, jax-pallas-ops) in interpret "
                      "mode: a smoke test on a CPU; their timings are meaningless")
  return p


def _fmt_row(cols, widths):
  return "  ".join(str(c).ljust(w) for c, w in zip(cols, widths))


def main(argv: list[str] | None = None) -> int:
  """Runs the benchmark; see ``python -m experiments bench --help``."""
  args = build_parser().parse_args(argv)
  gpu = jaxnorm.pallas_compiles_on()
  shapes = args.shapes or (GPU_SHAPES if gpu else CPU_SHAPES)
  repeats = args.repeats or (50 if gpu else 10)
  sample_ms = args.sample_ms or (5.0 if gpu else 1.0)
  if repeats < 1:
    raise SystemExit(f"--repeats must be >= 1, got {repeats}")
  return _run(args, shapes, repeats, sample_ms, argv)


_WIDTHS = (10, 14, 10, 8, 7, 11, 8, 7)  # columns of the table printed while measuring


def _key(base: dict, impl: str) -> dict:
  """The identifying fields of a result row, in the order of ``bench.json``: op, impl, shape, dtype."""
  return {"op": base["op"], "impl": impl, "shape": base["shape"], "dtype": base["dtype"]}


def _prepare_op(op: str, names: tuple[str, ...], table: dict, inp, base: dict, modes: tuple[str, ...],
                results: list[dict], memory: list[dict]) -> dict:
  """Compiles every implementation ``names`` of ``op``; failures become ``n/a``/``error`` rows.

  Returns ``{impl: (calls, memory)}`` of :func:`~experiments.bench.timing.prepare_entry` for the
  implementations that compiled; appends the others' rows to ``results`` and the memory analyses
  to ``memory``.
  """
  prepared = {}
  for impl in names:
    row = _key(base, impl)
    try:
      prepared[impl] = prepare_entry(table[impl](op), inp, modes=modes, fused=op in FUSED_OPS)
    except NotApplicable as e:
      results += [{**row, "mode": mode, "status": "n/a", "reason": str(e)} for mode in modes]
      print(f"{op:10s}  {impl:14s}  n/a: {e}")
      continue
    except Exception as e:  # noqa: BLE001 - one failing entry must not end the run.
      msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      results += [{**row, "mode": mode, "status": "error", "reason": msg} for mode in modes]
      print(f"{op:10s}  {impl:14s}  error: {msg}")
      continue
    memory.append({**row, "memory": prepared[impl][1]})
  return prepared


def _time_op(prepared: dict, inp, base: dict, copy: dict, args, repeats: int, sample_ms: float) -> list[dict]:
  """Times the prepared implementations of one (op, shape, dtype), interleaved, mode by mode."""
  rows, d = inp.x.shape
  out = []
  for mode in args.modes:
    timed = time_interleaved({impl: calls[mode] for impl, (calls, _) in prepared.items()},
                             repeats=repeats, sample_ms=sample_ms, clock=args.clock)
    for impl, t in timed.items():
      nbytes = must_move_bytes(base["op"], mode, rows, d, inp.x.dtype.itemsize, inp.scale.dtype.itemsize)
      gbps = nbytes / t["median_s"] / 1e9
      row = {**_key(base, impl), "mode": mode, "status": "ok", **t, "bytes": nbytes,
             "gbps": gbps, "pct_copy": 100.0 * gbps / copy["gbps"]}
      if impl in ("jaxnorm-pallas", "unfused-pallas", "jax-pallas-ops") and args.interpret:
        row["note"] = "interpret mode: timing not meaningful"
      out.append(row)
      print(_fmt_row((base["op"], impl, base["shape"], base["dtype"], mode, f"{t['median_s'] * 1e6:.1f}",
                      f"{gbps:.1f}", f"{row['pct_copy']:.0f}"), _WIDTHS))
  return out


def _run(args, shapes, repeats, sample_ms, argv) -> int:
  """The measuring loop of :func:`main`; returns the exit status."""
  start = machine()
  backend = jax.default_backend()
  device = jax.devices()[0]
  impls = implementations(args.interpret)
  fused_impls = fused_implementations(args.interpret)

  results, copies, memory = [], [], []
  print(_fmt_row(("op", "impl", "shape", "dtype", "mode", "time(us)", "GB/s", "%copy"), _WIDTHS))
  for (rows, d) in shapes:
    shape = f"{rows}x{d}"
    for dtype in args.dtypes:
      inp = make_inputs(rows, d, dtype)
      copy = copy_bandwidth(inp, repeats=repeats, sample_ms=sample_ms)
      copies.append({"shape": shape, "dtype": dtype, **copy})
      print(f"# copy {shape} {dtype}: {copy['gbps']:.1f} GB/s")
      for op in args.ops:
        fused = op in FUSED_OPS
        base = {"op": op, "shape": shape, "dtype": dtype}
        prepared = _prepare_op(op, args.fused_impls if fused else args.impls, fused_impls if fused else impls,
                               inp, base, args.modes, results, memory)
        results += _time_op(prepared, inp, base, copy, args, repeats, sample_ms)
        del prepared

  rms_ln, vs_flax = tables.ratio_tables(results)
  fused_rows = tables.fused_table(results)
  like = tables.like_for_like(results)
  report = {
      "device": getattr(device, "device_kind", str(device)),
      "backend": backend,
      "versions": versions(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "argv": list(sys.argv[1:] if argv is None else argv),
      "epsilon": EPSILON,
      "repeats": repeats,
      "sample_ms": sample_ms,
      "clock": args.clock,
      "copy": copies,
      "results": results,
      "ln_over_rms": rms_ln,
      "vs_flax": vs_flax,
      "fused": fused_rows,
      "like_for_like": like,
      "memory": memory,
      "machine": {**start, "loadavg_end": machine()["loadavg"]},
  }
  tables.print_ratios(rms_ln, vs_flax, fused_rows)
  if like:
    print("\n# like for like: per-round time ratios, median (q90) (< 1: faster than the baseline)")
    for r in like:
      print(f"  {r['op']:10s} {r['impl']:20s} / {r['baseline']:18s} {r['shape']:11s} {r['dtype']:9s} "
            f"{r['mode']:8s} {r['median']:.2f} ({r['q90']:.2f})")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench.json"), "w") as fh:
    json.dump(report, fh, indent=1)
  with open(os.path.join(args.out, "bench.md"), "w") as fh:
    fh.write(tables.markdown(report))
  print(f"\nwrote {os.path.join(args.out, 'bench.json')} and bench.md")
  return 0


if __name__ == "__main__":
  sys.exit(main())
