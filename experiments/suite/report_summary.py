"""The report's summary block (:mod:`experiments.suite.report`): the verdict tally, every instability, the
summary lines, the measured evaluation noise and the limitations (scale, data, optimizer, seeds, timings).
Each function reads the studies' summaries and the suite state; none renders a study's own section.
"""

from __future__ import annotations

import dataclasses

from experiments.suite import claims as claims_lib
from experiments.suite.registry import EXPERIMENTS
from experiments.suite.spikes import SPIKE_NATS

__all__ = ["instabilities", "tally"]

_VERDICT_TEXT = {"yes": "yes", "no": "**no**", "partly": "partly", "n/a": "n/a", "obs": "(observation)",
                 claims_lib.NOT_TESTABLE: "not testable at this scale", "not run": "not run by this preset"}


def tally(rows: list[dict]) -> dict[str, dict[str, int]]:
  """Verdict counts per claim kind (``"training"``, ``"check"``) from :func:`claims_rows`."""
  out: dict[str, dict[str, int]] = {k: {} for k in claims_lib.KINDS}
  for r in rows:
    out[r["kind"]][r["holds"]] = out[r["kind"]].get(r["holds"], 0) + 1
  return out


def _tally_text(counts: dict[str, int]) -> str:
  order = ["yes", "partly", "no", claims_lib.NOT_TESTABLE, "n/a", "obs", "not run"]
  return ", ".join(f"{_VERDICT_TEXT.get(k, k).replace('**', '')}: {counts[k]}" for k in order if counts.get(k))


def instabilities(summaries: dict, runs_scan: list[dict] | None = None) -> list[str]:
  """Every instability of every training run, one line each.

  With ``runs_scan`` (:func:`experiments.suite.runs.scan_runs`, kept in ``suite.json``): every
  cached run of every study, with its divergence step and its training-loss spikes (a rise above
  ``SPIKE_NATS`` over its running minimum); without it (older folders) the spikes of the warm-up
  grid and the depth study and the divergences of the QK-norm sweep. Then every late plateau exit
  (after 2/3 of the run) of the warm-up grid and the depth study.
  """
  lines = []
  if runs_scan is not None:
    for r in runs_scan:
      if r.get("diverged_at") is not None:
        lines.append(f"run `{r['label']}`: diverged (training loss above the harness's threshold or not finite) at "
                     f"step {r['diverged_at']}" + (f" of {r['steps']}" if r.get("steps") else ""))
      rise = r.get("rise")
      if rise is not None and rise["rise"] > SPIKE_NATS:
        lines.append(f"run `{r['label']}`: training loss spiked by {rise['rise']:z.2f} nats to {rise['peak']:z.2f} at "
                     f"step {rise['step']}")
  else:
    for r in summaries.get("qk_norm", {}).get("diverged", []):
      layout = f"{'Pre' if r['position'] == 'pre' else 'Post'}-LN {'+ QK-norm' if r['qk_norm'] else 'no QK-norm'}"
      lines.append(f"QK-norm sweep `{layout}, lr {r['lr']:g}` seed {r['seed']}: diverged (training loss above the "
                   f"harness's threshold) at step {r['step']}; it counts as the initial loss in the LR sensitivity")
  srcs = []
  if "warmup" in summaries:
    w = summaries["warmup"]
    srcs += [("warm-up grid", "warmup", k, p, w["config"]["steps"]) for src in ("grid", "extra_points")
             for k, p in w.get(src, {}).items()]
  if "depth" in summaries:
    d = summaries["depth"]
    srcs += [("depth", "depth", k, p, d["config"]["steps"]) for k, p in d.get("points", {}).items()]
  for where, name, key, p, steps in srcs:
    seeds = summaries[name].get("seeds", [])
    if runs_scan is None:
      for i, r in enumerate(p.get("rise") or []):
        if r is not None and r["rise"] > SPIKE_NATS:
          lines.append(f"{where} `{key}` seed {seeds[i] if i < len(seeds) else i}: training loss spiked by "
                       f"{r['rise']:z.2f} nats to {r['peak']:z.2f} at step {r['step']}, final val loss "
                       f"{p['values'][i]:z.3f}")
    for i, s in enumerate(p.get("left_plateau") or []):
      if s is not None and s > 2 * steps / 3:
        lines.append(f"{where} `{key}` seed {seeds[i] if i < len(seeds) else i}: left the plateau late, at step {s} "
                     f"of {steps}; it counts as stalled (still on the plateau at 2/3 of the run)")
  return lines


def _reason(ours: str) -> str:
  """The reason of a "not testable" text, without the measured numbers after it."""
  return ours.split(". Measured:")[0].replace("not testable at this scale: ", "")


