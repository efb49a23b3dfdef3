"""Trace, lowering and compile time of a model's training step, jaxnorm's layers against Flax's:
``python -m experiments.bench.trace [--rounds N] [--out DIR]``.

For each model (the cpu preset's, width 64 with 6 layers in a ``lax.scan``; and 24 layers
unrolled, without scan) and each norm implementation (``norm_impl="jaxnorm"``, ``"flax"``), the
step ``jax.jit(jax.value_and_grad(loss))`` is traced (``.trace``), lowered (``.lower``) and
compiled (``.compile``) afresh in every round (a new jitted function each time, so no cache of
JAX's is hit); the implementations alternate within a round, and
the first round (imports, caches) is dropped. Each phase is timed with the process's CPU clock
(``time.process_time``: all of the process's threads; less moved by other jobs on a shared
machine than elapsed time) and with the wall clock. The ratios jaxnorm / Flax are of the
medians over rounds.

Writes ``trace.json`` (machine, versions, every sample) and ``trace.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from experiments.argtypes import positive_int
from experiments.bench.cli import machine, versions
from jaxnorm.models import TransformerConfig, TransformerLM

MODELS = {
    # experiments/suite/presets.toml, [cpu]: model and [cpu.scale]: n_layers.
    "cpu-preset (6 layers, scan)": dict(d_model=64, n_heads=4, d_ff=256, max_len=64, n_layers=6,
                                        scan_layers=True),
    "24 layers, no scan": dict(d_model=64, n_heads=4, d_ff=256, max_len=64, n_layers=24,
                               scan_layers=False),
}
IMPLS = ("jaxnorm", "flax")
PHASES = ("trace", "lower", "compile")


def _step(fields: dict, impl: str):
  graph, params = nnx.split(TransformerLM(TransformerConfig(norm_impl=impl, **fields),
                                          rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((16, 33), jnp.int32)

  def loss(params, tokens):
    logits = nnx.merge(graph, params)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  return jax.value_and_grad(loss), params, tokens


def _one(fn, params, tokens) -> dict:
  out = {}
  # A new function object each time: jit caches a trace (and its lowering and executable) per
  # function, so the same object would time cache hits.
  f = jax.jit(lambda params, tokens: fn(params, tokens))
  c0, w0 = time.process_time(), time.perf_counter()
  traced = f.trace(params, tokens)
  c1, w1 = time.process_time(), time.perf_counter()
  lowered = traced.lower()
  c2, w2 = time.process_time(), time.perf_counter()
  lowered.compile()
  c3, w3 = time.process_time(), time.perf_counter()
  for name, (c, w) in zip(PHASES, ((c1 - c0, w1 - w0), (c2 - c1, w2 - w1), (c3 - c2, w3 - w2))):
    out[name] = {"cpu_s": c, "wall_s": w}
  return out


def run(rounds: int) -> dict:
  """``{model: {impl: [per-round {phase: {cpu_s, wall_s}}]}}`` (round 0 dropped)."""
  samples = {}
  for model, fields in MODELS.items():
    steps = {impl: _step(fields, impl) for impl in IMPLS}
    per = {impl: [] for impl in IMPLS}
    for r in range(rounds + 1):
      for impl in IMPLS:
        s = _one(*steps[impl])
        if r:
          per[impl].append(s)
    samples[model] = per
  return samples


def summary(samples: dict) -> dict:
  """``{model: {phase or "trace+lower": {clock: {"jaxnorm_ms", "flax_ms", "ratio"}}}}``."""
  out = {}
  for model, per in samples.items():
    rows = {}
    for phase in PHASES + ("trace+lower",):
      rows[phase] = {}
      for clock in ("cpu_s", "wall_s"):
        def med(impl):
          if phase == "trace+lower":
            return statistics.median(s["trace"][clock] + s["lower"][clock] for s in per[impl])
          return statistics.median(s[phase][clock] for s in per[impl])
        a, b = med("jaxnorm"), med("flax")
        rows[phase][clock] = {"jaxnorm_ms": 1e3 * a, "flax_ms": 1e3 * b, "ratio": a / b}
    out[model] = rows
  return out


def markdown(report: dict) -> str:
  lines = [f"# Trace, lowering and compile time: jaxnorm against Flax ({report['date']})", "",
           f"Machine: {report['machine']}. Versions: {report['versions']}. "
           f"{report['rounds']} interleaved rounds (the first dropped); medians; ratio = "
           "jaxnorm / Flax. CPU clock: the process's CPU time (all threads).", ""]
  for model, rows in report["summary"].items():
    lines += [f"## {model}", "", "| phase | jaxnorm (CPU ms) | Flax (CPU ms) | ratio (CPU) | "
              "ratio (wall) |", "|---|---|---|---|---|"]
    for phase, clocks in rows.items():
      c, w = clocks["cpu_s"], clocks["wall_s"]
      lines.append(f"| {phase} | {c['jaxnorm_ms']:.1f} | {c['flax_ms']:.1f} | {c['ratio']:.2f} | "
                   f"{w['ratio']:.2f} |")
    lines.append("")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m experiments.bench.trace", description=__doc__)
  p.add_argument("--rounds", type=positive_int, default=7, help="timed rounds (default 7)")
  p.add_argument("--out", default=os.path.join("results", "bench-trace"),
                 help="output folder (default results/bench-trace)")
  args = p.parse_args(argv)
  samples = run(args.rounds)
  report = {"date": datetime.date.today().isoformat(), "machine": machine(),
            "versions": versions(), "rounds": args.rounds, "summary": summary(samples),
            "samples": samples}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "trace.json"), "w") as f:
    json.dump(report, f, indent=1)
  text = markdown(report)
  with open(os.path.join(args.out, "trace.md"), "w") as f:
    f.write(text + "\n")
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
