"""The docs name the committed report's verdicts only through the generated block (issue 24).

``docs/experiments.md`` once restated verdicts by hand and contradicted the committed report
(9/6/3 against 9/7/1/1). Its verdict block is generated from ``experiments/results/cpu``; these
tests fail when it differs, and when a verdict word is written by hand outside the block.
"""

from __future__ import annotations

import re

import pytest

from experiments.suite import docs_sync, report


def test_docs_block_matches_the_committed_report():
  text = docs_sync.DOCS.read_text()
  assert docs_sync.current_block(text) == report.docs_block(docs_sync.RESULTS), (
      "docs/experiments.md disagrees with experiments/results/cpu{,-extra}: "
      "run `python -m experiments.suite.docs_sync`.")


@pytest.mark.parametrize("doc", ["experiments.md", "training.md"])
def test_no_verdict_restated_outside_the_block(doc):
  text = (docs_sync.REPO / "docs" / doc).read_text()
  if report.DOCS_BEGIN in text:
    text = text.replace(docs_sync.current_block(text), "")
  # a bold verdict or a tally ("9 claims hold", "yes: 9") written by hand
  assert not re.search(r"\*\*(yes|no|partly)\*\*", text), doc
  assert not re.search(r"\b\d+ claims? (hold|do not)|\b(yes|partly|no): \d+\b", text), doc


def test_sync_rewrites_and_check_reports(tmp_path):
  docs = tmp_path / "e.md"
  docs.write_text("intro\n\n" + report.DOCS_BEGIN + "\nstale\n" + report.DOCS_END + "\n\nend\n")
  assert not docs_sync.sync(docs, docs_sync.RESULTS, check=True)
  assert "stale" in docs.read_text()
  assert docs_sync.main(["--check", "--docs", str(docs)]) == 1
  assert not docs_sync.sync(docs, docs_sync.RESULTS)
  assert docs_sync.sync(docs, docs_sync.RESULTS, check=True) and docs.read_text().startswith("intro")
  with pytest.raises(ValueError, match="no generated verdict block"):
    docs_sync.current_block("no markers")
