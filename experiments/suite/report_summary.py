"""The report's summary block (:mod:`experiments.suite.report`): the verdict tally, every instability, the
summary lines, the measured evaluation noise and the limitations (scale, data, optimizer, seeds, timings).
Each function reads the studies' summaries and the suite state; none renders a study's own section.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.suite import claims as claims_lib
from experiments.suite import study
from experiments.suite import presets as presets_lib
from experiments.suite.registry import EXPERIMENTS
from experiments.suite.spikes import SPIKE_NATS

__all__ = ["VERDICT_TEXT", "design_lines", "instabilities", "limitations", "noise_estimate", "noise_lines",
           "run_lengths", "study_eval_bytes", "study_layouts", "summary_block", "tally", "tally_text"]

VERDICT_TEXT = {"yes": "yes", "no": "**no**", "partly": "partly", "n/a": "n/a", "obs": "(observation)",
                 claims_lib.NOT_TESTABLE: "not testable at this scale", "not run": "not run by this preset"}


def tally(rows: list[dict]) -> dict[str, dict[str, int]]:
  """Verdict counts per claim kind (``"training"``, ``"check"``) from :func:`claims_rows`."""
  out: dict[str, dict[str, int]] = {k: {} for k in claims_lib.KINDS}
  for r in rows:
    out[r["kind"]][r["holds"]] = out[r["kind"]].get(r["holds"], 0) + 1
  return out


def tally_text(counts: dict[str, int]) -> str:
  order = ["yes", "partly", "no", claims_lib.NOT_TESTABLE, "n/a", "obs", "not run"]
  return ", ".join(f"{VERDICT_TEXT.get(k, k).replace('**', '')}: {counts[k]}" for k in order if counts.get(k))


def instabilities(summaries: dict, runs_scan: list[dict] | None = None) -> list[str]:
  """Every instability of every training run, one line each.

  With ``runs_scan`` (:func:`experiments.suite.runs.scan_runs`, kept in ``suite.json``): every
  cached run of every study, with its divergence step and its training-loss spikes (a rise above
  ``SPIKE_NATS`` over its running minimum). Then, in the report's order, each study's own lines: the
  study protocol's optional ``instabilities(summary, scanned)`` (:mod:`experiments.suite.study`), told
  whether the scan was there (without it, older folders, a study lists the divergences and spikes its
  summary records).
  """
  lines = []
  for r in runs_scan or []:
    if r.get("diverged_at") is not None:
      lines.append(f"run `{r['label']}`: diverged (training loss above the harness's threshold or not finite) at "
                   f"step {r['diverged_at']}" + (f" of {r['steps']}" if r.get("steps") else ""))
    rise = r.get("rise")
    if rise is not None and rise["rise"] > SPIKE_NATS:
      lines.append(f"run `{r['label']}`: training loss spiked by {rise['rise']:z.2f} nats to {rise['peak']:z.2f} at "
                   f"step {rise['step']}")
  for name, hook in _hooks(summaries, "instabilities"):
    lines += hook(summaries[name], runs_scan is not None)
  return lines


def _hooks(summaries: dict, attr: str) -> list[tuple[str, Any]]:
  """``[(study, its attribute attr)]`` of the studies of ``summaries`` that define ``attr``, in the report's order."""
  found = [(name, getattr(study.load(EXPERIMENTS[name]), attr, None)) for name in EXPERIMENTS if name in summaries]
  return [(name, hook) for name, hook in found if hook is not None]


def _reason(ours: str) -> str:
  """The reason of a "not testable" text, without the measured numbers after it."""
  return ours.split(". Measured:")[0].replace("not testable at this scale: ", "")


