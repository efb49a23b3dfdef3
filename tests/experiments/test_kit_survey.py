"""experiments.kit_survey's machinery on two cheap functions (the survey itself is not a test)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from experiments import kit_survey as ks


def test_a_row_per_function_and_dtype_and_the_files(tmp_path):
  good = ks.Fn("relu", "A", jax.nn.relu, lambda x: jnp.maximum(x, 0.0))
  bad = ks.Fn("sin as cos", "B", jnp.sin, jnp.cos)  # wrong everywhere: rejected
  rows = ks.survey_one(good, examples=1, max_checks=1) + ks.survey_one(bad, examples=1, max_checks=1)
  assert [r["verdict"] for r in rows] == ["accepted", "rejected"], rows
  assert rows[1]["check"] == "value" and rows[1]["input"].startswith("  args[0]: float32")
  ks.write(rows, tmp_path, {"date": "today", "jax": jax.__version__, "packages": "-", "examples": 1,
                            "max_checks": 1})
  data = json.loads((tmp_path / "survey.json").read_text())
  assert len(data["rows"]) == 2 and "| sin as cos | B | float32 | rejected | value |" in (
      tmp_path / "survey.md").read_text()


def test_bad_options_are_refused():
  with pytest.raises(SystemExit):
    ks.main(["--examples", "0"])
  with pytest.raises(SystemExit):
    ks.main(["--only", "no-such-function"])
