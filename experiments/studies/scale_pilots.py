"""Pilot runs of the ``scale`` study (issues 50 and 55), on seeds the report never uses (100-102).

They choose, before the study's rules are frozen and before its report runs, each layout's peak
learning rate per sequence length and the ladder's lengths. A pilot is one training run of the harness
with the study's recipe (6-layer width-64 LayerNorm models, AdamW(0.9, 0.98), inverse-square-root decay
on ``tau`` = 40 after a linear warm-up: none for Pre-LN, 40 steps for Post-LN, 512 tokens per step),
appended as one JSON line (spec, parameters, validation curve on 16,384 bytes, the second set of windows
at the ladder's candidate points, wall time) to ``--out``; a re-run skips what is there.

Command line::

    python -m experiments.studies.scale_pilots --stage ladder --out experiments/results/pilots/scale/ladder.jsonl
    python -m experiments.studies.scale_pilots --stage seq256 --out experiments/results/pilots/scale/seq.jsonl
    python -m experiments.studies.scale_pilots --stage seq128 --out experiments/results/pilots/scale/seq.jsonl
    python -m experiments.studies.scale_pilots --stage seq256-both --out experiments/results/pilots/scale/seq-both.jsonl
    python -m experiments.studies.scale_pilots --stage timing --out experiments/results/pilots/scale/timing.jsonl
    XLA_FLAGS=--xla_cpu_max_isa=AVX2 python -m experiments.studies.scale_pilots --stage timing --out ...
    python -m experiments.studies.scale_pilots --summarise --out experiments/results/pilots/scale/ladder.jsonl

Stages: ``ladder`` (sequence length 32, the ``cpu`` preset's model with ``max_len`` 64, 1,200 steps:
Pre-LN at four rates of the grid, Post-LN with warm-up at three; its third, 0.003125, failed in 2 of 3
seeds of the committed 200-step report but may train over a longer run), ``seq256`` and ``seq128`` (the
``cpu-scale`` model, ``max_len`` 256, at 2 x 256 and 4 x 128 tokens, 600 steps; Pre-LN at the top three of
those rates, :data:`SEQ_RATES`); ``timing`` (the layouts' steps side by side, for the cost model).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time

__all__ = ["PILOT_SEEDS", "STAGES", "main", "stage_runs"]

PILOT_SEEDS = (100, 101, 102)
WIDTH = {"d_model": 64, "n_heads": 4, "d_ff": 256}
N_LAYERS = 6
WARMUP_POST, TAU = 40, 40
EVAL_BYTES = 16_384
RATES = {"pre": (0.001756, 0.003125, 0.005558, 0.009875), "post": (0.0009875, 0.001756, 0.003125)}
# The sequence-length stages start from what the ladder stage showed (Pre-LN's best rate was its highest
# piloted one at every length there): Pre-LN's lowest rate is left out.
SEQ_RATES = {"pre": (0.003125, 0.005558, 0.009875), "post": (0.0009875, 0.001756)}
# stage -> (max_len, batch, seq_len, steps, candidate ladder points)
STAGES = {"ladder": (64, 16, 32, 1200, (200, 400, 600, 800, 1200)),
          "seq256": (256, 2, 256, 600, (200, 400, 600)),
          "seq128": (256, 4, 128, 600, (200, 400, 600)),
          "seq256-both": (256, 2, 256, 640, (200, 400, 600, 640))}
# Issue 63: the 2 x 256 arm tuned from both sides, as (position, lr, warm-up, tau), in the order they run (the
# most needed first, so that a stage cut by the time budget keeps the answers that matter most): Post-LN's rate
# bracketed from above at the study's schedule (warm-up 40, tau 40); the gpu preset's schedule (warm-up 100,
# tau 160) for Post-LN; Pre-LN's warm-up at that schedule (0 or 100) and at the study's (0 or 40); then the
# brackets from below (the schedule level's, and 0.0005558 at tau 40, where 0.0009875 was best at 200-400 steps)
# and the schedule level's from above. The 600-step ``seq256`` runs hold the same curves to step 600 (the
# schedule does not depend on the run's length, each batch only on (seed, step)), so they are the rates
# 0.0009875 and 0.001756 of Post-LN and Pre-LN without warm-up at tau 40.
BOTH_SIDES = (("post", 0.003125, 40, 40), ("post", 0.005558, 40, 40),
              ("post", 0.001756, 100, 160), ("post", 0.003125, 100, 160),
              ("pre", 0.005558, 0, 160), ("pre", 0.005558, 100, 160), ("pre", 0.005558, 40, 40),
              ("post", 0.0009875, 100, 160), ("post", 0.0005558, 40, 40), ("post", 0.005558, 100, 160))


def stage_runs(stage: str) -> list[dict]:
  """The run specs of ``stage``: every (position, rate, seed), rates innermost-but-one (one program per
  position and layout).

  Raises:
    ValueError: unknown stage.
  """
  if stage not in STAGES:
    raise ValueError(f"stage must be one of {sorted(STAGES)}, got {stage!r}.")
  max_len, batch, seq, steps, _ = STAGES[stage]
  if stage == "seq256-both":
    return [dict(stage=stage, position=pos, lr=lr, warmup=w, tau=tau, seed=s, batch=batch, seq_len=seq,
                 max_len=max_len, steps=steps) for pos, lr, w, tau in BOTH_SIDES for s in PILOT_SEEDS]
  return [dict(stage=stage, position=pos, lr=lr, seed=s, batch=batch, seq_len=seq, max_len=max_len, steps=steps)
          for pos in ("pre", "post") for lr in (RATES if stage == "ladder" else SEQ_RATES)[pos] for s in PILOT_SEEDS]


def schedule(spec: dict) -> tuple[int, int]:
  """``(warm-up, tau)`` of a pilot spec or record: its own where it names them (stage ``seq256-both``), else the
  first stages' (warm-up 40 for Post-LN, none for Pre-LN; tau 40)."""
  if "warmup" in spec:
    return int(spec["warmup"]), int(spec["tau"])
  return (WARMUP_POST if spec["position"] == "post" else 0), TAU


