"""The command lines' numeric option types (``argparse`` ``type=``): one home for every command.

Each parses its text and requires a finite value in range, so that ``nan``, ``inf`` and negative
numbers are refused by the parser (exit status 2, the option named) instead of running a command
that cannot do what was asked (a budget of ``nan`` minutes, ``-1`` repeats).
"""

from __future__ import annotations

import argparse
import math

__all__ = ["nonneg_float", "nonneg_int", "number", "positive_float", "positive_int"]


def number(cast, lower: float, strict: bool, what: str):
  """An argparse ``type=`` that parses with ``cast`` and requires a finite value above ``lower``
  (``> lower`` when ``strict``, else ``>=``), with an error that says what was expected."""

  def parse(text: str):
    try:
      value = cast(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    ok = math.isfinite(value) and (value > lower if strict else value >= lower)
    if not ok:
      raise argparse.ArgumentTypeError(
          f"expected {what} ({'>' if strict else '>='} {lower:g}), got {text}")
    return value

  return parse


positive_int = number(int, 0, True, "a positive integer")
nonneg_int = number(int, 0, False, "a non-negative integer")
positive_float = number(float, 0, True, "a positive number")
nonneg_float = number(float, 0, False, "a non-negative number")