def summary_block(state: dict, rows: list[dict], summaries: dict, fresh: dict | None = None) -> list[str]:
  """The report's opening: the tally per kind, the verdicts by name, what needs a larger preset, instabilities.
  ``fresh``: the fresh-seed confirmation's ``{"study/claim id": verdict}``; a named verdict it does not repeat
  carries the fresh seeds' verdict beside it."""
  t = tally(rows)
  other = {k.split("/", 1)[1]: v for k, v in (fresh or {}).items()}

  def named(r):
    there = other.get(r["id"])
    return r["statement"] + (f" (fresh seeds: {VERDICT_TEXT.get(there, there)})"
                             if there is not None and there != r["holds"] else "")
  out = ["## Summary", "",
         f"- **Claims about models and training** ({sum(t['training'].values())}): {tally_text(t['training'])}.",
         f"- **Implementation checks** ({sum(t['check'].values())}, checks of this code, not of the papers): "
         f"{tally_text(t['check'])}."]
  for verdict, title in (("yes", "Held"), ("partly", "Held in part"), ("no", "Did not hold")):
    names = [named(r) for r in rows if r["kind"] == "training" and r["holds"] == verdict]
    if names:
      out.append(f"- {title}: " + " / ".join(names))
  nt = [r for r in rows if r["holds"] == claims_lib.NOT_TESTABLE]
  if nt:
    out.append("- **Not testable at this scale**" + (" (a larger scale or an accelerator: `--preset gpu`, with "
                                                     "`--only NAME` for a study outside the flagship)"
                                                     if state.get("preset") != "gpu" else "")
               + ":")
    out += [f"  - {r['statement']} *Why:* {_reason(r['ours'])}" for r in nt]
  inst = instabilities(summaries, state.get("runs_scan"))
  out.append(f"- Instabilities (divergences, training-loss spikes above {SPIKE_NATS:g} nat, late plateau exits): "
             f"{len(inst)}, each listed in the appendix.")
  out += ["", "Verdicts are computed by the rules printed in the appendix; its section \"Rule changes\" lists every "
          "rule changed after its data had been seen.", ""]
  return out


def noise_estimate(eval_bytes: int) -> float:
  """The evaluation noise in nats of ``eval_bytes`` bytes, estimated from a per-byte loss s.d. of about 2 nats."""
  return 2 / max(eval_bytes, 1) ** 0.5


def study_layouts(pc: dict, name: str) -> list[tuple[int, int]]:
  """The ``(batch, seq_len)`` layouts the study ``name`` trains on: its preset entry's ``layouts`` where it
  names several (the scale study), else its own ``batch_size``/``seq_len``, else the preset's ``train``
  entry's (issue 63: the limitations state each study's own layout, not the preset's global one)."""
  tr, c = pc.get("train", {}), pc.get(name, {})
  if c.get("layouts"):
    return [(int(b), int(t)) for b, t in c["layouts"]]
  batch, seq = c.get("batch_size", tr.get("batch_size")), c.get("seq_len", tr.get("seq_len"))
  return [(int(batch), int(seq))] if batch and seq else []


def study_eval_bytes(pc: dict, name: str) -> int:
  """Bytes of validation windows per evaluation of the study ``name``: its preset entry's ``eval_bytes`` where
  it sets its own, else the preset's ``eval_batches`` batches of the study's first layout."""
  c = pc.get(name, {})
  if c.get("eval_bytes"):
    return int(c["eval_bytes"])
  lay = study_layouts(pc, name)
  return (pc.get("train", {}).get("eval_batches") or 0) * (lay[0][0] * lay[0][1] if lay else 0)


def _trains(pc: dict, name: str) -> bool:
  c = pc.get(name, {})
  return bool(c.get("steps", c.get("train_steps"))) and not getattr(study.load(EXPERIMENTS[name]), "TIMED_STEPS",
                                                                      False)


def noise_lines(pc: dict, summaries: dict) -> list[str]:
  """The limitation lines on evaluation noise, one per study that measured its own (its optional
  ``noise_line(summary, eval_bytes)``, given the study's own evaluation size), then one line for the studies
  that train without measuring it: an estimate at each one's evaluation size."""
  lines, unmeasured = [], []
  for name in EXPERIMENTS:
    if name not in summaries:
      continue
    hook = getattr(study.load(EXPERIMENTS[name]), "noise_line", None)
    line = hook(summaries[name], study_eval_bytes(pc, name)) if hook else None
    if line:
      lines.append(line)
    elif _trains(pc, name):
      unmeasured.append(name)
  by_size: dict[int, list[str]] = {}
  for name in unmeasured:
    by_size.setdefault(study_eval_bytes(pc, name), []).append(name)
  for size, names in by_size.items():
    lines.append(f"- Evaluation noise of {', '.join(names)} ({size:,} bytes per point): not measured twice; with a "
                 f"per-byte loss s.d. of about 2 nats, about {noise_estimate(size):z.2f} nat per evaluation (an "
                 "estimate).")
  return lines


