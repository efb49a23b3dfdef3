"""Renders ``report.md`` from a results folder written by :mod:`experiments.suite.runner`.

The report opens with a summary a reader can trust in one minute (the tally, implementation
checks apart from claims about training; what held, what did not, what this preset cannot test
and why; every instability) and the limitations of the scale, then one screen (a grid of each
experiment's ``HEADLINE`` figures and two verdict tables, claims about training and
implementation checks: claim, when the design can test it, criterion, our numbers, seeds,
verdict), then the provenance (preset, command, device, versions, corpus hash, git commit), the
"Rule changes" section (:mod:`experiments.suite.rule_changes`), then one section per experiment (written by the
experiment module's ``report_section``, embedding its PNGs by relative path, followed by its
claims and the links to its ``RAW_DATA`` files), and ends with
the table "claim - source - published number - our number - holds?" built from
:data:`experiments.suite.claims.CLAIMS` and the ``claims`` of each experiment's ``done.json``.

Each experiment module provides ``TITLE``, ``RAW_DATA`` (its data files, linked after its
claims), optionally ``HEADLINE`` (figures for the first screen) and
``report_section(summary, rel) -> str``: ``summary`` is the experiment's
``done.json`` (what its ``run`` returned plus its ``config`` as a dict) and ``rel`` its folder
relative to the report, for image and data links. The section returns the setup, plots and
tables; this module adds the claims list and the raw-data line after it.

``python -m experiments run --report-only --out DIR`` re-renders it without recomputing.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from experiments.studies.seeds import SPIKE_NATS
from experiments.suite import claims as claims_lib
from experiments.suite import presets as presets_lib
from experiments.suite import rule_changes, study
from experiments.suite.registry import EXPERIMENTS, read_json

__all__ = ["claims_rows", "docs_block", "instabilities", "render", "render_text", "tally"]

_NOT_RECHECKED = (" [not re-checked here: place and number as checked against the full text by the issue-17 "
                  "reviewer]")
_FIRST_SCREEN_CHARS = 240  # longer "ours" texts are cut in the first screen's verdict table
_VERDICT_TEXT = {"yes": "yes", "no": "**no**", "partly": "partly", "n/a": "n/a", "obs": "(observation)",
                 claims_lib.NOT_TESTABLE: "not testable at this scale", "not run": "not run by this preset"}
_KIND_TITLE = {"training": "Verdicts on the papers' claims (models at init, in training, in time)",
               "check": "Verdicts of the implementation checks"}


def _escape(text: Any) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def claims_rows(summaries: dict[str, dict]) -> list[dict]:
  """Joins the published claims with the measured ones, in the order of :data:`CLAIMS`.

  A claim whose experiment did not run (or did not report it) gets ``holds="not run"``.
  """
  measured = {}
  for name, summary in summaries.items():
    for c in summary.get("claims", []):
      if c["id"] not in claims_lib.CLAIMS:
        raise ValueError(f"experiment {name!r} reports an unknown claim id {c['id']!r}; "
                         f"add it to experiments/suite/claims.toml.")
      measured[c["id"]] = c
  rows = []
  for cid, claim in claims_lib.CLAIMS.items():
    m = measured.get(cid)
    rows.append({
        "id": cid,
        "experiment": claim.experiment,
        "statement": claim.statement,
        "source": claim.source + (f" [checked in: {claim.checked_in}]" if claim.checked else _NOT_RECHECKED),
        "published": claim.published,
        "ours": m["ours"] if m else "-",
        "holds": m["holds"] if m else "not run",
        "kind": claim.kind,
        "testable_when": claim.testable_when,
        "note": (m or {}).get("note", ""),
    })
  return rows


def _claims_and_raw_data(summary: dict, rel: str, raw_data: tuple[str, ...]) -> list[str]:
  """The end of every experiment's section: its claims, one line each, and its raw-data files."""
  lines = [f"- {c['id']}: " + (f"*criterion:* {c['criterion']}. *Ours:* " if c.get("criterion") else "")
           + f"{c['ours']} -> **{c['holds']}**" for c in summary["claims"]]
  return lines + ["", "Raw data: " + ", ".join(f"`{rel}/{f}`" for f in raw_data) + "."]


