"""Issue 44 (goal 7): no text of the suite prints a negative zero ("-0.00"), on any CPU.

A flat slope or a zero difference comes out as -1e-17 on one CPU and +1e-17 on another; every float
format spec of the experiments' f-strings carries Python's ``z`` option (PEP 682: a value that rounds
to zero prints as zero), and the tests compare numbers (``tests/_text_numbers.py``), not texts.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from experiments.studies import depth_rules

ROOT = pathlib.Path(__file__).resolve().parents[2] / "experiments"
# The code whose texts become verdicts and reports (the benchmarks print timings, never a zero).
SCANNED = ("studies", "suite", "harness")
# A replacement field whose spec ends in a float type (f, g, e, %) with a precision, without "z".
_FLOAT_SPEC = re.compile(r":(?:[^{}\n]?[<>^=])?[+\- ]?0?\d*[,_]?\.\d+[fFgGeE%]\}")


def test_every_float_format_spec_normalizes_negative_zero():
  missing = [f"{p.relative_to(ROOT.parent)}:{i}: {line.strip()}"
             for sub in SCANNED for p in sorted((ROOT / sub).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if _FLOAT_SPEC.search(line)]
  assert not missing, ("float format specs without the 'z' option (a value that rounds to zero may print as "
                       "-0.00 on another CPU):\n" + "\n".join(missing[:20]))


@pytest.mark.parametrize("tiny", [-1e-17, 1e-17, -0.0])
def test_a_flat_slope_prints_as_zero_whatever_its_sign(monkeypatch, tiny):
  """The AVX2 failure: Pre-LN's flat update line has a slope of -1e-17 there, printed as "e = -0.00"."""
  import test_verdicts as tv
  real = depth_rules._exponent
  monkeypatch.setattr(depth_rules, "_exponent", lambda d, v: tiny if abs(real(d, v)) < 1e-9 else real(d, v))
  c = depth_rules.update_claim(tv._update(1.0, 0.0), tv.DCFG)
  assert "Pre-LN e = +0.00" in c["ours"] and "-0.00" not in c["ours"]
