"""The per-head norm benchmark: both libraries compute the same layer; the CLI writes its report."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bench import qk


@pytest.mark.parametrize("kind", qk.KINDS)
def test_both_libraries_compute_the_same_per_head_norm(kind):
  x = jax.random.normal(jax.random.key(0), (6, 4, 8))
  dy = jax.random.normal(jax.random.key(1), x.shape)
  out = {}
  for impl in qk.IMPLS:
    f, params = qk.norm_function(impl, kind, 4, 8, "float32")
    assert params["scale"].shape == (32,)
    y, vjp = jax.vjp(f, params, x)
    out[impl] = (y, *vjp(dy))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), out["jaxnorm"], out["flax"])
  # The scale is per head: heads differ (the benchmark's parameters are not all ones).
  assert not bool(jnp.allclose(out["flax"][0][:, 0], out["flax"][0][:, 1]))


def test_cli_writes_json_and_markdown(tmp_path, capsys):
  argv = ["--tokens", "4", "--heads", "2", "--head-dims", "8", "--kinds", "rms_norm", "--repeats", "3",
          "--sample-ms", "1", "--out", str(tmp_path), "--tag", "test"]
  assert qk.main(argv) == 0
  (js,) = tmp_path.glob("qk-test-*.json")
  report = json.loads(js.read_text())
  assert [r["mode"] for r in report["results"]] == ["fwd", "fwd+bwd"]
  assert all(r["jaxnorm_us"] > 0 and r["flax_us"] > 0 for r in report["results"])
  assert "| rms_norm | 4 | 2 | 8 | fwd |" in js.with_suffix(".md").read_text()
  with pytest.raises(SystemExit):
    qk.main(["--kinds", "batch_norm"])