def run_one(spec: dict, corpus) -> dict:
  """Trains one pilot; returns its spec with the summary numbers."""
  from experiments.harness import train as train_lib
  from experiments.harness.train_config import TrainConfig
  from experiments.studies.dyt_recipe import param_count
  from experiments.suite.spikes import largest_rise
  from jaxnorm.models import TransformerConfig
  mc = TransformerConfig(**WIDTH, max_len=spec["max_len"], n_layers=N_LAYERS, norm_position=spec["position"])
  points = STAGES[spec["stage"]][4]
  tc = TrainConfig(model=mc, batch_size=spec["batch"], seq_len=spec["seq_len"], steps=spec["steps"], lr=spec["lr"],
                   warmup=schedule(spec)[0], decay_timescale=schedule(spec)[1], seed=spec["seed"],
                   eval_every=100, eval_batches=EVAL_BYTES // (spec["batch"] * spec["seq_len"]),
                   alt_eval_steps=points)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as d:
    s = train_lib.train(tc, d, progress=False, corpus=corpus)
  n_all = param_count(mc) + spec["max_len"] * WIDTH["d_model"]
  return {**spec, "params_all": n_all, "params_without_positions": param_count(mc),
          "unigram": train_lib.eval_unigram_nats(tc, corpus), "final_val_loss": s["final_val_loss"],
          "diverged_at": s["diverged_at"], "val_curve": s["val_curve"], "val_curve_alt": s["val_curve_alt"],
          "rise": largest_rise(s.get("train_curve")),
          "wall_s": time.perf_counter() - t0}


def timing(corpus, repeats: int = 5, steps: int = 30) -> dict:
  """Seconds per training step of the 6-layer ``max_len`` 256 model at 16 x 32, 4 x 128 and 2 x 256 tokens,
  interleaved (``repeats`` rounds of ``steps`` steps each after a compile round; medians), and each layout's
  step over the 16 x 32 one: the cost model's ``layout_factor`` (ratios measured side by side hold on a
  loaded machine; the absolute times do not)."""
  import statistics

  import jax

  from experiments.harness import data as data_lib
  from experiments.harness import train as train_lib
  from experiments.harness.train_config import TrainConfig, make_optimizer
  from jaxnorm.models import TransformerConfig
  layouts = ((16, 32), (4, 128), (2, 256))
  mc = TransformerConfig(**WIDTH, max_len=256, n_layers=N_LAYERS, norm_position="pre")
  setups = {}
  for b, t in layouts:
    tc = TrainConfig(model=mc, batch_size=b, seq_len=t, steps=100, lr=0.003, decay_timescale=TAU)
    step, _, _ = train_lib.compiled_steps(tc)
    _, params, _ = train_lib.init_params(mc, 0)
    batches = [data_lib.batch_at(corpus.train, i, batch_size=b, seq_len=t, seed=0) for i in range(steps)]
    setups[(b, t)] = [step, params, make_optimizer(tc).init(params), batches]
  times = {k: [] for k in layouts}
  for r in range(repeats + 1):
    for k, st in setups.items():
      t0 = time.perf_counter()
      for x, y in st[3]:
        st[1], st[2], m = st[0](st[1], st[2], x, y)
      jax.block_until_ready(m["loss"])
      if r:  # round 0 compiles
        times[k].append((time.perf_counter() - t0) / steps)
  med = {k: statistics.median(v) for k, v in times.items()}
  return {"stage": "timing", "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "step_s": {f"{b}x{t}": v for (b, t), v in med.items()},
          "factor": {f"{b}x{t}": v / med[(16, 32)] for (b, t), v in med.items()},
          "rounds": {f"{b}x{t}": v for (b, t), v in times.items()}}


