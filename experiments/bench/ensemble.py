"""Seeds as one vmapped program against one program per seed: does batching runs pay on this machine?

``python -m experiments bench-ensemble [--preset cpu] [--seeds 1,3,6] [--out FILE.json]``

Issue 31 asked, before the flagship design was sized, whether training a layout's seeds as one
``jax.vmap``-ed program (one optimizer step for K models, each with its own parameters, optimizer
state and batch) is cheaper per run than K separate programs. This times the training step of the
preset's 6-layer model (its width, batch and sequence length; AdamW as the harness builds it) for
each K, the samples of every K interleaved in rounds (:func:`experiments.bench.timing.time_interleaved`),
and prints the median time per program step and per run-step, with the ratio to K = 1 (below 1:
batching helps). The JSON holds every sample and the machine's CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib

from experiments.argtypes import positive_int
from experiments.suite.provenance import device_info

__all__ = ["main", "measure"]


def measure(preset_name: str, ks: list[int], repeats: int = 9, sample_ms: float = 400.0) -> dict:
  """Times the vmapped training step for each ``K`` in ``ks``; returns the table as a dict."""
  import jax
  import jax.numpy as jnp
  import optax

  from experiments.harness import data as data_lib
  from experiments.harness import train as train_lib
  from experiments.harness.train_config import TrainConfig, make_optimizer
  from experiments.bench.timing import time_interleaved
  from experiments.suite import presets
  from jaxnorm.models import TransformerConfig

  preset = presets.get_preset(preset_name)
  tr = preset["train"]
  mc = TransformerConfig(**preset["model"], n_layers=6, norm_position="post")
  tc = TrainConfig(model=mc, batch_size=tr["batch_size"], seq_len=tr["seq_len"])
  tx = make_optimizer(tc)
  graphdef, _, _ = train_lib.init_params(mc, 0)
  corpus = data_lib.load_corpus()

  def step(params, opt_state, x, y):
    (loss, _), grads = jax.value_and_grad(functools.partial(train_lib.loss_and_stats, graphdef),
                                          has_aux=True)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  calls = {}
  for k in ks:
    ps = [train_lib.init_params(mc, s)[1] for s in range(k)]
    batches = [data_lib.batch_at(corpus.train, 0, batch_size=tc.batch_size, seq_len=tc.seq_len, seed=s)
               for s in range(k)]
    if k == 1:
      fn, args = jax.jit(step), (ps[0], tx.init(ps[0]), *map(jnp.asarray, batches[0]))
    else:
      stacked = jax.tree.map(lambda *a: jnp.stack(a), *ps)
      args = (stacked, jax.vmap(tx.init)(stacked), jnp.stack([b[0] for b in batches]),
              jnp.stack([b[1] for b in batches]))
      fn = jax.jit(jax.vmap(step))
    jax.block_until_ready(fn(*args))
    calls[f"K={k}"] = (fn, args)
  times = time_interleaved(calls, repeats=repeats, sample_ms=sample_ms)
  base = times["K=1"]["median_s"] if "K=1" in times else None
  rows = []
  for k in ks:
    t = times[f"K={k}"]
    rows.append({"k": k, "step_ms": 1e3 * t["median_s"], "per_run_ms": 1e3 * t["median_s"] / k,
                 "ratio_per_run": None if base is None else t["median_s"] / k / base,
                 "q_min_ms": 1e3 * t["min_s"], "q_max_ms": 1e3 * t["max_s"], "samples_s": t["times_s"]})
  return {"preset": preset_name, "model": preset["model"], "batch_size": tc.batch_size, "seq_len": tc.seq_len,
          "n_layers": 6, "cpu": device_info()["cpu"], "cores": os.cpu_count(),
          "backend": jax.default_backend(), "jax": jax.__version__, "rows": rows}


def main(argv: list[str] | None = None) -> int:
  """Command line: prints the table and writes the JSON."""
  ap = argparse.ArgumentParser(prog="python -m experiments bench-ensemble", description=__doc__.split("\n")[0])
  ap.add_argument("--preset", default="cpu", help="preset whose model and batch are timed (default cpu)")
  ap.add_argument("--seeds", default="1,3,6", help="comma-separated K values (models per program)")
  ap.add_argument("--repeats", type=positive_int, default=9, help="interleaved rounds (default 9)")
  ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/bench/ensemble.json"))
  args = ap.parse_args(argv)
  try:
    ks = [int(k) for k in args.seeds.split(",") if k.strip()]
  except ValueError:
    ap.error(f"--seeds must be comma-separated positive ints, got {args.seeds!r}")
  if not ks or min(ks) < 1:
    ap.error(f"--seeds must be comma-separated positive ints, got {args.seeds!r}")
  from experiments.suite import presets
  if args.preset not in presets.PRESETS:
    ap.error(f"--preset must be one of {sorted(presets.PRESETS)}, got {args.preset!r}")
  out = measure(args.preset, ks, repeats=args.repeats)
  print(f"{out['cpu']}, {out['backend']}, jax {out['jax']}; 6 layers, {out['batch_size']} x {out['seq_len']} tokens")
  print("| K (seeds per program) | ms per step | ms per run-step | per run vs K=1 |")
  print("|---|---|---|---|")
  for r in out["rows"]:
    ratio = "-" if r["ratio_per_run"] is None else f"{r['ratio_per_run']:.2f}"
    print(f"| {r['k']} | {r['step_ms']:.1f} | {r['per_run_ms']:.1f} | {ratio} |")
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps(out, indent=1) + "\n")
  print(f"wrote {args.out}")
  return 0