def _summary(state: dict, rows: list[dict], summaries: dict) -> list[str]:
  """The report's opening: the tally per kind, the verdicts by name, what needs a larger preset, instabilities."""
  t = tally(rows)
  out = ["## Summary", "",
         f"- **Claims about models and training** ({sum(t['training'].values())}): {_tally_text(t['training'])}.",
         f"- **Implementation checks** ({sum(t['check'].values())}, checks of this code, not of the papers): "
         f"{_tally_text(t['check'])}."]
  for verdict, title in (("yes", "Held"), ("partly", "Held in part"), ("no", "Did not hold")):
    names = [r["statement"] for r in rows if r["kind"] == "training" and r["holds"] == verdict]
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


def _noise_line(eval_bytes: int, noise: dict | None, dyt: dict | None = None) -> str:
  """The limitation line on evaluation noise: measured where the warm-up grid measured it, else
  where the dyt study did (its ``eval_noise``: per run, |val - val_alt|, the same final model on two
  disjoint sets of validation windows), else an estimate. Only per-run differences are used (a
  summary's seed mean, min and max are never paired across window sets)."""
  if noise and noise.get("single"):
    s, p = noise["single"], noise.get("paired")
    return (f"- Evaluation on {eval_bytes:,} bytes per point. Measured noise (the same final model on a second set of "
            f"validation windows): median {s['median']:z.3f}, at most {s['max']:z.3f} nats over {s['n']} runs"
            + (f"; a paired warm-up gain moves by median {p['median']:z.3f}, at most {p['max']:z.3f}" if p else "")
            + (f"; a paired Pre-LN minus Post-LN difference by median {q['median']:z.3f}, at most {q['max']:z.3f}"
               if (q := noise.get("pre_post")) else "")
            + "; the rules' paired margin is 0.05 nats.")
  d = ((dyt or {}).get("eval_noise") or {}).get("single")
  if d:
    return (f"- Evaluation noise, measured by the dyt study (the same final model on a second, disjoint set of "
            f"held-out windows): |difference| median {d['median']:z.3f}, at most {d['max']:z.3f} nats over {d['n']} "
            f"runs (it includes what differs between the two window sets). The other studies' evaluations of "
            f"{eval_bytes:,} bytes per point are not measured twice: with a per-byte loss s.d. of about 2 nats, about "
            f"{2 / max(eval_bytes, 1) ** 0.5:z.2f} nat (an estimate).")
  return (f"- Evaluation on {eval_bytes:,} bytes per point: with a per-byte loss s.d. of about 2 nats, about "
          f"{2 / max(eval_bytes, 1) ** 0.5:z.2f} nat of noise per evaluation (an estimate: not measured in this run).")


def _run_lengths(pc: dict, names: list[str]) -> str:
  """The training-run lengths of the studies ``names`` that train (``steps`` or ``train_steps`` in
  their preset entry), with their batch where it differs from the preset's."""
  tr = pc.get("train", {})
  parts = []
  for name in names:
    c = pc.get(name, {})
    steps = c.get("steps", c.get("train_steps"))
    if not steps or name == "speed":
      continue
    batch, seq = c.get("batch_size", tr.get("batch_size")), c.get("seq_len", tr.get("seq_len"))
    tokens = f", {batch * seq * steps:,} tokens" if batch and seq else ""
    shape = "" if (batch, seq) == (tr.get("batch_size"), tr.get("seq_len")) else f" of {batch} x {seq}"
    parts.append(f"{name} {steps} steps{shape}{tokens}")
  return "; ".join(parts) if parts else "none"


def _limitations(state: dict, summaries: dict | None = None) -> list[str]:
  """What the scale of this preset cannot say, with its sizes (the training runs and seeds of the
  studies that ran, and the evaluation noise where a study measured it)."""
  summaries = summaries or {}
  pc = state.get("preset_config", {})
  m, tr = pc.get("model", {}), pc.get("train", {})
  batch, seq = tr.get("batch_size"), tr.get("seq_len")
  eval_bytes = (tr.get("eval_batches") or 0) * (batch or 0) * (seq or 0)
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
          f"- Scale: width {m.get('d_model')}, {m.get('n_heads')} heads, d_ff {m.get('d_ff')}; batch {batch} x "
          f"sequence {seq} bytes; training runs: {_run_lengths(pc, ran)}. The papers train translation, BERT and "
          "language models for 10^4-10^6 steps; a claim that needs their regime is marked not testable here rather "
          "than judged.",
          f"- Data: a byte-level corpus ({corpus}), not IWSLT/WMT/BERT text; losses are nats per byte.",
          _noise_line(eval_bytes, summaries.get("warmup", {}).get("eval_noise"), summaries.get("dyt")),
          f"- Optimizer: AdamW(0.9, 0.98), {wd_text} (a study states its own recipe where it differs); DeepNet's "
          "constants and bound are derived for SGD-like updates, Xiong et al.'s theory for Xavier init with "
          "W^Q = W^K = 0.",
          f"- Seeds per study: {seeds or 'none recorded'}; spreads are min-max over them (half-range shown), not "
          "confidence intervals; failures are counted out of the seeds.",
          "- Timings: taken on the device in the provenance; on a shared CPU they carry several percent of noise and "
          "say nothing about GPUs, so the timing claims are not testable on a CPU.", ""]