def summarise(path: pathlib.Path) -> str:
  """Markdown tables of a pilots file: per stage, the seed-mean loss of each (position, rate) at the candidate
  ladder points (min-max over seeds), and Pre-LN minus Post-LN per seed at each position's best rate there."""
  import numpy as np
  recs = [r for r in (json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip())
          if r["stage"] in STAGES]
  out = []
  for stage in STAGES:
    rs = [r for r in recs if r["stage"] == stage]
    if not rs:
      continue
    points = STAGES[stage][4]
    val = {}
    for r in rs:
      c = dict((int(k), v) for k, v in r["val_curve"])
      val[(r["position"], r["lr"], r["seed"])] = c
    combos = sorted({(r["position"], r["lr"]) for r in rs})
    seeds = sorted({r["seed"] for r in rs})
    out += [f"### {stage} ({rs[0]['batch']} x {rs[0]['seq_len']}, max_len {rs[0]['max_len']}, "
            f"{rs[0]['params_all']:,} parameters, unigram plateau {rs[0]['unigram']:z.3f})", "",
            "| layout, rate | " + " | ".join(
                f"step {t} (T/P {t * rs[0]['batch'] * rs[0]['seq_len'] / rs[0]['params_all']:z.2f})" for t in points)
            + " |", "|---" * (len(points) + 1) + "|"]
    best = {}
    for pos, lr in combos:
      cells = []
      for t in points:
        v = [val[(pos, lr, s)].get(t, float("nan")) for s in seeds if (pos, lr, s) in val]
        cells.append(f"{np.mean(v):z.3f} [{min(v):z.3f}, {max(v):z.3f}] ({len(v)})")
        if len(v) == len(seeds) and (best.get((pos, t)) is None or np.mean(v) < best[(pos, t)][0]):
          best[(pos, t)] = (np.mean(v), lr)
      out.append(f"| {pos} {lr:g} | " + " | ".join(cells) + " |")
    out += ["", "Pre-LN minus Post-LN with warm-up, per seed, at each one's best piloted rate:", ""]
    for t in points:
      if ("pre", t) in best and ("post", t) in best:
        a, b = best[("pre", t)][1], best[("post", t)][1]
        d = [val[("pre", a, s)][t] - val[("post", b, s)][t] for s in seeds]
        out.append(f"- step {t}: Pre {a:g}, Post {b:g}: " + ", ".join(f"{x:+z.3f}" for x in d))
    out.append("")
  return "\n".join(out)


