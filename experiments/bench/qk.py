r"""Benchmark of the per-head (QK) norm: jaxnorm's layers against Flax's, interleaved.

The input is ``x: (tokens, heads, head_dim)``, normalized over ``head_dim`` with one learned
scale (and LayerNorm bias) per head and feature: Flax's spelling
``RMSNorm(heads * head_dim, feature_axes=(-2, -1), reduction_axes=-1)``, the parameter of shape
``(heads * head_dim,)``, in both libraries (:class:`jaxnorm.nnx.RMSNorm`/``LayerNorm`` and
``flax.nnx.RMSNorm``/``LayerNorm``). Timed: the forward ``y = N(x)`` and the forward plus the
backward ``(dx, dscale[, dbias]) = vjp(dy)``, each jitted, the two libraries' samples interleaved
(:func:`experiments.bench.timing.time_interleaved`) so that load from other processes falls on
both. The ratio is Flax's median time over jaxnorm's (above 1: jaxnorm is faster), with the median
of the per-round ratios beside it (the two samples of one round saw the same load).

Many short rows: ``tokens * heads`` rows of ``head_dim`` (64 to 256) elements, the shape Liger
reports packing several rows per kernel program for. jaxnorm's layers pass the per-head scale
into the op (its derived rules, the kernels on a GPU); on a CPU both sides are XLA programs.

Usage: ``python -m experiments bench-qk --out DIR [--tokens 256] [--heads 8,32,64]
[--head-dims 64,128,256]``; writes ``qk-<device>-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.argtypes import folder, positive_float, positive_int, positive_ints
from experiments.bench.timing import time_interleaved
import jaxnorm
from jaxnorm import nnx as jaxnorm_nnx

__all__ = ["bench_shape", "build_parser", "main", "norm_function"]

# The ops with a layer in both jaxnorm.nnx and flax.nnx: the norm family of jaxnorm.OPS.
KINDS = tuple(name for name, op in jaxnorm.OPS.items() if op.family == "norm")
IMPLS = ("jaxnorm", "flax")
MODES = ("fwd", "fwd+bwd")


def norm_function(impl: str, kind: str, heads: int, head_dim: int, dtype: str):
  """``(f, params)``: ``f(params, x)`` is the per-head norm layer of ``impl`` on ``x: (T, H, Dh)``."""
  mods = {"jaxnorm": jaxnorm_nnx, "flax": nnx}  # both name their layers as jaxnorm.OPS[kind].layer
  if impl not in mods:
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}.")
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
  cls = getattr(mods[impl], jaxnorm.OPS[kind].layer)
  layer = cls(heads * head_dim, feature_axes=(-2, -1), reduction_axes=-1, epsilon=1e-6,
              dtype=jnp.dtype(dtype), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  params = jax.tree.map(lambda p: p + 0.01 * jnp.arange(p.size, dtype=p.dtype).reshape(p.shape) / p.size,
                        nnx.to_pure_dict(state))

  def f(params, x):
    return nnx.merge(graphdef, params)(x)

  return f, params


def _modes(f):
  fwd = jax.jit(f)

  @jax.jit
  def fwd_bwd(params, x, dy):
    y, vjp = jax.vjp(f, params, x)
    return y, vjp(dy)

  return {"fwd": (fwd, 2), "fwd+bwd": (fwd_bwd, 3)}


def bench_shape(tokens: int, heads: int, head_dim: int, kind: str, dtype: str, *, repeats: int,
                sample_ms: float) -> list[dict]:
  """Times both libraries on one shape and norm kind, in both modes; one result per mode."""
  kx, kd = jax.random.split(jax.random.key(tokens * 7919 + heads * 31 + head_dim))
  x = jax.random.normal(kx, (tokens, heads, head_dim), jnp.float32).astype(dtype)
  dy = jax.random.normal(kd, x.shape, jnp.float32).astype(dtype)
  fns = {impl: norm_function(impl, kind, heads, head_dim, dtype) for impl in IMPLS}
  out = []
  for mode in MODES:
    calls = {}
    for impl, (f, params) in fns.items():
      fn, n = _modes(f)[mode]
      args = (params, x, dy)[:n]
      jax.block_until_ready(fn(*args))  # compile and warm up
      calls[impl] = (fn, args)
    t = time_interleaved(calls, repeats=repeats, sample_ms=sample_ms)
    paired = [b / a for a, b in zip(t["jaxnorm"]["times_s"], t["flax"]["times_s"])]
    out.append({"tokens": tokens, "heads": heads, "head_dim": head_dim, "kind": kind, "dtype": dtype,
                "mode": mode, "jaxnorm_us": 1e6 * t["jaxnorm"]["median_s"], "flax_us": 1e6 * t["flax"]["median_s"],
                "ratio_flax_over_jaxnorm": t["flax"]["median_s"] / t["jaxnorm"]["median_s"],
                "paired_ratio_median": statistics.median(paired),
                "paired_ratio_range": [min(paired), max(paired)], "samples": t["jaxnorm"]["samples"]})
  return out


def build_parser() -> argparse.ArgumentParser:
  """The ``python -m experiments bench-qk`` parser."""
  p = argparse.ArgumentParser(prog="python -m experiments bench-qk", description=__doc__.split("\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--tokens", type=positive_ints, default=(256,), help="token counts (rows = tokens * heads)")
  p.add_argument("--heads", type=positive_ints, default=(8, 32, 64))
  p.add_argument("--head-dims", type=positive_ints, default=(64, 128, 256))
  p.add_argument("--kinds", default=",".join(KINDS))
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  p.add_argument("--repeats", type=positive_int, default=15, help="interleaved rounds per timing")
  p.add_argument("--sample-ms", type=positive_float, default=20.0, help="length of one sample")
  p.add_argument("--out", type=folder, default=None,
                 help="folder for qk-<device>-<date>.json/.md (default: print only)")
  p.add_argument("--tag", default=None, help="device tag of the file names (default: backend and core count)")
  return p


def _markdown(report: dict) -> str:
  lines = [f"# Per-head (QK) norm: jaxnorm vs Flax ({report['device']}, {report['date']})", "",
           f"x: (tokens, heads, head_dim), {report['dtype']}, normalized over head_dim with a (heads * head_dim,) "
           "scale (Flax's feature_axes=(-2, -1), reduction_axes=-1). Median of "
           f"{report['repeats']} interleaved samples; ratio = Flax time / jaxnorm time (> 1: jaxnorm faster); "
           "paired = median of the per-round ratios. " + report["note"], "",
           "Summary, the median over shapes of the paired ratios (and their range):", ""]
  for kind in KINDS:
    for mode in MODES:
      v = [r["paired_ratio_median"] for r in report["results"] if r["kind"] == kind and r["mode"] == mode]
      if v:
        lines.append(f"- {kind} {mode}: {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) over {len(v)} shapes")
  lines += ["",
           "| kind | tokens | heads | head_dim | mode | jaxnorm us | Flax us | ratio | paired (range) |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in report["results"]:
    lo, hi = r["paired_ratio_range"]
    lines.append(f"| {r['kind']} | {r['tokens']} | {r['heads']} | {r['head_dim']} | {r['mode']} | "
                 f"{r['jaxnorm_us']:.1f} | {r['flax_us']:.1f} | {r['ratio_flax_over_jaxnorm']:.2f} | "
                 f"{r['paired_ratio_median']:.2f} ({lo:.2f}-{hi:.2f}) |")
  lines.append("")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """Entry point of ``python -m experiments bench-qk``; returns the exit status."""
  parser = build_parser()
  args = parser.parse_args(argv)
  kinds = tuple(args.kinds.split(","))
  bad = [k for k in kinds if k not in KINDS]
  if bad:
    parser.error(f"--kinds: {bad} not in {KINDS}")
  if args.repeats < 3 or args.sample_ms <= 0:
    parser.error(f"--repeats must be >= 3 and --sample-ms > 0, got {args.repeats} and {args.sample_ms}")
  results = []
  for kind in kinds:
    for head_dim in args.head_dims:
      for heads in args.heads:
        for tokens in args.tokens:
          rows = bench_shape(tokens, heads, head_dim, kind, args.dtype, repeats=args.repeats,
                             sample_ms=args.sample_ms)
          for r in rows:
            print(f"{kind:10s} T={tokens:5d} H={heads:3d} Dh={head_dim:4d} {r['mode']:8s} "
                  f"jaxnorm {r['jaxnorm_us']:9.1f} us  flax {r['flax_us']:9.1f} us  "
                  f"ratio {r['ratio_flax_over_jaxnorm']:.2f} (paired {r['paired_ratio_median']:.2f})", flush=True)
          results.extend(rows)
  dev = jax.devices()[0]
  tag = args.tag or f"{jax.default_backend()}-{os.cpu_count()}cores"
  date = datetime.date.today().isoformat()
  kind = getattr(dev, "device_kind", "")
  report = {"device": dev.platform if kind in ("", dev.platform) else f"{dev.platform} {kind}", "tag": tag,
            "date": date,
            "dtype": args.dtype, "repeats": args.repeats, "sample_ms": args.sample_ms,
            "versions": {"python": platform.python_version(), "jax": jax.__version__},
            "note": ("jaxnorm's layers pass the per-head scale into the op (derived VJP and JVP; the kernels on "
                     "a GPU, XLA here)."),
            "results": results}
  if args.out:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"qk-{tag}-{date}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(_markdown(report))
    print(f"wrote {stem}.json and {stem}.md")
  return 0
