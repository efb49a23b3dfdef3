"""experiments.bench.ln_forms: its forms compute LayerNorm, the offset form is the exact one, and the
command writes its files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bench import ln_forms


def _reference(x, g, b):
  x = np.asarray(x, np.float64)
  xc = x - x.mean(-1, keepdims=True)
  return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-6) * np.asarray(g) + np.asarray(b)


def test_the_forms_are_layer_norm_and_only_the_offset_forms_keep_a_large_mean():
  g, b = jnp.full((64,), 1.1), jnp.full((64,), 0.1)
  for mean, exact in ((3.0, ln_forms.FORMS), (1e4, ("offset", "first_pivot"))):
    x = jax.random.normal(jax.random.key(1), (32, 64)) + mean
    ref = _reference(x, g, b)
    errors = {k: float(np.abs(np.asarray(f(x, g, b)) - ref).max()) for k, f in ln_forms.FORMS.items()}
    for k in ln_forms.FORMS:
      assert (errors[k] < 2e-5) == (k in exact), (mean, errors)


def test_the_libraries_entries_are_layer_norm_with_their_variances():
  """At mean 3 all three are LayerNorm; at mean 1e4 the variance each uses shows: Flax's fast one
  cancels, its two-pass loses the mean's rounding, jaxnorm's offset keeps float32's accuracy."""
  g, b = jnp.full((64,), 1.1), jnp.full((64,), 0.1)
  built = ln_forms.library_ops()
  ops = {"fast": built["flax_op"], "two_pass": built["flax_op_two_pass"],
         "offset": built["jaxnorm_op"]}
  for mean, bounds in ((3.0, dict(fast=(0, 2e-5), two_pass=(0, 2e-5), offset=(0, 2e-5))),
                       (1e4, dict(fast=(1.0, np.inf), two_pass=(1e-4, 1e-2), offset=(0, 1e-5)))):
    x = jax.random.normal(jax.random.key(2), (32, 64)) + mean
    ref = _reference(x, g, b)
    for k, f in ops.items():
      err = float(np.abs(np.asarray(f(x, g, b)) - ref).max())
      assert bounds[k][0] <= err < bounds[k][1], (mean, k, err)


def test_the_command_writes_its_table(tmp_path):
  assert ln_forms.main(["--shapes", "8x16", "--repeats", "1", "--sample-ms", "1",
                        "--out", str(tmp_path), "--tag", "t"]) == 0
  (js,) = tmp_path.glob("ln-forms-t-*.json")
  rows = json.loads(js.read_text())["rows"]
  assert {r["form"] for r in rows} == set(ln_forms.FORMS) | {"flax", "jaxnorm"} | set(ln_forms.OPS)
  assert set(ln_forms.OPS) == {"flax_op", "flax_op_two_pass", "jaxnorm_op"}
  assert "| 8x16 | offset |" in js.with_suffix(".md").read_text()


def test_a_bad_shape_is_refused():
  with pytest.raises(SystemExit):
    ln_forms.main(["--shapes", "8-16"])
