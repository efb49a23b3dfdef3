"""The TPU kernels' wide battery (issue 66, goal 2): feature widths up to 8192, checked against
the float64 oracle, in TPU interpret mode on any host (or compiled, on a TPU).

``python -m experiments.bench.tpu_battery [--out FILE]`` runs, for each width of ``--widths``
(multiples of 128 and not), each dtype (float32, bfloat16) and each op (LayerNorm, RMSNorm,
their residual add + norm, gated RMSNorm in four groups, gate first), the kernels' value and
every cotangent (random cotangents, one ``jax.vjp`` under ``jax.jit``) on ``--rows`` rows in
blocks of ``--block-rows`` (37 in blocks of 16: the last block ragged), once with a full-width
block and once with ``pad_features`` where the width is not a multiple of 128, and compares
them with:

* the plain ops and gated RMSNorm: ``jax.vjp`` of :mod:`jaxnorm.reference` in float64;
* the residual add + norm: the XLA path (``impl="xla"``), whose add rounds ``h`` the same way.

The error of each result is ``max|got - want| / max(max|want|, 1)``, against the tolerance of
the dtype (2e-5 for float32, 2e-2 for bfloat16; the statistics in float32 either way). Prints
one line per entry and a summary, writes JSON with ``--out``; exit status 1 if an entry is over
its tolerance or fails. Not part of the suite (a few minutes of CPU); its last result is in
``docs/tpu.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from jaxnorm import reference
from jaxnorm.backends import table
from jaxnorm.backends.tpu import TPU, TpuConfig

WIDTHS = (128, 300, 1000, 1024, 2048, 3000, 4096, 5000, 8192)
TOL = {"float32": 2e-5, "bfloat16": 2e-2}
OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "gated_rms_norm")


def _data(rows, d, dtype, seed):
  k = jax.random.split(jax.random.key(seed), 6)
  x = (3.0 + 2.0 * jax.random.normal(k[0], (rows, d))).astype(dtype)
  r = jax.random.normal(k[1], (rows, d)).astype(dtype)
  s = (1.0 + 0.5 * jax.random.normal(k[2], (d,))).astype(dtype)
  b = (0.5 * jax.random.normal(k[3], (d,))).astype(dtype)
  dy = jax.random.normal(k[4], (rows, d)).astype(dtype)
  dh = jax.random.normal(k[5], (rows, d)).astype(dtype)
  return x, r, s, b, dy, dh


def _vjp_all(f, args, cts):
  @jax.jit
  def run(*a):
    out, vjp = jax.vjp(f, *a)
    return out, vjp(cts)
  return jax.tree.leaves(run(*args))


def _oracle(op, x, s, b, dy):
  """The float64 oracle's ``y`` and cotangents of the plain op."""
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(a, np.float64)) for a in (x, s, b, dy)]
    if op == "layer_norm":
      f = lambda x, s, b: reference.layer_norm(x, s, b, epsilon=1e-5)  # noqa: E731
      return [np.asarray(a) for a in _vjp_all(f, f64[:3], f64[3])]
    f = lambda x, s: reference.rms_norm(x, s, epsilon=1e-5)  # noqa: E731
    return [np.asarray(a) for a in _vjp_all(f, f64[:2], f64[3])]


def _entry(op, rows, d, dtype, cfg):
  x, r, s, b, dy, dh = _data(rows, d, jnp.dtype(dtype), seed=d)
  kw = dict(impl="tpu", backend_config=cfg, epsilon=1e-5)
  fn = getattr(jaxnorm, op)
  centred = op.endswith("layer_norm")
  if op == "gated_rms_norm":  # four groups where d allows, gate first (u = x silu(z))
    gkw = dict(group_size=d // 4 if d % 4 == 0 else d, norm_before_gate=False, epsilon=1e-5)
    got = _vjp_all(lambda x, z, s: fn(x, z, s, impl="tpu", backend_config=cfg, **gkw),
                   (x, r, s), dy)
    with jax.enable_x64(True):
      f64 = [jnp.asarray(np.asarray(a, np.float64)) for a in (x, r, s, dy)]
      want = _vjp_all(lambda x, z, s: reference.gated_rms_norm(x, z, s, **gkw), f64[:3], f64[3])
  elif op.startswith("add_"):
    params = (s, b) if centred else (s,)
    got = _vjp_all(lambda x, r, *p: fn(x, r, *p, **kw), (x, r, *params), (dy, dh))
    want = _vjp_all(lambda x, r, *p: fn(x, r, *p, impl="xla", epsilon=1e-5), (x, r, *params),
                    (dy, dh))
  else:
    params = (s, b) if centred else (s,)
    got = _vjp_all(lambda x, *p: fn(x, *p, **kw), (x, *params), dy)
    want = _oracle(op, x, s, b, dy)
  errs = []
  for g, w in zip(got, want):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    errs.append(float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1.0)))
  return max(errs)


def main(argv=None) -> int:
  """Runs the battery; returns 0 when every entry is within its tolerance."""
  p = argparse.ArgumentParser(prog="python -m experiments.bench.tpu_battery", description=__doc__)
  p.add_argument("--widths", default=",".join(map(str, WIDTHS)))
  p.add_argument("--rows", type=int, default=37)
  p.add_argument("--block-rows", type=int, default=16,
                 help="TpuConfig.block_rows (16: 37 rows are three blocks, the last ragged)")
  p.add_argument("--dtypes", default="float32,bfloat16")
  p.add_argument("--ops", default=",".join(OPS))
  p.add_argument("--compiled", action="store_true", help="compiled kernels (on a TPU)")
  p.add_argument("--out", default=None, help="JSON file for the results")
  args = p.parse_args(argv)
  if TPU.name not in table.BACKENDS:
    table.register_backend(TPU)
  results, bad, start = [], 0, time.time()
  for d in map(int, args.widths.split(",")):
    pads = (False, True) if d % 128 else (False,)
    for pad in pads:
      cfg = TpuConfig(interpret=not args.compiled, pad_features=pad, block_rows=args.block_rows)
      for dtype in args.dtypes.split(","):
        for op in args.ops.split(","):
          try:
            err = _entry(op, args.rows, d, dtype, cfg)
            ok = err <= TOL[dtype]
            row = dict(op=op, d=d, rows=args.rows, dtype=dtype, pad_features=pad,
                       max_rel_err=err, tol=TOL[dtype], ok=ok)
          except Exception as e:  # noqa: BLE001 (reported; the others run)
            ok, row = False, dict(op=op, d=d, rows=args.rows, dtype=dtype, pad_features=pad,
                                  ok=False, error=f"{type(e).__name__}: {e}")
          bad += not ok
          results.append(row)
          print(json.dumps(row), flush=True)
  summary = dict(entries=len(results), failed=bad, seconds=round(time.time() - start, 1),
                 jax=jax.__version__, backend=jax.default_backend(), interpret=not args.compiled,
                 date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
  print(json.dumps(summary))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(summary=summary, results=results), f, indent=1)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