def run_lengths(pc: dict, names: list[str]) -> str:
  """The training-run lengths of the studies ``names`` that train (``steps`` or ``train_steps`` in
  their preset entry, unless the study declares ``TIMED_STEPS``: steps timed, not a run's length), with their
  own layouts (:func:`study_layouts`) where they differ from the preset's, and tokens per run."""
  tr = pc.get("train", {})
  default = [(tr.get("batch_size"), tr.get("seq_len"))]
  parts = []
  for name in names:
    if not _trains(pc, name):
      continue
    c = pc.get(name, {})
    steps = c.get("steps", c.get("train_steps"))
    lay = study_layouts(pc, name)
    shape = "" if lay == default else " of " + " and ".join(f"{b} x {t}" for b, t in lay)
    tokens = f", {lay[0][0] * lay[0][1] * steps:,} tokens" if lay else ""
    parts.append(f"{name} {steps} steps{shape}{tokens}")
  return "; ".join(parts) if parts else "none"


def design_lines(state: dict, names: list[str]) -> list[str]:
  """One Limitations line naming where each study's sizes came from (pilots, a paper's recipe, or set by
  hand), for the studies ``names`` that the preset's ``design_sources`` covers (the preset as it is now, which
  may state the source of an older run's unchanged design; else as the run recorded it); none without any."""
  now = presets_lib.PRESETS.get(state.get("preset"), {}).get("design_sources")
  sources = now or (state.get("preset_config") or {}).get("design_sources") or {}
  parts = [f"{n}: {sources[n]}" for n in names if n in sources]
  return [f"- Design per study (where its sizes came from): {'; '.join(parts)}."] if parts else []


def _timings_line(state: dict) -> str:
  """The Limitations' line on timings, for the device the run recorded (a GPU run's report is not timed on a
  shared CPU; issue 63's third referee)."""
  if (state.get("device") or {}).get("backend") in ("gpu", "cuda", "rocm"):
    return "- Timings: taken on the GPU named in the provenance, not on a shared CPU."
  return ("- Timings: taken on the device in the provenance; on a shared CPU they carry several percent of noise and "
          "say nothing about GPUs, so the timing claims are not testable on a CPU.")


def limitations(state: dict, summaries: dict | None = None) -> list[str]:
  """What the scale of this preset cannot say, with its sizes (the training runs and seeds of the
  studies that ran, and the evaluation noise where a study measured it)."""
  summaries = summaries or {}
  pc = state.get("preset_config", {})
  m, tr = pc.get("model", {}), pc.get("train", {})
  wd = tr.get("weight_decay")
  if wd is None:
    from experiments.harness.train_config import TrainConfig
    wd = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == "weight_decay")
  wd_text = (f"decoupled weight decay {wd} on weight matrices and embeddings (not on norm scales or biases)"
             + (" (so AdamW is Adam)" if not wd else ""))
  corpus = (state.get("corpus") or {}).get("name", "?")
  ran = [n for n in EXPERIMENTS if n in summaries]
  seeds = "; ".join(f"{n} {summaries[n]['seeds']}" for n in ran if summaries[n].get("seeds") is not None)
  return ["## Limitations", "",
          f"- Scale: width {m.get('d_model')}, {m.get('n_heads')} heads, d_ff {m.get('d_ff')}; training runs "
          f"(batch {tr.get('batch_size')} x sequence {tr.get('seq_len')} bytes where no other is named): "
          f"{run_lengths(pc, ran)}. The papers train translation, BERT and "
          "language models for 10^4-10^6 steps; a claim that needs their regime is marked not testable here rather "
          "than judged.",
          f"- Data: a byte-level corpus ({corpus}), not IWSLT/WMT/BERT text; losses are nats per byte.",
          *noise_lines(pc, summaries),
          f"- Optimizer: AdamW(0.9, 0.98), {wd_text} (a study states its own recipe where it differs); DeepNet's "
          "constants and bound are derived for SGD-like updates, Xiong et al.'s theory for Xavier init with "
          "W^Q = W^K = 0.",
          f"- Seeds per study: {seeds or 'none recorded'}; spreads are min-max over them (half-range shown), not "
          "confidence intervals; failures are counted out of the seeds.",
          *design_lines(state, ran),
          _timings_line(state), ""]
