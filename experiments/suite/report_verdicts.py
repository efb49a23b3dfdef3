"""The report's verdict table (split from :mod:`experiments.suite.report`, issue 63): claim, what was measured,
seeds, verdict, the pilots' prediction and the fresh-seed confirmation's verdict, with the dagger of a rule
changed after the report's own runs were read (:func:`experiments.suite.rule_changes.revised_after_seen`)."""

from __future__ import annotations

import re
from typing import Any

from experiments.suite import rule_changes
from experiments.suite import claims as claims_lib
from experiments.suite.report_summary import VERDICT_TEXT

__all__ = ["KIND_TITLE", "escape", "seed_list", "verdict_table"]

TABLE_CHARS = 170  # longer "ours" texts are cut here (issue 63: the fresh-seed column and answers made room for
#                    the studies' sections scarce; the appendix's tables keep 240 characters and the full numbers)
KIND_TITLE = {"training": "Verdicts on the papers' claims (models at init, in training, in time)",
              "check": "Verdicts of the implementation checks"}


def escape(text: Any) -> str:
  """``text`` for a markdown table cell (pipes escaped, one line)."""
  return str(text).replace("|", "\\|").replace("\n", " ")


def seed_list(seeds) -> list[int]:
  """The seeds of a verdict-table row (a list of ints, or a text such as ``"op [10, 11, 12]; model ... [0]"``)."""
  return [int(x) for x in re.findall(r"\d+", str(seeds))] if not isinstance(seeds, (list, tuple)) else list(seeds)


def verdict_table(summaries: dict, rows: list[dict], pilots: dict, confirm=None, preset: str = "") -> list[str]:
  """The verdict table: claim, what we measured (short), seeds, verdict, the pilots' verdict where the
  preset names its pilots, and the fresh-seed confirmation's verdict where the preset names one (``confirm``:
  :func:`confirmation_verdicts`), with a line counting where it agrees; criteria and full numbers are in the
  appendix."""
  measured = {c["id"]: (c, c.get("seeds", summaries[n].get("seeds", ""))) for n in summaries
              for c in summaries[n].get("claims", [])}
  study_of = {c["id"]: n for n in summaries for c in summaries[n].get("claims", [])}
  fresh = {} if confirm is None else confirm[1]
  head = "| claim | ours (short; full numbers in the appendix) | seeds | verdict |" + (
      " pilots predicted |" if pilots else "") + (" fresh seeds |" if confirm else "")
  out = ["## Verdicts", "", head, "|---|---|---|---|" + ("---|" if pilots else "") + ("---|" if confirm else "")]
  agree, differ, shared, other_same, other_n = {"training": 0, "check": 0}, [], [], 0, 0
  n_kind = {"training": 0, "check": 0}
  judged = ("yes", "partly", "no")
  marked = False
  for kind in KIND_TITLE:
    for r in rows:
      if r["kind"] != kind or r["holds"] not in claims_lib.VERDICTS:
        continue
      c, seeds = measured[r["id"]]
      ours = c.get("short") or r["ours"]
      if len(ours) > TABLE_CHARS:
        ours = ours[:TABLE_CHARS].rsplit(" ", 1)[0] + " ..."
      mark = " †" if rule_changes.revised_after_seen(preset, r["id"], seed_list(seeds)) else ""
      marked |= bool(mark)
      cell = f"| {escape(r['statement'])} | {escape(ours)} | {escape(seeds)} | " \
             f"{VERDICT_TEXT.get(r['holds'], r['holds'])}{mark} |"
      if pilots:
        cell += f" {pilots.get(r['id'], '-')} |"
      if confirm:
        key = f"{study_of.get(r['id'])}/{r['id']}"
        there = fresh.get(key)
        both = sorted(set(seed_list(seeds)) & set(seed_list(confirm[3].get(key, ""))))
        note = f" (seeds {both} in both: no fresh-seed check)" if there is not None and both else ""
        cell += f" {VERDICT_TEXT.get(there, there) if there else '-'}{note} |"
        if there is None:
          pass
        elif both:
          shared.append(f"`{r['id']}`")
        elif r["holds"] not in judged or there not in judged:
          other_n += 1
          other_same += there == r["holds"]
        elif there == r["holds"]:
          agree[r["kind"]] += 1
          n_kind[r["kind"]] += 1
        else:
          n_kind[r["kind"]] += 1
          differ.append(f"`{r['id']}` {VERDICT_TEXT.get(r['holds'], r['holds'])} here, "
                        f"{VERDICT_TEXT.get(there, there)} there")
      out.append(cell)
  if confirm:
    out += ["", f"Fresh seeds: the same design and rules on {confirm[2]}, which no earlier run had used "
            f"(`{confirm[0]}`, run after this report; its own report there). Judged yes, partly or no on both seed "
            f"sets, {agree['training']} of {n_kind['training']} claims about models and training"
            + (f" and {agree['check']} of {n_kind['check']} implementation checks" if n_kind["check"] else "")
            + " have the same verdict"
            + (f"; different: {'; '.join(differ)}" if differ else "")
            + (f". The other rows (not testable, n/a): {other_same} of {other_n} the same" if other_n else "")
            + (f". Not checked on fresh seeds (a seed shared by both runs): {', '.join(shared)}" if shared else "")
            + (". Neither side is re-judged: a verdict that differs rests on its seeds." if differ else ".")]
  if marked:
    out += ["", "† this claim's rule was changed after this report's own runs (its preset, the seeds in the row) "
            "had been read, and the verdict re-judged on them (the appendix's \"Rule changes\" says when and why)."]
  return out + [""]
