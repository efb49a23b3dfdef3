"""experiments.bench.prepare_share: it times prepare inside real traces and puts the op back afterwards."""

from __future__ import annotations

import pytest

from experiments.bench import prepare_share
from jaxnorm.ops.norm import args as norm_args


def test_measures_a_share_and_restores_prepare():
  before = norm_args.prepare
  r = prepare_share.measure("rms_norm", rounds=2, shape=(2, 8))
  assert norm_args.prepare is before
  assert r["trace_ms"] > 0 and r["prepare_ms"] > 0 and 0 < r["share"] < 1


def test_bad_rounds_is_refused():
  with pytest.raises(SystemExit):
    prepare_share.main(["--rounds", "0"])
