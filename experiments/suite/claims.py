"""The claims the suite tests: statement, source with the exact place, and the published number.

Each experiment's summary carries ``claims``: a list of ``{"id", "criterion", "ours", "holds"}``
(optionally ``"short"``, ``"per_seed"``) whose ``id`` is a key of :data:`CLAIMS`; the report joins
both into its final table "claim - source - published number - our number - holds?". The verdict
criteria are written in the experiment modules, next to the measurement, and are the same for
every preset.

Verdicts: ``"yes"``, ``"no"``, ``"partly"`` (some of the configurations agree), ``"not testable"``
(the preset's design cannot test the claim: a condition of :attr:`Claim.testable_when` does not
hold; the report prints "not testable at this scale" with the reason, never a bold no), ``"n/a"``
(nothing was measured that the rule could judge, e.g. no depth with both layouts in ``smoke``),
``"obs"`` (an observation without a published counterpart). Every rule can give each of yes /
partly / no / not testable on some input (``tests/experiments/test_verdicts.py`` feeds each one synthetic
results for each verdict); where one of them cannot occur the criterion says why.

**Testability before verdicts.** Every claim states, in :attr:`Claim.testable_when`, the
conditions under which a preset's design can test it; they were written before the run whose
report uses them (issue 24) and each rule checks them before it judges anything. Every claim also
has a :attr:`Claim.kind`: ``"training"`` for a claim about how models behave (at init, in
training, in time) and ``"check"`` for a check of this implementation (a formula compared with
itself, an identity at eps = 0, the derived backward against autodiff); the report tallies the
two apart.

How the published numbers were checked (issue 17): a claim is ``checked=True`` only where the
number was read in a text found in this project, and ``checked_in`` names that text. Read here:
the abstracts of Zhang & Sennrich (arXiv:1910.07467: "reduces the running time by 7%~64%",
RMSNorm and pRMSNorm together) and of Xiong et al. (arXiv:2002.04745, the qualitative claims);
the invariance table of Zhang & Sennrich as reproduced in the authors' repository README
(github.com/bzhangGo/rmsnorm); the seed notes in ``shared/seeds`` (000: gradient derivation and
invariance, Sec. 3.1-3.3; 001: LayerNorm -> RMSNorm, Sec. 2 "about 10%-40%"). The papers' full
texts were not reachable here; the exact places and numbers of ``claims.toml`` that come from
them (Xiong et al.'s lemmas, figures and BLEU scores, Zhang & Sennrich's 6.9%-40.8% for full
RMSNorm) are the ones the issue-17 reviewer checked against the full texts, and stay
``checked=False``.
"""

from __future__ import annotations

import dataclasses

from experiments.suite import tables

__all__ = ["CLAIMS", "Claim", "KINDS", "NOT_TESTABLE", "VERDICTS", "not_testable", "seeds_agree", "verdict"]

NOT_TESTABLE = "not testable"
VERDICTS = ("yes", "no", "partly", NOT_TESTABLE, "n/a", "obs")
KINDS = ("training", "check")


def not_testable(reasons: list[str]) -> tuple[str, str]:
  """``("not testable", text)`` naming the conditions of the design that do not hold.

  Raises:
    ValueError: ``reasons`` is empty (a claim is untestable for a stated reason or not at all).
  """
  if not reasons:
    raise ValueError("not_testable needs at least one reason, got an empty list.")
  return NOT_TESTABLE, "not testable at this scale: " + "; ".join(reasons)


def verdict(oks) -> str:
  r"""``"yes"`` if every configuration agrees, ``"partly"`` if some do, else ``"no"``.

  .. math:: v = \text{yes if } \forall i\, ok_i;\ \text{partly if } \exists i\, ok_i;\ \text{no otherwise}

  An empty ``oks`` gives ``"yes"`` (as ``all([])``); callers for whom no judged configuration
  means "no" say so.
  """
  oks = list(oks)
  return "yes" if all(oks) else ("partly" if any(oks) else "no")


def seeds_agree(pooled: str, per_seed: list[str]) -> str:
  """A training claim's verdict given what every seed alone would give.

  ``"yes"`` needs the seeds to agree: a pooled ``"yes"`` with any seed alone not ``"yes"`` becomes
  ``"partly"``; other verdicts are kept.
  """
  if pooled == "yes" and any(v != "yes" for v in per_seed):
    return "partly"
  return pooled


@dataclasses.dataclass(frozen=True)
class Claim:
  """One published (or source-note) claim.

  Attributes:
    experiment: the experiment that measures it.
    statement: the claim in one sentence.
    source: paper (authors, year) and the exact figure/table/section/lemma it comes from.
    published: the published number or qualitative result.
    checked: whether the published number was read in a text found in this project.
    checked_in: that text (required when ``checked``); the report prints it beside the source.
    testable_when: the conditions under which a preset's design can test the claim, stated
      before anything runs; a rule that finds one of them unmet says ``"not testable"``.
    kind: ``"training"`` (a claim about models: at init, in training, in time) or ``"check"``
      (a check of this implementation); the report's tally keeps them apart.
  """

  experiment: str
  statement: str
  source: str
  published: str
  checked: bool = False
  checked_in: str = ""
  testable_when: str = ""
  kind: str = "training"

  def __post_init__(self):
    if not self.testable_when:
      raise ValueError(f"every claim states when the design can test it (testable_when), got {self!r}.")
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}.")
    if self.checked and not self.checked_in:
      raise ValueError(f"a checked claim must say where it was checked (checked_in), got {self!r}.")


# The claims in the report's order; their text is data, in ``claims.toml`` next to this module
# (:mod:`experiments.suite.tables`), and every entry is checked by :class:`Claim`.
CLAIMS: dict[str, Claim] = {cid: Claim(**fields) for cid, fields in tables.load("claims.toml")["claims"].items()}
