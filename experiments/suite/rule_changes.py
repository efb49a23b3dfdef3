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
  """

  when: str
  claims: tuple[str, ...]
  what: str
  why: str
  data_seen: bool

  def __post_init__(self):
    if not (self.when and self.claims and self.what and self.why):
      raise ValueError(f"a rule change names when, which claims, what and why, got {self!r}.")


# Oldest first, as ``rule_changes.toml`` lists them.
RULE_CHANGES: tuple[RuleChange, ...] = tuple(RuleChange(**c) for c in tables.load("rule_changes.toml")["changes"])


def revised_after_seen() -> frozenset[str]:
  """The claim ids named by a change made after its data had been seen (``data_seen``); a change of every
  claim (``"*"``) names none, so the verdict table marks only the rules changed claim by claim."""
  return frozenset(x for c in RULE_CHANGES if c.data_seen for x in c.claims if x != "*")


def markdown(commit: str | None = None) -> list[str]:
  """The report's "Rule changes" section: one table row per change, after the line naming the commit
  whose rules this report applies (``commit``, the run's git commit; None: not known)."""
  frozen = (f"This report's rules are those of its commit, git `{commit}`: the issue-31 rules (first frozen after "
            "the pilots on seeds 100-102 and the report at 87da7be had been seen) with every change in the table "
            "below up to that commit. " if commit else "")
  out = ["## Rule changes", "",
         frozen + "Every change of a verdict rule since the first committed `cpu` report, with whether the verdicts of "
         "the data it judges had been read when it changed. A rule changed after its data was seen is disclosed here, "
         "not hidden: read its verdict with that in mind.", "",
         "| when | claims | what changed | why | data seen? |", "|---|---|---|---|---|"]
  for c in RULE_CHANGES:
    claims = "every claim" if c.claims == ("*",) else ", ".join(f"`{x}`" for x in c.claims)
    out.append(f"| {c.when} | {claims} | {c.what} | {c.why} | {'yes' if c.data_seen else 'no'} |")
  out.append("")
  return out
