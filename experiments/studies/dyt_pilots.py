"""Pilot runs of the ``dyt`` study (issue 36), on seeds the report never uses (100-102).

They choose the peak learning rate of each norm and check the tokens-per-parameter range before the
study's rules are frozen and before its report runs. A pilot is one training run of the harness with
the study's recipe (:mod:`experiments.studies.dyt_recipe`), appended as one JSON line (config, final
validation loss on both sets of validation windows, final loss on the training bytes, DyT/Derf
saturation, validation curve, wall time) to ``--out``; a re-run skips what is there.

Command line::

    python -m experiments.studies.dyt_pilots --stage lr --out experiments/results/pilots/dyt/lr.jsonl
    python -m experiments.studies.dyt_pilots --stage range --lrs layer_norm=0.003125,... --out .../range.jsonl
    python -m experiments.studies.dyt_pilots --stage timing --out .../timing.jsonl

Stages: ``lr`` (every norm at three rates, c / d with the suite's c = 0.0632, 0.2, 0.632, at the
largest T/P, seeds 100 and 101), ``range`` (every norm at its chosen rate at the three T/P, seed 102)
and ``timing`` (a 2-layer and a 6-layer LayerNorm step at 16 x 32 tokens, interleaved: the cost
model's 2-layer step).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from experiments.studies import dyt_recipe as recipe

__all__ = ["PILOT_SEEDS", "SIZES", "main", "stage_runs"]

PILOT_SEEDS = (100, 101, 102)
WIDTH = {"d_model": 64, "n_heads": 4, "d_ff": 256, "max_len": 64}
N_LAYERS = 2
STEPS = 240
BATCH, SEQ = 16, 32
SIZES = (0.0157, 0.157, 1.84)           # T/P: Verma's 1M / 10M / 118M tokens at 64M parameters
LRS = (0.0009875, 0.003125, 0.009875, 0.03125)  # c / 64, the suite's c = 0.0632, 0.2, 0.632 and 2.0


def stage_runs(stage: str, lrs: dict | None = None) -> list[dict]:
  """The run specs of ``stage`` (``lrs``: the chosen rate per norm, for ``range``).

  Raises:
    ValueError: unknown stage, or ``range`` without a rate for every norm.
  """
  if stage == "lr":
    return [dict(norm=n, lr=lr, tpp=SIZES[-1], seed=s) for s in PILOT_SEEDS[:2] for n in recipe.NORMS for lr in LRS]
  if stage == "range":
    if not lrs or set(lrs) != set(recipe.NORMS):
      raise ValueError(f"stage 'range' needs a rate for every norm {recipe.NORMS}, got {lrs!r}.")
    return [dict(norm=n, lr=lrs[n], tpp=t, seed=PILOT_SEEDS[2]) for t in SIZES for n in recipe.NORMS]
  raise ValueError(f"stage must be 'lr', 'range' or 'timing', got {stage!r}.")


def run_one(spec: dict, corpus) -> dict:
  """Trains one pilot; returns its spec with the summary numbers."""
  from experiments.harness import train as train_lib
  from experiments.harness.train_config import TrainConfig
  from jaxnorm.models import TransformerConfig
  mc = TransformerConfig(**WIDTH, **recipe.model_fields(spec["norm"], N_LAYERS))
  params = recipe.param_count(mc)
  unique = recipe.unique_bytes(spec["tpp"], params)
  tc = TrainConfig(model=mc, batch_size=BATCH, seq_len=SEQ, eval_every=40, eval_batches=4, log_every=10,
                   **recipe.train_fields(spec["lr"], STEPS, spec["seed"], unique))
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as d:
    s = train_lib.train(tc, d, progress=False, corpus=corpus)
  return {**spec, "n_layers": N_LAYERS, "steps": STEPS, "params": params, "unique_bytes": s["train_bytes"],
          "epochs": STEPS * BATCH * SEQ / s["train_bytes"], "final_val_loss": s["final_val_loss"],
          "final_val_loss_alt": s["final_val_loss_alt"], "final_train_loss": s["final_train_loss"],
          "final_saturation": s["final_saturation"], "diverged_at": s["diverged_at"], "val_curve": s["val_curve"],
          "wall_s": time.perf_counter() - t0}


def timing(corpus, repeats: int = 5, steps: int = 40) -> dict:
  """Seconds per step of a 2-layer and a 6-layer LayerNorm model at 16 x 32 tokens, interleaved
  (``repeats`` rounds of ``steps`` steps each; the medians)."""
  import statistics

  import jax

  from experiments.harness import data as data_lib
  from experiments.harness import train as train_lib
  from experiments.harness.train_config import TrainConfig, make_optimizer
  from jaxnorm.models import TransformerConfig
  setups = {}
  for depth in (2, 6):
    mc = TransformerConfig(**WIDTH, **recipe.model_fields("layer_norm", depth))
    tc = TrainConfig(model=mc, batch_size=BATCH, seq_len=SEQ, **recipe.train_fields(0.003, 100, 0, None))
    step, _, _ = train_lib.compiled_steps(tc)
    _, params, _ = train_lib.init_params(mc, 0)
    tx = make_optimizer(tc)
    setups[depth] = [step, params, tx.init(params)]
  batches = [data_lib.batch_at(corpus.train, i, batch_size=BATCH, seq_len=SEQ, seed=0) for i in range(steps)]
  times = {2: [], 6: []}
  for r in range(repeats + 1):
    for depth, st in setups.items():
      t0 = time.perf_counter()
      for x, y in batches:
        st[1], st[2], m = st[0](st[1], st[2], x, y)
      jax.block_until_ready(m["loss"])
      if r:  # round 0 compiles
        times[depth].append((time.perf_counter() - t0) / steps)
  med = {d: statistics.median(t) for d, t in times.items()}
  return {"stage": "timing", "step_s_2_layers": med[2], "step_s_6_layers": med[6], "ratio": med[2] / med[6],
          "rounds": {str(d): t for d, t in times.items()}, "batch": [BATCH, SEQ]}


def main(argv=None) -> int:
  """Runs a stage's pilots that ``--out`` does not hold yet; prints one line per run."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--stage", required=True, choices=("lr", "range", "timing"))
  p.add_argument("--out", required=True)
  p.add_argument("--lrs", default="", help="norm=lr,... (stage range)")
  a = p.parse_args(argv)
  from experiments.harness import data as data_lib
  corpus = data_lib.load_corpus()
  out = pathlib.Path(a.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  if a.stage == "timing":
    rec = {**timing(corpus), "load_before": _load()}
    with open(out, "a") as f:
      f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), flush=True)
    return 0
  lrs = dict((k, float(v)) for k, v in (kv.split("=") for kv in a.lrs.split(",") if kv)) if a.lrs else None
  done = set()
  if out.exists():
    done = {json.dumps({k: r[k] for k in ("norm", "lr", "tpp", "seed")}, sort_keys=True)
            for r in map(json.loads, out.read_text().splitlines())}
  for spec in stage_runs(a.stage, lrs):
    if json.dumps(spec, sort_keys=True) in done:
      continue
    rec = {**run_one(spec, corpus), "load": _load()}
    with open(out, "a") as f:
      f.write(json.dumps(rec) + "\n")
    print(f"{spec} val={rec['final_val_loss']} alt={rec['final_val_loss_alt']} train={rec['final_train_loss']} "
          f"sat={rec['final_saturation']} wall={rec['wall_s']:z.0f}s load={rec['load']}", flush=True)
  return 0


def _load() -> float | None:
  try:
    import os
    return os.getloadavg()[0]
  except OSError:
    return None


if __name__ == "__main__":
  raise SystemExit(main())