def summarise_both(paths) -> str:
  """Markdown tables of the 2 x 256 arm from both sides (issue 63): the records of ``paths`` (``seq.jsonl``'s
  600-step ``seq256`` runs and ``seq-both.jsonl``'s 640-step runs) grouped by (position, rate, warm-up, tau), the
  seed-mean loss at 200, 400, 600 and 640 steps (min-max over seeds), each seed's largest training-loss rise
  (spikes above 1 nat marked), then per schedule (tau) and ladder point each position's best rate and warm-up,
  Pre-LN minus Post-LN per seed there, and the same on the second windows."""
  import numpy as np
  from experiments.suite.spikes import SPIKE_NATS
  recs = [r for path in paths for r in (json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip())
          if r.get("seq_len") == 256 and r["stage"] in STAGES]
  points = (200, 400, 600, 640)
  cells: dict = {}
  for r in recs:
    w, tau = schedule(r)
    cells.setdefault((tau, r["position"], r["lr"], w), {})[r["seed"]] = r
  out = ["| tau | layout, rate, warm-up | " + " | ".join(f"step {t}" for t in points) + " | largest rise per seed |",
         "|---|---|" + "---|" * len(points) + "---|"]
  mean = {}
  for key in sorted(cells):
    tau, pos, lr, w = key
    by = cells[key]
    row = []
    for t in points:
      v = [dict((int(k), x) for k, x in by[s]["val_curve"]).get(t) for s in sorted(by)]
      v = [x for x in v if x is not None]
      if len(v) == len(PILOT_SEEDS):
        mean[(key, t)] = float(np.mean(v))
      row.append(f"{np.mean(v):z.3f} [{min(v):z.3f}, {max(v):z.3f}]" if v else "-")
    rises = ", ".join("-" if not by[s].get("rise") else
                      ("**" if by[s]["rise"]["rise"] > SPIKE_NATS else "") + f"+{by[s]['rise']['rise']:z.2f}"
                      f"@{by[s]['rise']['step']}" + ("**" if by[s]["rise"]["rise"] > SPIKE_NATS else "")
                      for s in sorted(by))
    out.append(f"| {tau} | {pos} {lr:g} w{w} | " + " | ".join(row) + f" | {rises} |")
  out += ["", "Best (lowest seed mean) per tau and point; Pre - Post per seed there (main / second windows):", ""]
  for tau in sorted({k[0] for k in cells}):
    for t in points:
      if any((k, t) not in mean for k in cells if k[0] == tau and len(cells[k]) == len(PILOT_SEEDS)):
        continue   # a point where a piloted (rate, warm-up) has no curve (the 600-step runs at 640) is not compared
      best = {}
      for pos in ("pre", "post"):
        c = [(mean[(k, t)], k) for k in cells if k[0] == tau and k[1] == pos and (k, t) in mean]
        if c:
          best[pos] = min(c)[1]
      if len(best) < 2:
        continue
      a, b = cells[best["pre"]], cells[best["post"]]
      def at(r, t, alt=False):
        return dict((int(k), x) for k, x in r["val_curve_alt" if alt else "val_curve"]).get(t)
      d = [at(a[s], t) - at(b[s], t) for s in PILOT_SEEDS]
      da = [x - y if None not in (x, y) else None for x, y in ((at(a[s], t, True), at(b[s], t, True))
                                                              for s in PILOT_SEEDS)]
      out.append(f"- tau {tau}, step {t}: Pre {best['pre'][2]:g} w{best['pre'][3]}, Post {best['post'][2]:g} "
                 f"w{best['post'][3]}: " + ", ".join(f"{x:+z.3f}" for x in d) + " / "
                 + ", ".join("-" if x is None else f"{x:+z.3f}" for x in da))
  return "\n".join(out)


def main(argv=None) -> int:
  """Runs a stage's pilots that ``--out`` does not hold yet; prints one line per run."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--stage", choices=sorted(STAGES) + ["timing"])
  p.add_argument("--out", required=True)
  p.add_argument("--summarise", action="store_true", help="print the tables of --out and exit")
  a = p.parse_args(argv)
  if a.summarise:
    print(summarise_both(a.out.split(",")) if a.stage == "seq256-both" else summarise(pathlib.Path(a.out)))
    return 0
  if a.stage is None:
    p.error("--stage is required unless --summarise")
  from experiments.harness import data as data_lib
  corpus = data_lib.load_corpus()
  out = pathlib.Path(a.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  if a.stage == "timing":
    rec = {**timing(corpus), "load": os.getloadavg()[0]}
    with open(out, "a") as f:
      f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec["factor"]), flush=True)
    return 0
  from experiments.studies.pilots import append_pending
  keys = ("stage", "position", "lr", "warmup", "tau", "seed") if a.stage == "seq256-both" else (
      "stage", "position", "lr", "seed")
  append_pending(out, stage_runs(a.stage), keys,
                 lambda spec: {**run_one(spec, corpus), "load": os.getloadavg()[0]},
                 lambda r: f"{r['stage']} {r['position']} lr={r['lr']} w/tau={schedule(r)} seed={r['seed']} "
                           f"val={r['final_val_loss']} "
                           f"diverged_at={r['diverged_at']} wall={r['wall_s']:z.0f}s load={r['load']:z.1f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
