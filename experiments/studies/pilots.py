"""Pilot runs that choose the flagship design (issue 31), on seeds the report never uses.

The flagship studies (:mod:`experiments.studies.warmup`, :mod:`experiments.studies.depth`) are
sized from these runs, never from the report's own seeds: every pilot seed is >= 100, every
report seed < 100. A pilot is one training run of the harness (the same step, optimizer,
schedule and corpus as the suite) whose summary is appended to a JSON-lines file, one line per
run (config, final validation loss, divergence, validation curve, plateau exit), so a killed
pilot keeps what it finished and a re-run skips what is there.

Command line::

    python -m experiments.studies.pilots --stage grid --out experiments/results/pilots/grid.jsonl

``--stage`` picks a list of runs (:data:`STAGES`); the chosen design and the numbers it rests
on are in ``experiments/results/pilots/README.md``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

__all__ = ["STAGES", "append_pending", "main", "pilot_runs"]

PILOT_SEEDS = (100, 101, 102)


def _grid(lrs, steps, warmup, seq_len, n_layers=6):
  return [dict(position=pos, lr=lr, warmup=w, n_layers=n_layers, steps=steps, seq_len=seq_len, seed=s)
          for lr in lrs for pos, w in (("post", 0), ("post", warmup), ("pre", 0)) for s in PILOT_SEEDS]


# Each stage: the runs of one pilot question.
STAGES = {
    # The grid at the candidate size: 6 layers, width 64, 16 x 32 tokens, 300 steps, warm-up 60 (1/5).
    "grid": _grid((0.0009875, 0.003125, 0.009875), 300, 60, 32),
    # Depth at the candidate size: 12 layers with the long warm-up, three layouts.
    "depth": [dict(position=pos, lr=lr, warmup=60, n_layers=12, steps=300, seq_len=32, seed=s)
              for lr in (0.0009875,) for pos in ("post", "pre", "deepnorm") for s in PILOT_SEEDS],
}


def pilot_runs(stage: str) -> list[dict]:
  """The run specs of ``stage`` (a key of :data:`STAGES`).

  Raises:
    ValueError: unknown stage.
  """
  if stage not in STAGES:
    raise ValueError(f"stage must be one of {sorted(STAGES)}, got {stage!r}.")
  return STAGES[stage]


def run_one(spec: dict, corpus) -> dict:
  """Trains one pilot; returns its spec with the summary numbers."""
  from experiments.harness import data as data_lib
  from experiments.harness import train as train_lib
  from experiments.harness.train_config import TrainConfig
  from experiments.studies.seeds import left_plateau_at
  from jaxnorm.models import TransformerConfig
  mc = TransformerConfig(d_model=64, n_heads=4, d_ff=256, max_len=64, n_layers=spec["n_layers"],
                         norm_position=spec["position"])
  tc = TrainConfig(model=mc, steps=spec["steps"], batch_size=16, seq_len=spec["seq_len"], lr=spec["lr"],
                   warmup=spec["warmup"], decay_timescale=40, eval_every=20, eval_batches=4,
                   seed=spec["seed"], log_attention=False, log_grad_norms=False, log_every=10)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as d:
    s = train_lib.train(tc, d, progress=False, corpus=corpus)
  unigram = data_lib.unigram_entropy_nats(corpus)
  return {**spec, "final_val_loss": s["final_val_loss"], "diverged_at": s["diverged_at"],
          "val_curve": s["val_curve"], "left_plateau": left_plateau_at(s, unigram), "unigram": unigram,
          "wall_s": time.perf_counter() - t0}


def append_pending(out: pathlib.Path, specs: list[dict], keys, run, line) -> None:
  """Runs each spec of ``specs`` that the JSON-lines file ``out`` does not hold yet (a spec is held when a
  record has its values at ``keys``), appends ``run(spec)``'s record to ``out`` and prints ``line(record)``:
  the resume loop every pilot script shares (a re-run skips what is there)."""
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  def key(r):
    return json.dumps([r[k] for k in keys])
  done = {key(json.loads(x)) for x in out.read_text().splitlines() if x.strip()} if out.exists() else set()
  for spec in specs:
    if key(spec) in done:
      continue
    rec = run(spec)
    with open(out, "a") as f:
      f.write(json.dumps(rec) + "\n")
    print(line(rec), flush=True)


def main(argv: list[str] | None = None) -> int:
  """Runs the pilots of one stage, skipping those already in the output file."""
  ap = argparse.ArgumentParser(prog="python -m experiments.studies.pilots", description=__doc__.split("\n")[0])
  ap.add_argument("--stage", required=True, choices=sorted(STAGES))
  ap.add_argument("--out", required=True, type=pathlib.Path, help="JSON-lines file (appended)")
  args = ap.parse_args(argv)
  from experiments.harness import data as data_lib
  corpus = data_lib.load_corpus()
  specs = pilot_runs(args.stage)
  append_pending(args.out, specs, sorted(specs[0]), lambda spec: run_one(spec, corpus),
                 lambda r: f"{ {k: r[k] for k in specs[0]} }: final {r['final_val_loss']} diverged_at "
                           f"{r['diverged_at']} left {r['left_plateau']} ({r['wall_s']:z.0f} s)")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
