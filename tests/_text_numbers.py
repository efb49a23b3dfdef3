"""Numbers read back from a rule's text, so that tests compare numbers, not their formatting.

A flat slope or a zero difference may come out as ``-1e-17`` on one CPU and ``+1e-17`` on another
(AVX2 vs AVX-512 kernels of OpenBLAS/XLA order a reduction differently), which prints as ``-0.00``
or ``+0.00``; a test that compares the text fails on one of them. :func:`number_after` parses the
number that follows a label and :func:`numbers` every number of a text; compare them with
``pytest.approx`` (``-0.0 == 0.0``).
"""

from __future__ import annotations

import re

__all__ = ["number_after", "numbers"]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?%?"


def _value(token: str) -> float:
  return float(token[:-1]) / 100 if token.endswith("%") else float(token)


def numbers(text: str) -> list[float]:
  """Every number in ``text``, in order (a percentage as a fraction)."""
  return [_value(t) for t in re.findall(_NUMBER, text)]


def number_after(text: str, label: str, occurrence: int = 0) -> float:
  """The number right after the ``occurrence``-th ``label`` in ``text`` (spaces allowed between).

  Raises:
    AssertionError: the label, or a number after it, is not there (the text is shown).
  """
  hits = [m.end() for m in re.finditer(re.escape(label), text)]
  assert len(hits) > occurrence, f"{label!r} not found {occurrence + 1} time(s) in {text!r}"
  m = re.match(r"\s*(" + _NUMBER + ")", text[hits[occurrence]:])
  assert m, f"no number after {label!r} in {text!r}"
  return _value(m.group(1))
