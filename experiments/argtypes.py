"""The command lines' option types (``argparse`` ``type=``): one home for every command.

Each parses its text and requires a finite value in range, so that ``nan``, ``inf`` and negative
numbers are refused by the parser (exit status 2, the option named) instead of running a command
that cannot do what was asked (a budget of ``nan`` minutes, ``-1`` repeats). The list types
(:func:`positive_ints`, :func:`float_pair`) hold such numbers, comma-separated; :func:`folder`
refuses an output folder that a file stands in the way of, before anything runs.
"""

from __future__ import annotations

import argparse
import math
import pathlib

import numpy as np

__all__ = ["epsilon", "float_pair", "folder", "nonneg_float", "nonneg_int", "number",
           "positive_float", "positive_int", "positive_ints"]


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


def positive_ints(text: str) -> tuple[int, ...]:
  """Comma-separated positive integers (``"64,128"``) as a non-empty tuple."""
  items = [t.strip() for t in text.split(",")]
  if not all(items):
    raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
  return tuple(positive_int(t) for t in items)


def float_pair(text: str) -> tuple[float, float]:
  """Two comma-separated finite numbers (``"0.8,0.2"``) as a pair of floats."""
  try:
    values = tuple(float(t) for t in text.split(","))
  except ValueError:
    values = ()
  if len(values) != 2 or not all(math.isfinite(a) for a in values):
    raise argparse.ArgumentTypeError(f"expected two comma-separated finite numbers, got {text!r}")
  return values


def folder(text: str) -> str:
  """An output folder: ``text`` unchanged where it is a folder or can be made one (the nearest
  existing path at or above it is a folder); refused where a file stands there."""
  if not text:
    raise argparse.ArgumentTypeError("expected a folder path, got ''")
  path = pathlib.Path(text)
  for p in (path, *path.parents):
    if p.exists():
      if not p.is_dir():
        where = "" if p == path else f", above the folder {text!r}"
        raise argparse.ArgumentTypeError(f"expected a folder, but {str(p)!r} is a file{where}")
      break
  return text
