r"""Measures launch configurations of jaxnorm's Pallas kernels on a GPU: ``python -m experiments tune``.

For each (op, shape, dtype) it times the forward kernel over a grid of ``block_rows`` x
``num_warps`` x ``num_stages`` and the backward kernels (dx kernel plus the parameter-gradient
reduction) over ``bwd_programs`` x ``num_warps`` x ``num_stages``, each candidate checked
against the default configuration's outputs (a candidate whose result differs by more than
rounding is reported as ``mismatch``, never as a time). Times are medians of many samples
(:func:`experiments.bench.timing.time_fn`), bandwidths count the bytes the op must move
(:func:`experiments.bench.timing.must_move_bytes`) and are compared with a copy (``x * 2``) of the same
array timed in the same run.

Both directions go through the public op with ``impl="pallas"`` and a
``jaxnorm.PallasConfig(block=...)``. The backward is timed as the jitted pullback of
``jax.vjp`` with the pullback (whose leaves are the residuals) passed as an argument, never
closed over, so XLA cannot fold anything.

Output: a table on stdout (best candidate per entry, next to the default) and ``tune.json``
under ``--out``; the chosen rules are written by hand into
``jaxnorm``'s block-size heuristic (``jaxnorm.default_block_config``) with the measurements that justify them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import sys

import jax
import numpy as np

from experiments.argtypes import folder, positive_float, positive_int, positive_ints
from experiments.bench import cli, timing
from experiments.bench.impls import OPS, param_dict
import jaxnorm

SHAPES = ((4096, 4096), (16384, 4096), (32768, 8192))


def _op(op: str, block, interpret: bool):
  """The public op on ``(x, scale, bias)`` with the Pallas kernels launched with ``block``."""
  pallas = jaxnorm.PallasConfig(interpret=interpret, block=block)
  fn = jaxnorm.OPS[op].fn
  return lambda x, s, b: fn(x, *param_dict(op, s, b).values(), epsilon=1e-6, impl="pallas",
                            pallas=pallas)


def _fwd(op: str, block, inp: timing.Inputs, interpret=False):
  """The jitted forward (the forward kernel alone) as a no-argument callable."""
  f = jax.jit(_op(op, block, interpret))
  return lambda: f(inp.x, inp.scale, inp.bias)


def _bwd(op: str, block, inp: timing.Inputs, interpret=False):
  """The jitted pullback (the backward kernels alone) as a no-argument callable.

  The pullback is a pytree whose leaves are the residuals (x, scale, the statistics); it is
  passed to the jitted function as an argument, never closed over, so XLA cannot fold the
  residuals as constants.
  """
  _, pull = jax.vjp(_op(op, block, interpret), inp.x, inp.scale, inp.bias)
  run = jax.jit(lambda pull, dy: pull(dy))
  return lambda: run(pull, inp.dy)


def _max_rel_diff(a, b) -> float:
  out = 0.0
  for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    u = np.asarray(u, np.float32)
    w = np.asarray(w, np.float32)
    scale = max(float(np.max(np.abs(w))), 1e-6)
    out = max(out, float(np.max(np.abs(u - w))) / scale)
  return out


def tune_entry(op: str, rows: int, d: int, dtype: str, *, repeats: int, sample_ms: float,
               fwd_grid, bwd_grid, interpret: bool = False) -> dict:
  """Times every candidate configuration of one (op, shape, dtype); see the module docstring.

  ``interpret=True`` runs the kernels in Pallas interpret mode (a check of this code on a CPU;
  its times mean nothing).
  """
  inp = timing.make_inputs(rows, d, dtype)
  base = jaxnorm.default_block_config(rows, d, dtype)
  tol = 1e-5 if dtype == "float32" else 1e-2
  ref_fwd = jax.block_until_ready(_fwd(op, base, inp, interpret)())
  ref_bwd = jax.block_until_ready(_bwd(op, base, inp, interpret)())
  out = {"op": op, "shape": f"{rows}x{d}", "dtype": dtype, "default": dataclasses.asdict(base),
         "copy": timing.copy_bandwidth(inp, repeats=repeats, sample_ms=sample_ms),
         "fwd": [], "bwd": []}
  p_size = inp.scale.dtype.itemsize
  x_size = inp.x.dtype.itemsize
  for direction, grid in (("fwd", fwd_grid), ("bwd", bwd_grid)):
    nbytes = timing.must_move_bytes(op, direction, rows, d, x_size, p_size)
    for cand in grid(base):
      block = dataclasses.replace(base, **cand)
      call = (_fwd(op, block, inp, interpret) if direction == "fwd"
              else _bwd(op, block, inp, interpret))
      row = {"config": cand, "default": block == base}
      try:
        got = jax.block_until_ready(call())
      except Exception as e:  # noqa: BLE001 - a config the compiler refuses is a result.
        row.update(status="error", reason=f"{type(e).__name__}: {str(e)[:200]}")
        out[direction].append(row)
        continue
      err = _max_rel_diff(got, ref_fwd if direction == "fwd" else ref_bwd)
      if not np.isfinite(err) or err > tol:
        row.update(status="mismatch", max_rel_diff=err)
        out[direction].append(row)
        continue
      t = timing.time_fn(lambda: call(), (), repeats=repeats, sample_ms=sample_ms)
      gbps = nbytes / t["median_s"] / 1e9
      row.update(status="ok", max_rel_diff=err, median_s=t["median_s"], gbps=gbps,
                 pct_copy=100 * gbps / out["copy"]["gbps"])
      out[direction].append(row)
  return out


def fwd_grid(cfg):
  """Forward candidates: rows per program x warps x pipelining stages (tiles <= 16384 elems)."""
  for br, nw, ns in itertools.product((1, 2, 4, 8), (4, 8, 16), (1, 2)):
    if br * cfg.block_d <= 16384 and br * cfg.block_d >= nw * 32:
      yield {"block_rows": br, "num_warps": nw, "num_stages": ns}


def bwd_grid_for(core_count: int, per_sm=(1, 2, 4, 8), bwd_rows=(None,)):
  """Backward candidates: programs per SM x rows per tile x warps x pipelining stages."""
  def grid(cfg):
    for k, br, nw, ns in itertools.product(per_sm, bwd_rows, (4, 8, 16), (1, 2)):
      if br is not None and br * cfg.block_d > 32768:
        continue
      cand = {"bwd_programs": k * core_count, "bwd_num_warps": nw, "bwd_num_stages": ns}
      if br is not None:
        cand["bwd_block_rows"] = br
      yield cand
  return grid


def main(argv: list[str] | None = None) -> int:
  """Runs the sweep; see ``python -m experiments tune --help``."""
  p = argparse.ArgumentParser(prog="python -m experiments tune", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", type=cli.parse_shapes, default=SHAPES)
  p.add_argument("--dtypes", type=cli.parse_dtypes, default=cli.DTYPES)
  p.add_argument("--ops", type=cli.parse_list(OPS, "--ops"), default=OPS)
  p.add_argument("--repeats", type=positive_int, default=20)
  p.add_argument("--sample-ms", type=positive_float, default=3.0)
  p.add_argument("--out", type=folder, default=os.path.join("results", "tune"))
  p.add_argument("--directions", type=cli.parse_list(("fwd", "bwd"), "--directions"),
                 default=("fwd", "bwd"))
  p.add_argument("--bwd-per-sm", type=positive_ints, default=(1, 2, 4, 8),
                 help="backward programs per SM to try (comma-separated)")
  p.add_argument("--bwd-rows", type=positive_ints, default=(None,),
                 help="rows per backward tile to try (comma-separated; default: the forward's)")
  args = p.parse_args(argv)
  device = jax.devices()[0]
  if not jaxnorm.pallas_compiles_on(device.platform):
    raise SystemExit(f"tune compiles the Triton kernels and needs a GPU; this device is "
                     f"{device.platform!r}")
  core_count = int(getattr(device, "core_count", 0) or 132)
  per_sm, bwd_rows = args.bwd_per_sm, args.bwd_rows  # tuples: parsed by their flags' type
  entries = []
  os.makedirs(args.out, exist_ok=True)
  report = {"device": getattr(device, "device_kind", str(device)), "core_count": core_count,
            "versions": cli.versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "entries": entries}
  for (rows, d), dtype, op in itertools.product(args.shapes, args.dtypes, args.ops):
    e = tune_entry(op, rows, d, dtype, repeats=args.repeats, sample_ms=args.sample_ms,
                   fwd_grid=fwd_grid if "fwd" in args.directions else lambda cfg: iter(()),
                   bwd_grid=(bwd_grid_for(core_count, per_sm, bwd_rows) if "bwd" in args.directions
                             else lambda cfg: iter(())))
    entries.append(e)
    with open(os.path.join(args.out, "tune.json"), "w") as fh:  # after every entry: a run cut
      json.dump(report, fh, indent=1)                             # short keeps what it measured
    for direction in ("fwd", "bwd"):
      ok = [r for r in e[direction] if r["status"] == "ok"]
      bad = [r for r in e[direction] if r["status"] != "ok"]
      default = next((r for r in ok if r["default"]), None)
      best = max(ok, key=lambda r: r["gbps"]) if ok else None
      fmt = lambda r: (f"{r['gbps']:7.0f} GB/s {r['pct_copy']:5.1f}% {r['config']}"  # noqa: E731
                       if r else "-")
      print(f"{op:10s} {e['shape']:11s} {dtype:9s} {direction}: copy {e['copy']['gbps']:.0f} GB/s"
            f" | default {fmt(default)} | best {fmt(best)} | not ok: {len(bad)}", flush=True)
      for r in bad[:3]:
        print(f"    {r['status']}: {r['config']} {r.get('reason', r.get('max_rel_diff'))}")
  print(f"wrote {os.path.join(args.out, 'tune.json')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