def _provenance_lines(state: dict) -> list[str]:
  dev = state.get("device", {})
  ver = state.get("versions", {})
  corpus = state.get("corpus") or {}
  git = state.get("git") or {}
  preset = state.get("preset_config", {})
  lines = [
      "| | |",
      "|---|---|",
      f"| preset | `{state.get('preset')}`: {preset.get('description', '')} |",
      f"| command | `{state.get('command', '').strip()}` |",
      f"| date (UTC) | {state.get('created')} |",
      f"| device | {dev.get('backend')} / {dev.get('device_kind')} x{dev.get('n_devices')}; "
      f"CPU {dev.get('cpu')} ({dev.get('cpu_count')} cores); {dev.get('platform')}"
      + (f"; load average {dev['load_avg_1m']:z.1f} at the start" if dev.get("load_avg_1m") is not None else "")
      + " |",
      "| versions | " + ", ".join(f"{k} {v}" for k, v in ver.items() if v) + " |",
      f"| corpus | {corpus.get('name')} ({corpus.get('n_bytes')} bytes, {corpus.get('n_files')} files), "
      f"sha256 `{corpus.get('sha256')}` |",
      f"| git | `{git.get('commit')}`{' (with uncommitted changes)' if git.get('dirty') else ''} |",
  ]
  for inv in state.get("invocations", [])[1:]:
    what = ("re-rendered (no unit recomputed)" if inv.get("report_only") else
            f"re-judged from the raw data ({', '.join(inv['rejudged'])}; no unit recomputed)" if inv.get("rejudged")
            else "later invocation")
    g = inv.get("git") or {}
    lines.append(f"| {what} | {inv.get('created')}: `{inv.get('command', '').strip()}` "
                 f"(git `{g.get('commit')}`{', dirty: with uncommitted changes' if g.get('dirty') else ''}) |")
  return lines


