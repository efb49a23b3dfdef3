"""Where a report's inputs came from: the provenance table of ``report.md`` (preset, command, device,
versions, corpus, commit, and every later invocation: re-judged or redrawn from the raw data one row each, the
re-renders of one command in one row, which ``suite.json`` lists one by one) and
the verdicts the pilots predicted (the verdict table's last column). Split from :mod:`experiments.suite.report`
(issue 63), which re-exports them.
"""

from __future__ import annotations

import pathlib

from experiments.suite import presets as presets_lib
from experiments.suite.registry import read_json

__all__ = ["confirmation_verdicts", "pilot_verdicts", "provenance_lines"]


def provenance_lines(state: dict) -> list[str]:
  """The report's provenance table as markdown lines: the first invocation's preset, command, date, device,
  versions, corpus and commit, then every later invocation (re-judged and redrawn ones a row each, the
  re-renders of one command collapsed into one row with their count, first and last date and the last commit)."""
  dev = state.get("device", {})
  ver = state.get("versions", {})
  corpus = state.get("corpus") or {}
  git = state.get("git") or {}
  lines = [
      "| | |",
      "|---|---|",
      f"| preset | {_preset_text(state)} |",
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
  groups: dict[tuple[str, str], list[dict]] = {}
  for inv in state.get("invocations", [])[1:]:
    groups.setdefault((_kind(inv), inv.get("command", "").strip()), []).append(inv)
  order = sorted(groups.items(), key=lambda kv: kv[0][0] == "re-rendered (no unit recomputed)")  # renders last
  for (what, command), invs in order:
    when = (invs[0].get("created") if len(invs) == 1
            else f"{len(invs)} times, {invs[0].get('created')} to {invs[-1].get('created')}")
    what += _verdict_note(invs)
    lines.append(f"| {what} | {when}: `{command}` (the last at {_git_text(invs[-1])}; each in `suite.json`'s "
                 "invocations) |" if len(invs) > 1 else f"| {what} | {when}: `{command}` ({_git_text(invs[-1])}) |")
  return lines


def _kind(inv: dict) -> str:
  """What a later invocation did, as the provenance table's first column says it."""
  if inv.get("report_only"):
    return "re-rendered (no unit recomputed)"
  if inv.get("rejudged"):
    return f"re-judged from the raw data ({', '.join(inv['rejudged'])}; no unit recomputed"
  if inv.get("redrawn"):
    return (f"{' and '.join(inv.get('what') or ['figures'])} recomputed from the raw data "
            f"({', '.join(inv['redrawn'])}; verdicts kept, no unit recomputed)")
  return "later invocation"


def _verdict_note(invs: list[dict]) -> str:
  """For re-judgements (their kind ends open): which verdicts they changed, as ``reanalyse`` recorded it (older
  invocations recorded nothing), and the closing parenthesis; empty for other kinds."""
  if not invs[0].get("rejudged"):
    return ""
  known = [i for i in invs if "verdicts_changed" in i]
  changed = [c for i in known for c in i["verdicts_changed"]]
  if changed:
    return f"; verdicts changed: {', '.join(changed)})"
  if known and len(known) == len(invs):
    return "; every verdict unchanged)"
  if known:
    n = "the last one" if len(known) == 1 else f"the last {len(known)}"
    return f"; {n} left every verdict unchanged)"
  return ")"


def _git_text(inv: dict) -> str:
  g = inv.get("git") or {}
  return f"git `{str(g.get('commit'))[:12]}`{', dirty: with uncommitted changes' if g.get('dirty') else ''}"


def _preset_text(state: dict) -> str:
  """The preset's name and description: its description as the run recorded it where the preset's sizes are
  still the same, else only the name and the commit of its design (issue 63: a description of a design since
  changed, e.g. "on one H100" of a run on an H200, is not the run's)."""
  name, pc = state.get("preset"), state.get("preset_config") or {}
  now = presets_lib.PRESETS.get(name)
  ignore = ("description", "pilot_results", "design_sources", "confirmation_results", "name")
  if now is not None and {k: v for k, v in pc.items() if k not in ignore} == {
      k: v for k, v in _as_lists(now).items() if k not in ignore}:
    return f"`{name}`: {pc.get('description', '')}"
  git = str((state.get("git") or {}).get("commit", "?"))[:7]
  return (f"`{name}` as it was at git `{git}` (its sizes since changed; the sizes of this run are in the limitations "
          "and the sections)")


def _as_lists(value):
  """A preset (tuples from TOML) as JSON reads it back (lists), to compare with a recorded one."""
  if isinstance(value, dict):
    return {k: _as_lists(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_as_lists(v) for v in value]
  return value


def _pilot_folders(state: dict) -> list[str]:
  """The pilot folders of the preset's ``pilot_results`` (one path or a list), as the run recorded them and as
  the preset names them now (issue 63: a study's pilots added later are read too), without repeats."""
  out: list[str] = []
  for value in ((state.get("preset_config") or {}).get("pilot_results"),
                presets_lib.PRESETS.get(state.get("preset"), {}).get("pilot_results")):
    for rel in ([value] if isinstance(value, str) else list(value or [])):
      if rel not in out:
        out.append(rel)
  return out


def pilot_verdicts(state: dict) -> dict[str, str]:
  """``{claim id: verdict}`` the pilots predicted, from each folder of :func:`_pilot_folders` (a folder of the
  repository): the claims of its ``<study>/done.json`` (a pilot run of the suite), and its ``predicted.json``
  (``{preset: {claim id: verdict}}``, the verdicts a pilots README predicted in words, with the README's
  section named in its ``"source"``); empty without any."""
  out = {}
  repo = pathlib.Path(__file__).resolve().parents[2]
  for rel in _pilot_folders(state):
    root = repo / rel
    for done in sorted(root.glob("*/done.json")):
      out.update({c["id"]: c["holds"] for c in read_json(done).get("claims", []) if c.get("holds") != "obs"})
    if (root / "predicted.json").exists():
      out.update(read_json(root / "predicted.json").get(state.get("preset"), {}))
  return out


def confirmation_verdicts(state: dict) -> tuple[str, dict[str, str], str, dict[str, str]] | None:
  """``(folder, {"study/claim id": verdict}, seeds, {"study/claim id": its seeds})`` of the fresh-seed confirmation
  run the preset names (its
  ``confirmation_results``, a folder of the repository; issue 63), or None where it names none, the folder holds
  no finished study, or the folder is a run of this report's own preset (a confirmation preset that extends
  its base inherits the key)."""
  rel = (presets_lib.PRESETS.get(state.get("preset"), {}) or {}).get("confirmation_results")
  if not rel:
    return None
  root = pathlib.Path(__file__).resolve().parents[2] / rel
  if not (root / "suite.json").exists() or read_json(root / "suite.json").get("preset") == state.get("preset"):
    return None
  done = {d.parent.name: read_json(d) for d in sorted(root.glob("*/done.json"))}   # one read of each study
  verdicts, seeds = {}, {}
  for study, d in done.items():
    for c in d.get("claims", []):
      seeds[f"{study}/{c['id']}"] = c.get("seeds", d.get("seeds", ""))
      if c.get("holds") != "obs":   # as compare_verdicts.verdicts_of counts them
        verdicts[f"{study}/{c['id']}"] = c["holds"]
  if not verdicts:
    return None
  return rel, verdicts, _seeds_text({k: d.get("seeds") for k, d in done.items()}), seeds


def _seeds_text(per: dict) -> str:
  """``"seeds [50, 51, 52] (vjp [50])"``: of ``{study: seeds}``, the seeds most studies ran, and each other one's."""
  per = {k: v for k, v in per.items() if v}
  if not per:
    return "its seeds"
  lists = [tuple(v) for v in per.values()]
  common = max(set(lists), key=lists.count)
  other = [f"{k} {list(v)}" for k, v in per.items() if tuple(v) != common]
  return f"seeds {list(common)}" + (f" ({', '.join(other)})" if other else "")
