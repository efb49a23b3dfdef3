"""The command lines' numeric option types (``argparse`` ``type=``): one home for every command.

Each parses its text and requires a finite value in range, so that ``nan``, ``inf`` and negative
numbers are refused by the parser (exit status 2, the option named) instead of running a command
that cannot do what was asked (a budget of ``nan`` minutes, ``-1`` repeats).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

__all__ = ["epsilon", "nonneg_float", "nonneg_int", "number", "positive_float", "positive_int"]


def number(cast, lower: float, strict: bool, what: str, upper: float | None = None):
  """An argparse ``type=`` that parses with ``cast`` and requires a finite value above ``lower``
  (``> lower`` when ``strict``, else ``>=``) and, where given, at most ``upper``, with an error
  that says what was expected (argparse prefixes the flag as given: ``argument --epsilon: ...``)."""

  def parse(text: str):
    try:
      value = cast(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    ok = math.isfinite(value) and (value > lower if strict else value >= lower)
    if not ok:
      raise argparse.ArgumentTypeError(
          f"expected {what} ({'>' if strict else '>='} {lower:g}), got {text}")
    if upper is not None and value > upper:
      raise argparse.ArgumentTypeError(f"expected {what} (<= {upper:.3g}), got {text}")
    return value

  return parse


positive_int = number(int, 0, True, "a positive integer")
nonneg_int = number(int, 0, False, "a non-negative integer")
positive_float = number(float, 0, True, "a positive number")
nonneg_float = number(float, 0, False, "a non-negative number")

# A norm epsilon: >= 0 and within the float32 statistics' range, the bound the library itself
# checks (jaxnorm._validation.check_epsilon_range), refused here under the flag's own name.
epsilon = number(float, 0, False, "a non-negative epsilon within float32's statistics",
                 upper=0.5 / float(np.finfo(np.float32).tiny))