def _first_screen(summaries: dict, rows: list[dict], counts: dict) -> list[str]:
  """The appendix's verdict tables: each verdict's testability conditions and criterion before its
  numbers (a claim's ``short`` text if it has one, else its ``ours`` cut at
  ``_FIRST_SCREEN_CHARS`` characters)."""
  out = ["## Verdicts with their conditions and criteria", ""]
  out += [", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + " (full claims table at the end).", ""]
  measured = {c["id"]: (c, c.get("seeds", summaries[n].get("seeds", ""))) for n in summaries
              for c in summaries[n].get("claims", [])}
  for kind, title in _KIND_TITLE.items():
    kind_rows = [r for r in rows if r["kind"] == kind and r["holds"] in claims_lib.VERDICTS]
    out += [f"### {title}", "", "| claim | testable when | criterion | ours | seeds | verdict |",
            "|---|---|---|---|---|---|"]
    for r in kind_rows:
      c, seeds = measured[r["id"]]
      crit = c.get("criterion") or c.get("note") or "-"
      ours = c.get("short") or r["ours"]
      if len(ours) > _FIRST_SCREEN_CHARS:
        ours = ours[:_FIRST_SCREEN_CHARS].rsplit(" ", 1)[0] + " ... (full numbers in the section)"
      out.append(f"| {_escape(r['statement'])} | {_escape(r['testable_when'])} | {_escape(crit)} | {_escape(ours)} | "
                 f"{_escape(seeds)} | {_VERDICT_TEXT.get(r['holds'], r['holds'])} |")
    out.append("")
  return out


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


ANSWER_WORDS = 250        # "What to use" is at most this many words (issue 44: 150; issue 50: the regime line,
#                           the ladder per sequence length and the gpu report's numbers need 100 more)
REPORT_BYTES = 25_000     # the main report.md is at most this many bytes (issue 44; tests check it)


def _load(root: pathlib.Path):
  """``(state, summaries, failed, missing)`` of the results folder ``root``."""
  suite_path = root / "suite.json"
  if not suite_path.exists():
    raise FileNotFoundError(f"{suite_path} not found: run `python -m experiments run --out {root}` first.")
  state = read_json(suite_path)
  summaries, failed, missing = {}, {}, []
  for name in EXPERIMENTS:
    done, err = root / name / "done.json", root / name / "error.json"
    if done.exists():
      summaries[name] = read_json(done)
    elif err.exists():
      failed[name] = read_json(err)["error"]
    else:
      missing.append(name)
  return state, summaries, failed, missing


def answer(summaries: dict) -> list[str]:
  """The "What to use" sentences: each study module's optional ``answer(summary) -> list[str]``, in the
  report's order.

  Raises:
    ValueError: the sentences are longer than :data:`ANSWER_WORDS` words (a study's answer must be cut,
      never the report's text silently truncated).
  """
  out = []
  for name, summary in summaries.items():
    fn = getattr(study.load(EXPERIMENTS[name]), "answer", None)
    if fn is not None:
      out += fn(summary)
  words = sum(len(x.split()) for x in out)
  if words > ANSWER_WORDS:
    raise ValueError(f"the studies' answers must be at most {ANSWER_WORDS} words, got {words}: {out}")
  return out


def _pilot_verdicts(state: dict) -> dict[str, str]:
  """``{claim id: verdict}`` of the pilot run named by the preset's ``pilot_results`` (a folder of the
  repository holding ``<study>/done.json``); empty without one."""
  rel = ((state.get("preset_config") or {}).get("pilot_results")
         or presets_lib.PRESETS.get(state.get("preset"), {}).get("pilot_results"))
  if not rel:
    return {}
  root = pathlib.Path(__file__).resolve().parents[2] / rel
  out = {}
  for done in sorted(root.glob("*/done.json")):
    out.update({c["id"]: c["holds"] for c in read_json(done).get("claims", []) if c.get("holds") != "obs"})
  return out


def _verdict_table(summaries: dict, rows: list[dict], pilots: dict) -> list[str]:
  """The verdict table: claim, what we measured (short), seeds, verdict, and the pilots' verdict where the
  preset names its pilots; criteria and full numbers are in the appendix."""
  measured = {c["id"]: (c, c.get("seeds", summaries[n].get("seeds", ""))) for n in summaries
              for c in summaries[n].get("claims", [])}
  head = "| claim | ours (short; full numbers in the appendix) | seeds | verdict |" + (" pilots predicted |"
                                                                                     if pilots else "")
  out = ["## Verdicts", "", head, "|---|---|---|---|" + ("---|" if pilots else "")]
  for kind in _KIND_TITLE:
    for r in rows:
      if r["kind"] != kind or r["holds"] not in claims_lib.VERDICTS:
        continue
      c, seeds = measured[r["id"]]
      ours = c.get("short") or r["ours"]
      if len(ours) > _FIRST_SCREEN_CHARS:
        ours = ours[:_FIRST_SCREEN_CHARS].rsplit(" ", 1)[0] + " ..."
      cell = f"| {_escape(r['statement'])} | {_escape(ours)} | {_escape(seeds)} | " \
             f"{_VERDICT_TEXT.get(r['holds'], r['holds'])} |"
      if pilots:
        cell += f" {pilots.get(r['id'], '-')} |"
      out.append(cell)
  return out + [""]


def _figures(summaries: dict) -> list[str]:
  """The headline figures of each study (``HEADLINE``), two per row."""
  figs = []
  for name, summary in summaries.items():
    module = study.load(EXPERIMENTS[name])
    figs += [f"{name}/{f}" for f in getattr(module, "HEADLINE", ()) if f in summary.get("files", [])]
  if not figs:
    return []
  out = ["| | |", "|---|---|"]
  for i in range(0, len(figs), 2):
    cells = [f"![{f}]({f})" for f in figs[i:i + 2]] + [""] * (2 - len(figs[i:i + 2]))
    out.append(f"| {cells[0]} | {cells[1]} |")
  return out + [""]


def render_text(root: str | pathlib.Path) -> str:
  """The markdown text of the report of the results folder ``root`` (what to use, verdicts, figures,
  summary, limitations, provenance, one section per study); criteria, rule history and per-run lists
  are in :func:`render_appendix`."""
  root = pathlib.Path(root)
  state, summaries, failed, _ = _load(root)
  out = _head(state, summaries, failed)
  head = "\n".join(out)
  sections = _sections(root, summaries, failed)
  moved = _moved_sections(len(head.encode()), sections)
  for name, (title, body) in sections.items():
    out += [title, "", _pointer(name) if name in moved else body, ""]
  return "\n".join(out)


def _head(state: dict, summaries: dict, failed: dict) -> list[str]:
  """The report before the studies' sections: what to use, verdicts, figures, summary, limitations,
  provenance and the table of experiments."""
  rows = claims_rows(summaries)
  out = [f"# jaxnorm experiment report (preset `{state.get('preset')}`)", "", "## What to use", ""]
  out += [f"- {x}" for x in answer(summaries)] or ["No study of this preset states an answer."]
  out += ["", "The appendix ([appendix.md](appendix.md)) holds each claim's testability conditions, criterion and "
          "full numbers, the rule history and every instability.", ""]
  out += _verdict_table(summaries, rows, _pilot_verdicts(state))
  out += _figures(summaries)
  out += _summary(state, rows, summaries)
  out += _limitations(state, summaries)
  out += ["## Provenance", ""] + _provenance_lines(state) + [""]
  exps = state.get("experiments", {})
  out += ["| experiment | status | wall time (s) | seeds |", "|---|---|---|---|"]
  for name in EXPERIMENTS:
    info = exps.get(name, {})
    status = "done" if name in summaries else ("failed" if name in failed else "not run")
    wall = summaries.get(name, {}).get("wall_s", info.get("wall_s"))
    seeds = summaries.get(name, {}).get("seeds", "")
    out.append(f"| {name} | {status} | {'' if wall is None else f'{float(wall):z.0f}'} | {seeds} |")
  out.append("")
  return out


def _sections(root: pathlib.Path, summaries: dict, failed: dict) -> dict[str, tuple[str, str]]:
  """``{study: (heading, body)}`` of every study that ran or failed, in the report's order."""
  out = {}
  for i, name in enumerate(EXPERIMENTS, 1):
    if name not in summaries and name not in failed:
      continue
    module = study.load(EXPERIMENTS[name])
    if name in summaries:
      raw = ", ".join(f"[{f}]({name}/{f})" for f in module.RAW_DATA if (root / name / f).exists())
      body = (module.report_section(summaries[name], name).rstrip()
              + f"\n\nRaw data: {raw or '-'}; claims and their numbers: [appendix.md](appendix.md#{name}).")
    else:
      body = f"**This experiment failed:** `{_escape(failed[name])}` (traceback in `{name}/error.json`)."
    out[name] = (f"## {i}. {module.TITLE}", body)
  return out


def _pointer(name: str) -> str:
  """The text left in the report in place of a section moved to the appendix."""
  return (f"This study's section is in the appendix ([appendix.md](appendix.md#section-{name})), to keep this report "
          f"under {REPORT_BYTES // 1000} KB.")


def _moved_sections(head_bytes: int, sections: dict[str, tuple[str, str]]) -> set[str]:
  """The studies whose sections go to the appendix: the largest first, until the report fits
  :data:`REPORT_BYTES` (each moved section counted as the :func:`_pointer` left in its place, with a
  200-byte margin). The sections of the studies that answer "What to use" (an ``answer`` function) stay
  in the report; they move only if the others do not make room (issue 50)."""
  sizes = {n: len((t + b).encode()) + 5 for n, (t, b) in sections.items()}
  total, moved = head_bytes + sum(sizes.values()), set()
  answers = {n for n in sizes if hasattr(study.load(EXPERIMENTS[n]), "answer")}
  for n in sorted(sizes, key=lambda n: (n in answers, -sizes[n])):
    gain = sizes[n] - len((sections[n][0] + _pointer(n)).encode()) - 5
    if total <= REPORT_BYTES - 200:
      break
    if gain > 0:   # a section shorter than its pointer stays
      moved.add(n)
      total -= gain
  return moved


def render_appendix(root: str | pathlib.Path) -> str:
  """The appendix of the report of ``root``: the verdict tables with testability and criteria, each
  study's claims with their full numbers, every instability, the rule history and the claims table."""
  root = pathlib.Path(root)
  state, summaries, _, _ = _load(root)
  rows = claims_rows(summaries)
  counts: dict[str, int] = {}
  for r in rows:
    counts[r["holds"]] = counts.get(r["holds"], 0) + 1
  out = [f"# Appendix of the `{state.get('preset')}` report", "", "[Back to the report](report.md)", ""]
  out += _first_screen(summaries, rows, counts)
  inst = instabilities(summaries, state.get("runs_scan"))
  out += ["## Instabilities", "", f"Every divergence, every training-loss spike above {SPIKE_NATS:g} nat of every "
          "training run, and every late plateau exit:", ""] + ([f"- {x}" for x in inst] or ["- none"]) + [""]
  for name in summaries:
    module = study.load(EXPERIMENTS[name])
    out += [f"<a id=\"{name}\"></a>", "", f"## {name}: claims and numbers", ""]
    out += _claims_and_raw_data(summaries[name], name, module.RAW_DATA) + [""]
  failed = _load(root)[2]
  head = len("\n".join(_head(state, summaries, failed)).encode())
  sections = _sections(root, summaries, failed)
  for name in sorted(_moved_sections(head, sections)):
    title, body = sections[name]
    out += [f"<a id=\"section-{name}\"></a>", "", title + " (the report's section)", "", body, ""]
  out += rule_changes.markdown((state.get("git") or {}).get("commit"))
  out += ["## Claims", "",
          "| claim | kind | source | published | ours | holds? |", "|---|---|---|---|---|---|"]
  for r in rows:
    ours = r["ours"] + (f" ({r['note']})" if r["note"] else "")
    out.append(f"| {_escape(r['statement'])} | {r['kind']} | {_escape(r['source'])} | {_escape(r['published'])} | "
               f"{_escape(ours)} | {_VERDICT_TEXT.get(r['holds'], r['holds'])} |")
  out.append("")
  return "\n".join(out)


def render(root: str | pathlib.Path) -> pathlib.Path:
  """Writes ``root/report.md`` and ``root/appendix.md`` and returns the report's path."""
  root = pathlib.Path(root)
  (root / "appendix.md").write_text(render_appendix(root))
  path = root / "report.md"
  path.write_text(render_text(root))
  return path


DOCS_BEGIN = "<!-- generated from the committed cpu report by experiments.suite.report.docs_block: do not edit -->"
DOCS_END = "<!-- end of the generated block -->"


def docs_block(roots) -> str:
  """The block of ``docs/experiments.md`` that names the committed reports' verdicts.

  The docs restate no verdict by hand: this block is rendered from the results folders ``roots``
  (one folder or a list: ``experiments/results/cpu`` and ``experiments/results/cpu-extra``), one
  part per report listing the claims its preset ran; ``tests/experiments/test_docs_report.py`` fails if the
  docs' copy differs. ``python -m experiments.suite.docs_sync`` rewrites it.
  """
  roots = [roots] if isinstance(roots, (str, pathlib.Path)) else list(roots)
  lines = [DOCS_BEGIN]
  for root in map(pathlib.Path, roots):
    state = read_json(root / "suite.json")
    summaries = {name: read_json(root / name / "done.json") for name in EXPERIMENTS
                 if (root / name / "done.json").exists()}
    rows = [r for r in claims_rows(summaries) if r["holds"] != "not run"]
    t = tally(rows)
    git = (state.get("git") or {}).get("commit", "?")
    preset = state.get("preset")
    lines += ["", f"The committed `{preset}` report ([experiments/results/{preset}/report.md]"
              f"(../experiments/results/{preset}/report.md), git `{str(git)[:7]}`, {state.get('created')}):", "",
              f"- claims about models and training: {_tally_text(t['training'])}",
              f"- implementation checks: {_tally_text(t['check'])}", "",
              "| claim | verdict |", "|---|---|"]
    lines += [f"| `{r['id']}` | {_VERDICT_TEXT.get(r['holds'], r['holds'])} |" for r in rows]
  lines += ["", DOCS_END]
  return "\n".join(lines)
