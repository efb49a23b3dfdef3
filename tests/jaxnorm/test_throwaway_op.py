"""A pointwise op of its own module (``tests/_softsign_op.py``), added with one
``jaxnorm.ops.table.register`` call and nothing else, runs everywhere the library's ops run: its
public name, the NNX and Linen layers built from its entry (``nnx.split``/``merge``, pickling,
``init``/``apply``), the model's ``norm_type`` and ``qk_norm`` (one training step), the testing
kit's battery, the tail check and the pointwise benchmark. The registration is undone after the
module."""

import json
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import _softsign_op
from _pointwise_tails import failures
import jaxnorm
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm.models import TransformerConfig, TransformerLM
from jaxnorm.ops import table
from jaxnorm.testing import TRANSFORMS, Tolerance, check_rule

OP = _softsign_op.OP
X = 1.5 * jax.random.normal(jax.random.key(0), (3, 2, 8))


@pytest.fixture(scope="module", autouse=True)
def registered():
  table.register(OP)
  yield
  table.unregister(OP.name)
  assert OP.name not in jaxnorm.OPS


def test_it_is_an_op_of_the_library():
  assert jaxnorm.OPS["softsign"] is OP
  assert jaxnorm.softsign is OP.fn and jaxnorm.softsign_jacobian is OP.jacobian
  assert "softsign" in table.layer_replacements() and "softsign" in table.names("pointwise")
  assert jnn.Softsign.__module__ == "jaxnorm.nnx" and jln.Softsign.__module__ == "jaxnorm.linen"
  assert "jaxnorm.softsign" in jnn.Softsign.__doc__ and "Softsign" in dir(jnn)
  diag = jaxnorm.softsign_jacobian(X, jnp.asarray(0.7), jnp.linspace(0.5, 1.5, 8))
  full = jax.jacfwd(lambda x: OP.reference(x, jnp.asarray(0.7), jnp.linspace(0.5, 1.5, 8)))(X)
  np.testing.assert_allclose(np.asarray(diag).reshape(-1),
                             np.diag(np.asarray(full).reshape(X.size, X.size)), rtol=1e-6)


def test_the_kits_battery():
  """Values, VJPs, JVPs, the adjoint identity, under every transform of the kit, in float32."""
  params = (jnp.asarray(0.7), 1.0 + 0.3 * jax.random.normal(jax.random.key(1), (8,)),
            0.1 * jax.random.normal(jax.random.key(2), (8,)))
  check_rule(OP.fn, OP.reference, (X,) + params, transforms=TRANSFORMS,
             tolerance=Tolerance(ulps=6.0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_its_tails(dtype):
  """The tail check of every op of the table (tests/jaxnorm/test_pointwise_tails.py), run on
  the registered op: derivatives far out and at the dtype's limits against its oracle's."""
  bad = failures(OP, dtype)
  assert not bad, "\n".join(bad[:24])


def test_the_nnx_layer_splits_merges_and_pickles():
  layer = jnn.Softsign(8, alpha_init_value=0.8, rngs=nnx.Rngs(0))
  assert isinstance(layer, jnn.Softsign) and layer.shift is None
  params = (layer.alpha[...], layer.scale[...], layer.bias[...])
  np.testing.assert_allclose(layer(X), OP.reference(X, *params), rtol=1e-6)
  graphdef, state = nnx.split(layer)
  np.testing.assert_array_equal(nnx.merge(graphdef, state)(X), layer(X))
  grads = nnx.grad(lambda m: jnp.sum(m(X) ** 2))(layer)
  want = jax.grad(lambda p: jnp.sum(OP.reference(X, *p) ** 2))(params)
  for g, w in zip((grads.alpha[...], grads.scale[...], grads.bias[...]), want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(pickle.loads(pickle.dumps(layer))(X), layer(X))
  y, h = layer(X, residual=X, residual_scale=0.5)
  np.testing.assert_allclose(y, layer(1.5 * X), rtol=1e-6)


def test_the_linen_layer_inits_applies_and_pickles():
  module = jln.Softsign(feature_axes=(-2, -1))
  variables = module.init(jax.random.key(1), X)
  assert {k: v.shape for k, v in variables["params"].items()} == {
      "alpha": (), "scale": (2, 8), "bias": (2, 8)}
  nnx_layer = jnn.Softsign(16, feature_axes=(-2, -1), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(module.apply(variables, X), nnx_layer(X), rtol=1e-6)
  again = pickle.loads(pickle.dumps(module))
  assert again == module
  np.testing.assert_array_equal(again.apply(variables, X), module.apply(variables, X))


def test_the_models_norm_type_trains_one_step():
  cfg = TransformerConfig(vocab_size=32, max_len=8, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                          norm_type="softsign", qk_norm="softsign", pointwise_alpha=(1.0, 0.5))
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  assert any(isinstance(m, jnn.Softsign) for _, m in nnx.iter_graph(model))
  tokens = jnp.arange(16).reshape(2, 8) % 32

  def loss(m):
    logits = m(tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

  before, grads = nnx.value_and_grad(loss)(model)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(nnx.state(grads)))
  _, state = nnx.split(model)
  gstate = nnx.state(grads)
  nnx.update(model, jax.tree.map(lambda p, g: p - 0.05 * g, state, gstate))
  assert float(loss(model)) < float(before)


def test_the_pointwise_benchmark(tmp_path):
  from experiments.bench import pointwise as bench

  assert bench.pointwise_ops()[-1] == "softsign"  # registered ops come after the library's
  assert bench.main(["--shapes", "8x16", "--dtypes", "float32", "--ops", "softsign", "--repeats",
                     "3", "--sample-ms", "0.2", "--out", str(tmp_path), "--tag", "t"]) == 0
  (row,) = json.loads(next(tmp_path.glob("pointwise-t-*.json")).read_text())["rows"]
  assert row["op"] == "softsign" and row["median_s"]["jaxnorm fwd"] > 0
