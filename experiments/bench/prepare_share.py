"""How much of a norm call's trace is the per-call argument work of ``jaxnorm.ops.norm.args.prepare``.

Issue 62 asked that the checks, table look-ups and config objects that do not depend on traced values run
once per signature, not on every trace. This measures what that could save: the wall time of tracing
``jax.value_and_grad`` of one op call (``jax.make_jaxpr``, nothing compiled), and the time spent inside
``prepare`` during those traces (``prepare`` wrapped by a timer)::

  python -m experiments.bench.prepare_share --rounds 200

It prints one line per op: the trace's mean wall time over ``--rounds`` traces after 20 warm-up traces,
and ``prepare``'s mean and share. The figures of issue 62 are in ``docs/perf-notes.md``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import jaxnorm
from jaxnorm.ops.norm import args as norm_args

from experiments.argtypes import positive_int


def _trace_once(op, x, scale, bias) -> None:
  def loss(x, scale, bias):
    y = op(x, scale, bias) if bias is not None else op(x, scale)
    return jnp.sum(y ** 2)
  jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(x, scale, bias)


def measure(op_name: str, rounds: int, shape=(16, 32, 64)) -> dict:
  """``{"trace_ms", "prepare_ms", "share"}`` for ``op_name`` (``layer_norm`` or ``rms_norm``) on an input of
  ``shape`` (float32, a scale and for LayerNorm a bias), means over ``rounds`` traces."""
  op = {"layer_norm": jaxnorm.layer_norm, "rms_norm": jaxnorm.rms_norm}[op_name]
  x, scale = jnp.ones(shape), jnp.ones(shape[-1])
  bias = jnp.zeros(shape[-1]) if op_name == "layer_norm" else None
  for _ in range(20):
    _trace_once(op, x, scale, bias)
  t0 = time.perf_counter()
  for _ in range(rounds):
    _trace_once(op, x, scale, bias)
  trace_s = (time.perf_counter() - t0) / rounds
  spent = [0.0]
  original = norm_args.prepare

  def timed(*a, **k):
    t = time.perf_counter()
    try:
      return original(*a, **k)
    finally:
      spent[0] += time.perf_counter() - t

  norm_args.prepare = timed   # the ops call it through the module, so this replaces it for them
  try:
    for _ in range(rounds):
      _trace_once(op, x, scale, bias)
  finally:
    norm_args.prepare = original
  prepare_s = spent[0] / rounds
  return {"trace_ms": trace_s * 1e3, "prepare_ms": prepare_s * 1e3, "share": prepare_s / trace_s}


def main(argv: list[str] | None = None) -> int:
  """Command line (see the module docstring)."""
  ap = argparse.ArgumentParser(prog="python -m experiments.bench.prepare_share",
                               description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=positive_int, default=200, help="timed traces per op (default 200)")
  args = ap.parse_args(argv)
  for op_name in ("layer_norm", "rms_norm"):
    r = measure(op_name, args.rounds)
    print(f"{op_name}: trace of value_and_grad {r['trace_ms']:.2f} ms, prepare {r['prepare_ms']:.3f} ms "
          f"({r['share']:.1%})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
