"""The history of the verdict rules: what changed, when, why, and whether the data had been seen.

The report prints :data:`RULE_CHANGES` as its "Rule changes" section, so a reader can tell a rule
fixed in advance from one revised after its verdicts were read. Every entry names the commits
between which the rule changed (the committed ``cpu`` reports at ``fab34dd`` and ``9bd691d`` were
computed on identical gradient data and differ in seven verdicts, all from rule changes) and
says plainly whether the data the rule judges had been looked at when it changed. The entries
are data, in ``rule_changes.toml`` next to this module (:mod:`experiments.suite.tables`); a new
rule change gets a new entry there in the same commit.
"""

from __future__ import annotations

import dataclasses

from experiments.suite import tables

__all__ = ["RULE_CHANGES", "RuleChange", "markdown", "revised_after_seen"]


@dataclasses.dataclass(frozen=True)
class RuleChange:
  """One change of a verdict rule.

  Attributes:
    when: the commits (or issue) of the change, oldest first.
    claims: the claim ids whose rule changed.
    what: the rule before and after.
    why: the reason given at the time.
    data_seen: whether the verdicts of the data it judges had been read before the change.
    seen: where ``data_seen``, whose data had been read: ``"PRESET:SEEDS"`` entries (``"cpu-extra:10-12"``,
      ``"cpu:0,1,2"``), so that a report marks a verdict only where its own preset's runs on its own seeds
      had been read when the rule changed (:func:`revised_after_seen`). The pilots' runs are never the data a
      rule judges: a rule written with only them in view has ``data_seen`` False.
    verdict_rule: False for a change of the report's wording that acts like a rule (a bold line's condition)
      and changes no verdict: listed in the history, never marked on a verdict.
  """

  when: str
  claims: tuple[str, ...]
  what: str
  why: str
  data_seen: bool
  seen: tuple[str, ...] = ()
  verdict_rule: bool = True

  def __post_init__(self):
    if not (self.when and self.claims and self.what and self.why):
      raise ValueError(f"a rule change names when, which claims, what and why, got {self!r}.")
    if self.data_seen != bool(self.seen):
      raise ValueError(f"a rule change with data_seen names whose data (seen), and only then, got {self!r}.")
    for entry in self.seen:
      _parse_seen(entry)

  def seen_seeds(self) -> dict[str, frozenset[int]]:
    """``{preset: seeds}`` of :attr:`seen`."""
    return dict(_parse_seen(e) for e in self.seen)


def _parse_seen(entry: str) -> tuple[str, frozenset[int]]:
  """``("cpu", {0, 1, 2})`` of ``"cpu:0-2"`` (a range, or seeds separated by commas).

  Raises:
    ValueError: ``entry`` is not ``PRESET:SEEDS``.
  """
  name, sep, seeds = str(entry).partition(":")
  try:
    if "-" in seeds:
      lo, hi = (int(x) for x in seeds.split("-"))
      out = frozenset(range(lo, hi + 1))
    else:
      out = frozenset(int(x) for x in seeds.split(","))
  except ValueError:
    out = frozenset()
  if not (name and sep and out):
    raise ValueError(f"seen must be 'PRESET:SEEDS' (e.g. 'cpu-extra:10-12'), got {entry!r}")
  return name, out


# Oldest first, as ``rule_changes.toml`` lists them.
RULE_CHANGES: tuple[RuleChange, ...] = tuple(RuleChange(**c) for c in tables.load("rule_changes.toml")["changes"])


def revised_after_seen(preset: str, claim: str, seeds) -> bool:
  """Whether ``claim``'s rule was changed, claim by claim (a change of every claim, ``"*"``, is not counted),
  after the runs of ``preset`` on any of ``seeds`` (the seeds the report judged the claim on) had been read:
  the report's own data, re-judged by a rule written after it was seen. A change made after other seeds, another
  preset or the pilots were read does not count (issue 63's third referee)."""
  mine = {int(s) for s in seeds or ()}
  return any(mine & c.seen_seeds().get(preset, frozenset()) for c in RULE_CHANGES
             if claim in c.claims and c.verdict_rule)


def _seeds_text(seeds) -> str:
  s = sorted(seeds)
  return f"{s[0]}-{s[-1]}" if len(s) > 2 and s == list(range(s[0], s[-1] + 1)) else ", ".join(map(str, s))


def markdown(commit: str | None = None, rejudged: list[tuple[list[str], str]] | None = None) -> list[str]:
  """The report's "Rule changes" section: one table row per change, after the line naming the commit
  whose rules this report applies (``commit``, the run's git commit; None: not known) and, where studies were
  re-judged from their raw data since (``rejudged``: ``(study names, commit)`` per re-judgement), the later
  commits whose rules those studies' verdicts follow."""
  frozen = (f"This report's rules are those of its commit, git `{commit}`: the issue-31 rules (first frozen after "
            "the pilots on seeds 100-102 and the report at 87da7be had been seen) with every change in the table "
            "below up to that commit" if commit else "")
  if frozen and rejudged:
    last: dict[str, str] = {}
    for names, c in rejudged:
      last.update({n: str(c)[:7] for n in names})
    frozen += ("; except the studies re-judged from their raw data since, whose verdicts follow the rules of the "
               "last re-judgement's commit: " + ", ".join(f"{n} (git `{c}`)" for n, c in last.items()))
  frozen += ". " if frozen else ""
  out = ["## Rule changes", "",
         frozen + "Every change of a verdict rule since the first committed `cpu` report, with whether the verdicts of "
         "the data it judges had been read when it changed. A rule changed after its data was seen is disclosed here, "
         "not hidden: read its verdict with that in mind.", "",
         "| when | claims | what changed | why | data seen? |", "|---|---|---|---|---|"]
  for c in RULE_CHANGES:
    claims = "every claim" if c.claims == ("*",) else ", ".join(f"`{x}`" for x in c.claims)
    seen = ", ".join(f"{p} seeds {_seeds_text(v)}" for p, v in c.seen_seeds().items())
    out.append(f"| {c.when} | {claims} | {c.what} | {c.why} | {f'yes ({seen})' if c.data_seen else 'no'} |")
  out.append("")
  return out
