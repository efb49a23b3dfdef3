"""Spikes behind the scale study's numbers: which of a seed's compared runs spiked, read from a report's run scan
(issue 63's referees). Split from :mod:`experiments.studies.scale_answer`, which prints them."""

from __future__ import annotations

import numpy as np

__all__ = ["extreme_spikes", "lone_spike", "rise_of", "scan_of", "seed_spikes"]


def extreme_spikes(summary: dict, seq: str) -> str:
  """Where a seed at either end of the longest point's per-seed range had a run (of the two compared there) whose
  training loss spiked by more than ``SPIKE_NATS`` (the run scan the report attaches), which one, by how much and
  where (issue 63's referee: the range's low end at sequence 256 was a seed whose Post-LN run spiked); else empty."""
  scan = (summary.get("provenance") or {}).get("runs_scan") or []
  last = summary["tables"][seq][-1]
  seeds, d = summary.get("seeds") or [], last["diff"]
  if not scan or len(seeds) != len(d) or len(d) < 2:
    return ""
  words = []
  for i in sorted({int(np.argmin(d)), int(np.argmax(d))}):
    runs = seed_spikes(summary, seq, seeds[i], scan)
    if runs:
      words.append(f"seed {seeds[i]} ({d[i]:+z.2f}) spiked: " + ", ".join(runs))
  return " (" + "; ".join(words) + ")" if words else ""


def rise_of(summary: dict, seq: str, seed: int, pos: str, scan: list[dict]) -> dict | None:
  """The largest training-loss rise (``{"rise", "step", ...}``) of ``pos``'s run of ``seed`` compared at the longest
  point of sequence ``seq``, from the run scan ``scan``; None where the scan has no single such run."""
  last = summary["tables"][seq][-1]
  hits = [r for r in scan if r["label"].startswith(f"scale-{pos}-") and f"x{seq}-" in r["label"]
          and f"-lr{last['lr'][pos]:g}-" in r["label"] and r["label"].endswith(f"-s{seed}")]
  return hits[0].get("rise") if len(hits) == 1 else None


def seed_spikes(summary: dict, seq: str, seed: int, scan: list[dict]) -> list[str]:
  """``["Post-LN by 4.14 at step 81", ...]``: the runs of ``seed`` compared at the longest point of sequence
  ``seq`` whose training loss spiked by more than ``SPIKE_NATS``, from the run scan ``scan``."""
  from experiments.suite.spikes import SPIKE_NATS
  out = []
  for pos, name in (("post", "Post-LN"), ("pre", "Pre-LN")):
    rise = rise_of(summary, seq, seed, pos, scan)
    if rise and rise["rise"] > SPIKE_NATS:
      out.append(f"{name} by {rise['rise']:z.2f} at step {rise['step']}")
  return out


def lone_spike(base: dict, base_scan: list, other: dict, other_scan: list, seq: str, seed: int) -> str:
  """Which of ``seed``'s runs in ``base`` spiked by at least 1 nat more than the same layout's run in ``other``
  (the same seed and batches at another schedule), with both runs' final losses at the longest point: the spike
  that sets a shift apart from the spikes both schedules share (issue 63's fourth referee: every sequence-256 run
  rises 1.5-2.5 nats at batches both layouts share); empty where none does."""
  seeds = other["config"]["seeds"]
  i = seeds.index(seed)
  out = []
  for pos, name in (("post", "Post-LN"), ("pre", "Pre-LN")):
    a, b = rise_of(base, seq, seed, pos, base_scan), rise_of(other, seq, seed, pos, other_scan)
    if a and b and a["rise"] - b["rise"] >= 1.0:
      fa, fb = base["tables"][seq][-1]["values"][pos][i], other["tables"][seq][-1]["values"][pos][i]
      tb, to = (f"tau {(x.get('config') or {}).get('decay_timescale')}" for x in (base, other))
      out.append(f"{name} spiked by {a['rise']:z.2f} at step {a['step']} at {tb} ({b['rise']:z.2f} at {to}; "
                 f"final {fa:z.3f} at {tb}, {fb:z.3f} at {to})")
  return "; ".join(out)


def scan_of(root) -> list[dict]:
  """The run scan a committed results folder recorded (its ``suite.json``), or empty."""
  from experiments.suite.registry import read_json
  return (read_json(root / "suite.json").get("runs_scan") or []) if (root / "suite.json").exists() else []
