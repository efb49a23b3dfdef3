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


def test_rows_do_not_depend_on_the_worker_processes():
  names = ["jax.nn.relu", "jnp.tanh"]
  alone = ks.run_rows(names, examples=2, max_checks=2, jobs=1)
  spread = ks.run_rows(names, examples=2, max_checks=2, jobs=2)
  strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
  assert [r["function"] for r in spread] == names
  assert strip(alone) == strip(spread)


def test_a_row_draws_its_shapes_from_the_pool():
  from hypothesis import given, settings

  fn = [f for f in ks.surveyed_functions() if f.name == "jax.nn.softmax"][0]
  seen = set()

  @settings(max_examples=20, derandomize=True, database=None, deadline=None)
  @given(ks._strategy(fn, "float32"))
  def draw(args):
    seen.add(tuple(args[0].shape))

  draw()
  assert seen <= set(ks.ROW_SHAPES) and len(seen) >= 2, seen
