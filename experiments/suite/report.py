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

import pathlib

from experiments.suite import claims as claims_lib
from experiments.suite import rule_changes, study
from experiments.suite.registry import EXPERIMENTS, read_json
from experiments.suite.spikes import SPIKE_NATS
from experiments.suite.report_provenance import confirmation_verdicts, pilot_verdicts, provenance_lines
from experiments.suite.report_verdicts import KIND_TITLE as _KIND_TITLE
from experiments.suite.report_verdicts import escape as _escape
from experiments.suite.report_verdicts import verdict_table as _verdict_table
from experiments.suite.report_summary import (  # noqa: F401 (re-exported: the report's summary block)
    VERDICT_TEXT, limitations, noise_lines, run_lengths, summary_block, tally_text, instabilities, tally)

__all__ = ["claims_rows", "docs_block", "instabilities", "render", "render_text", "tally"]

_NOT_RECHECKED = (" [not re-checked here: place and number as checked against the full text by the issue-17 "
                  "reviewer]")
_FIRST_SCREEN_CHARS = 240  # longer "ours" texts are cut in the appendix's first-screen verdict tables


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


def _first_screen(summaries: dict, rows: list[dict], counts: dict) -> list[str]:
  """The appendix's verdict tables: each verdict's testability conditions and criterion before its
  numbers (a claim's ``short`` text if it has one, else its ``ours`` cut at
  ``_FIRST_SCREEN_CHARS`` characters)."""
  out = ["## Verdicts with their conditions and criteria", ""]
  out += [", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + " (full claims table at the end).", ""]
  for name, summary in summaries.items():   # a study's note on how to read its rows (its optional hook)
    note = getattr(study.load(EXPERIMENTS[name]), "appendix_note", lambda s: None)(summary)
    if note:
      out += [f"*{note}*", ""]
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
                 f"{_escape(seeds)} | {VERDICT_TEXT.get(r['holds'], r['holds'])} |")
    out.append("")
  return out


ANSWER_WORDS = 680        # "What to use" is at most this many words (issue 44: 150; issue 50: the regime line,
#                           the ladder per sequence length and the gpu report's numbers need 100 more; issue 63:
#                           every line opens with its regime and names the gpu run's numbers where it disagrees;
#                           its second referee: the spikes behind a range's ends, 560 -> 580; its third: the arm's
#                           and the schedule's lines with the gpu run, the margin count and the shift, and a best
#                           rate at the grid's bottom edge named, the spikes behind the schedule's largest shift,
#                           580 -> 680)
REPORT_BYTES = 30_000     # the main report.md is at most this many bytes (issue 44: 25 KB; issue 63: every answer
#                           line with its regime and the gpu run's numbers, the limitations per study, 28 KB; its
#                           third referee: the fresh-seed column and answers and the design sources, 30 KB; tests
#                           check it)


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
      # Each summary carries its run's provenance, for the studies' answers and sections that compare a run with
      # another (its code, versions and corpus; issue 63): read here, never written into done.json.
      summaries[name] = {**read_json(done), "provenance": {**{k: state.get(k) for k in ("git", "versions", "corpus",
                                                                                   "runs_scan")},
                                                           "train": (state.get("preset_config") or {}).get("train")}}
    elif err.exists():
      failed[name] = read_json(err)["error"]
    else:
      missing.append(name)
  return state, summaries, failed, missing


def answer(summaries: dict, fresh: tuple[str, dict] | None = None) -> list[str]:
  """The "What to use" sentences: each study module's optional ``answer(summary) -> list[str]``, in the
  report's order. ``fresh``: ``(label, summaries)`` of the preset's fresh-seed confirmation run
  (:func:`confirmation_verdicts`); each of its studies' sentences (its optional ``fresh_answer``, else its
  ``answer``) then follows the report's own, opened by ``label`` (issue 63's third referee: a user reads both
  seed sets' numbers side by side).

  Raises:
    ValueError: the sentences are longer than :data:`ANSWER_WORDS` words (a study's answer must be cut,
      never the report's text silently truncated).
  """
  out = []
  for name, summary in summaries.items():
    module = study.load(EXPERIMENTS[name])
    fn = getattr(module, "answer", None)
    if fn is not None:
      out += fn(summary)
      if fresh is not None and name in fresh[1]:
        out += [f"{fresh[0]}: {x}" for x in getattr(module, "fresh_answer", fn)(fresh[1][name])]
  words = sum(len(x.split()) for x in out)
  if words > ANSWER_WORDS:
    raise ValueError(f"the studies' answers must be at most {ANSWER_WORDS} words, got {words}: {out}")
  return out


def _figures(summaries: dict) -> list[str]:
  """The headline figures of each study (``HEADLINE``), two per row (one figure alone, without a table)."""
  figs = []
  for name, summary in summaries.items():
    module = study.load(EXPERIMENTS[name])
    figs += [f"{name}/{f}" for f in getattr(module, "HEADLINE", ()) if f in summary.get("files", [])]
  if not figs:
    return []
  if len(figs) == 1:   # one figure: no table with an empty cell
    return [f"![{figs[0]}]({figs[0]})", ""]
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
  confirm = confirmation_verdicts(state)
  fresh = None
  if confirm is not None:
    label = f"The same design on fresh seeds (`{pathlib.Path(confirm[0]).name}`)"
    fresh = (label, _load(pathlib.Path(__file__).resolve().parents[2] / confirm[0])[1])
  out += [f"- {x}" for x in answer(summaries, fresh)] or ["No study of this preset states an answer."]
  out += ["", "The appendix ([appendix.md](appendix.md)) holds each claim's testability conditions, criterion and "
          "full numbers, the rule history and every instability.", ""]
  out += _verdict_table(summaries, rows, pilot_verdicts(state), confirm, state.get("preset", ""))
  out += _figures(summaries)
  out += summary_block(state, rows, summaries, None if confirm is None else confirm[1])
  out += limitations(state, summaries)
  out += ["## Provenance", ""] + provenance_lines(state) + [""]
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
  out += rule_changes.markdown((state.get("git") or {}).get("commit"),
                               [(i["rejudged"], (i.get("git") or {}).get("commit", "?"))
                                for i in state.get("invocations", [])[1:] if i.get("rejudged")])
  out += ["## Claims", "",
          "| claim | kind | source | published | ours | holds? |", "|---|---|---|---|---|---|"]
  for r in rows:
    ours = r["ours"] + (f" ({r['note']})" if r["note"] else "")
    out.append(f"| {_escape(r['statement'])} | {r['kind']} | {_escape(r['source'])} | {_escape(r['published'])} | "
               f"{_escape(ours)} | {VERDICT_TEXT.get(r['holds'], r['holds'])} |")
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
              f"- claims about models and training: {tally_text(t['training'])}",
              f"- implementation checks: {tally_text(t['check'])}", "",
              "| claim | verdict |", "|---|---|"]
    lines += [f"| `{r['id']}` | {VERDICT_TEXT.get(r['holds'], r['holds'])} |" for r in rows]
  lines += ["", DOCS_END]
  return "\n".join(lines)
