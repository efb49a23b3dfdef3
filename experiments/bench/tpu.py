"""Measure the Pallas TPU kernels against the XLA path (issue 66, goal 4), ready to run on a TPU.

``python -m experiments.bench.tpu --out DIR`` on a TPU host times, side by side in one run
(interleaved rounds, :func:`experiments.bench.timing.time_interleaved`), each norm op of the
TPU backend (``impl="tpu"``, its kernels compiled by Mosaic) and the XLA path (``impl="xla"``)
at each shape and dtype, in three modes (``fwd``, ``bwd``: the VJP closure alone, ``fwd+bwd``),
checks the kernels' outputs against XLA's first, and writes ``tpu-bench.json`` (and a
markdown table) into ``DIR``: ``{"device", "versions", "date", "interpret", "config",
"results": [{"op", "impl", "mode", "rows", "d", "dtype", "status", "median_s", "min_s",
"max_s", "max_abs_err_vs_xla", "ratio_vs_xla"}, ...]}``. The ratio (kernels / XLA, per mode)
is what decides :data:`jaxnorm.backends.tpu.AUTO_ON_TPU` (``docs/tpu.md``). ``--block-rows
rule,64,256`` times several row blocks side by side in the same rounds (``impl`` "tpu" for the
backend's rule, "tpu-br<n>" for the others): the sweep that would replace the rule's guess.

Off a TPU, ``--interpret`` runs the kernels in TPU interpret mode (for checking the script;
its times are of the interpreter, meaningless for speed). The suite runs it that way at a
small shape (``tests/jaxnorm/test_tpu_kernels.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import jax
import jaxlib
import numpy as np

import jaxnorm
from experiments.bench.timing import make_inputs, prepare_entry, time_interleaved
from jaxnorm.backends import table
from jaxnorm.backends.tpu import TPU, TpuConfig

OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")
MODES = ("fwd", "bwd", "fwd+bwd")
# The shapes a TPU run should cover first: model widths (multiples of 128) and one that is not.
DEFAULT_SHAPES = ("8192x1024", "8192x4096", "16384x8192", "8192x1000")


def _shape(text: str) -> tuple[int, int]:
  rows, d = text.lower().split("x")
  return int(rows), int(d)


def _fn(op: str, impl: str, cfg):
  """The op as ``f(x, scale, bias)`` (plain) or ``f(x, residual, scale, bias) -> (y, h)``."""
  kw = dict(impl=impl) if impl == "xla" else dict(impl=impl, backend_config=cfg)
  fn = getattr(jaxnorm, op)
  centred = jaxnorm.OPS[op.removeprefix("add_")].params == ("scale", "bias")
  if op.startswith("add_"):
    if centred:
      return lambda x, r, s, b: fn(x, r, s, b, **kw)
    return lambda x, r, s, b: fn(x, r, s, **kw)
  if centred:
    return lambda x, s, b: fn(x, s, b, **kw)
  return lambda x, s, b: fn(x, s, **kw)


def _max_err(got, want) -> float:
  return max(float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32))))
             for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def _entry(op, rows, d, dtype, cfgs, repeats, sample_ms):
  """The rows of one (op, shape, dtype): XLA and each kernel config of ``cfgs`` (``{impl label:
  TpuConfig}``) in every mode, each kernel's outputs checked against XLA's first."""
  inp = make_inputs(rows, d, dtype)
  fused = op.startswith("add_")
  calls, errs = {}, {}
  for label, cfg in {"xla": None, **cfgs}.items():
    impl = "xla" if cfg is None else "tpu"
    prepared, _ = prepare_entry(_fn(op, impl, cfg), inp, modes=MODES, fused=fused)
    for mode, call in prepared.items():
      calls[(label, mode)] = call
  for label in cfgs:
    for mode in MODES:
      (fn_k, args_k), (fn_x, args_x) = calls[(label, mode)], calls[("xla", mode)]
      errs[(label, mode)] = _max_err(fn_k(*args_k), fn_x(*args_x))
  timed = time_interleaved({f"{i}|{m}": c for (i, m), c in calls.items()}, repeats=repeats,
                           sample_ms=sample_ms)
  out = []
  for (label, mode) in calls:
    t = timed[f"{label}|{mode}"]
    ratio = t["median_s"] / timed[f"xla|{mode}"]["median_s"]
    out.append(dict(op=op, impl=label, mode=mode, rows=rows, d=d, dtype=dtype, status="ok",
                    median_s=t["median_s"], min_s=t["min_s"], max_s=t["max_s"],
                    max_abs_err_vs_xla=errs.get((label, mode), 0.0), ratio_vs_xla=ratio))
  return out


def _configs(block_rows: str, pad: bool, interpret: bool) -> dict:
  """``{impl label: TpuConfig}``: "tpu" for the rule's block, "tpu-br<n>" for each other
  ``--block-rows`` value (a sweep, timed side by side in the same rounds)."""
  out = {}
  for value in block_rows.split(","):
    br = None if value in ("", "rule") else int(value)
    out["tpu" if br is None else f"tpu-br{br}"] = TpuConfig(
        interpret=interpret, block_rows=br, pad_features=pad)
  return out


def _markdown(results) -> str:
  lines = ["| op | rows x d | dtype | mode | kernels (ms) | XLA (ms) | kernels / XLA | max err |",
           "|---|---|---|---|---|---|---|---|"]
  by = {(r["op"], r["rows"], r["d"], r["dtype"], r["mode"], r["impl"]): r for r in results}
  for (op, rows, d, dtype, mode, impl), r in by.items():
    if impl == "xla":
      continue
    x = by[(op, rows, d, dtype, mode, "xla")]
    lines.append(f"| {op} | {rows}x{d} | {dtype} | {mode} ({impl}) | "
                 f"{r['median_s'] * 1e3:.3f} | "
                 f"{x['median_s'] * 1e3:.3f} | {r['ratio_vs_xla']:.2f} | "
                 f"{r['max_abs_err_vs_xla']:.2e} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  """Runs the measurement; returns the exit status (1 if an entry failed)."""
  p = argparse.ArgumentParser(prog="python -m experiments.bench.tpu", description=__doc__)
  p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated RxD")
  p.add_argument("--dtypes", default="bfloat16,float32")
  p.add_argument("--ops", default=",".join(OPS))
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--sample-ms", type=float, default=20.0)
  p.add_argument("--block-rows", default="rule",
                 help="comma-separated TpuConfig.block_rows values to time side by side "
                      "('rule': the backend's rule), e.g. rule,64,256,1024")
  p.add_argument("--pad-features", action="store_true", help="TpuConfig.pad_features")
  p.add_argument("--interpret", action="store_true", help="TPU interpret mode (off a TPU)")
  p.add_argument("--out", default=None, help="folder for tpu-bench.json and tpu-bench.md")
  args = p.parse_args(argv)
  if not args.interpret and jax.default_backend() != "tpu":
    print(f"no TPU here (backend {jax.default_backend()!r}); pass --interpret to check the "
          f"script in TPU interpret mode", file=sys.stderr)
    return 2
  if TPU.name not in table.BACKENDS:
    table.register_backend(TPU)
  cfgs = _configs(args.block_rows, args.pad_features, args.interpret)
  results, failed = [], 0
  for op in args.ops.split(","):
    for shape in args.shapes.split(","):
      rows, d = _shape(shape)
      for dtype in args.dtypes.split(","):
        try:
          results += _entry(op, rows, d, dtype, cfgs, args.repeats, args.sample_ms)
        except Exception as e:  # noqa: BLE001 (a failed entry is reported, the others run)
          failed += 1
          results.append(dict(op=op, impl="tpu", mode="all", rows=rows, d=d, dtype=dtype,
                              status="error", reason=f"{type(e).__name__}: {e}"))
  device = jax.devices()[0]
  report = {"device": f"{device.platform} {getattr(device, 'device_kind', '')}",
            "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "interpret": args.interpret,
            "config": {label: dict(block_rows=c.block_rows, pad_features=c.pad_features)
                       for label, c in cfgs.items()},
            "results": results}
  table_md = _markdown([r for r in results if r["status"] == "ok"])
  print(table_md)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tpu-bench.json"), "w") as f:
      json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "tpu-bench.md"), "w") as f:
      f.write(table_md + "\n")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
