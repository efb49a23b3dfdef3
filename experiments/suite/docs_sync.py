"""Keeps the verdicts named in ``docs/experiments.md`` equal to the committed report's.

The docs restate no verdict by hand: the block between
:data:`~experiments.suite.report.DOCS_BEGIN` and :data:`~experiments.suite.report.DOCS_END` is
rendered from a results folder by :func:`experiments.suite.report.docs_block`.
``python -m experiments.suite.docs_sync`` rewrites it from ``experiments/results/cpu`` and
``experiments/results/cpu-extra`` (the two commands' committed reports);
``--check`` exits with status 1 where the docs differ (``tests/experiments/test_docs_report.py`` runs the
same comparison).
"""

from __future__ import annotations

import argparse
import pathlib

from experiments.suite import report

__all__ = ["current_block", "main", "sync"]

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "experiments.md"
RESULTS = (REPO / "experiments" / "results" / "cpu", REPO / "experiments" / "results" / "cpu-extra")
_PLACEHOLDER = "BLOCK_PLACEHOLDER"


def current_block(text: str) -> str:
  """The generated block in the docs ``text`` (markers included).

  Raises:
    ValueError: ``text`` has no complete block (both markers, in order).
  """
  i, j = text.find(report.DOCS_BEGIN), text.find(report.DOCS_END)
  if i < 0 or j < i:
    raise ValueError("docs have no generated verdict block: expected the markers "
                     f"{report.DOCS_BEGIN!r} ... {report.DOCS_END!r} in order.")
  return text[i:j + len(report.DOCS_END)]


def sync(docs: str | pathlib.Path = DOCS, results=RESULTS, check: bool = False) -> bool:
  """Rewrites (or with ``check`` only compares) the docs' block from ``results`` (one folder or several).

  Returns:
    True if the docs already matched.
  """
  docs = pathlib.Path(docs)
  text = docs.read_text()
  new = report.docs_block(results)
  old = _PLACEHOLDER if _PLACEHOLDER in text else current_block(text)
  if old == new:
    return True
  if not check:
    docs.write_text(text.replace(old, new))
  return False


def main(argv: list[str] | None = None) -> int:
  """Command line: ``python -m experiments.suite.docs_sync [--check] [--docs PATH] [--results DIR]``."""
  ap = argparse.ArgumentParser(prog="python -m experiments.suite.docs_sync", description=__doc__.splitlines()[0])
  ap.add_argument("--check", action="store_true", help="only compare; exit 1 if the docs differ")
  ap.add_argument("--docs", default=str(DOCS))
  ap.add_argument("--results", action="append", default=None,
                  help="a committed results folder (repeatable; default: experiments/results/cpu and cpu-extra)")
  args = ap.parse_args(argv)
  same = sync(args.docs, args.results or RESULTS, check=args.check)
  print("docs match the report" if same else ("docs differ from the report" if args.check else "docs rewritten"))
  return 0 if same or not args.check else 1


if __name__ == "__main__":
  raise SystemExit(main())
