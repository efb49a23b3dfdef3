"""``axis_name``: the feature axis split over a mesh axis inside ``shard_map`` gives the same
outputs and gradients as the unsharded op (8 host CPU devices, set in conftest)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jaxnorm
from _numerics import assert_close, random

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (host) devices")


def _data(d=32, lead=(6,), seed=0, loc=0.5):
  ks = jax.random.split(jax.random.key(seed), 5)
  return (random(ks[0], lead + (d,), jnp.float32, loc=loc),
          random(ks[1], (d,), jnp.float32, loc=1.0, scale=0.3),
          random(ks[2], (d,), jnp.float32),
          random(ks[3], lead + (d,), jnp.float32),
          jax.random.bernoulli(ks[4], 0.7, lead + (d,)).at[..., 0].set(True))


CASES = [
    ("layer_norm", dict()),
    ("layer_norm", dict(epsilon_placement="outside", zero_centered_scale=True)),
    ("rms_norm", dict()),
    ("rms_norm", dict(epsilon_placement="outside")),
]


def _op(name, kw):
  if name == "layer_norm":
    return lambda x, s, b, m, **extra: jaxnorm.layer_norm(x, s, b, mask=m, **kw, **extra)
  return lambda x, s, b, m, **extra: jaxnorm.rms_norm(x, s, mask=m, **kw, **extra)


@pytest.mark.parametrize("name,kw", CASES)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_feature_sharded_matches_unsharded(name, kw, masked):
  mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
  x, s, b, dy, mask = _data(loc=100.0 if name == "layer_norm" else 0.5)
  m = mask if masked else None
  op = _op(name, kw)

  def sharded(x, s, b, m):
    f = jax.shard_map(lambda x, s, b, m: op(x, s, b, m, axis_name="model"), mesh=mesh,
                      in_specs=(P(None, "model"), P("model"), P("model"),
                                None if m is None else P(None, "model")),
                      out_specs=P(None, "model"))
    return f(x, s, b, m)

  def vjp(f):
    return jax.jit(lambda x, s, b: (lambda y, pull: (y, pull(dy)))(*jax.vjp(
        lambda x, s, b: f(x, s, b, m), x, s, b)))

  y, grads = vjp(sharded)(x, s, b)
  y_ref, grads_ref = vjp(op)(x, s, b)
  assert_close(y, y_ref, jnp.float32, what="y")
  for n_, g, g_ref in zip(["dx", "dscale", "dbias"], grads, grads_ref):
    assert_close(g, g_ref, jnp.float32, what=n_)


def test_data_and_model_mesh():
  """A (data, model) mesh: batch split over "data", features over "model"."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
  x, s, b, dy, _ = _data(lead=(4, 3))

  def sharded(x, s, b):
    return jax.shard_map(
        lambda x, s, b: jaxnorm.layer_norm(x, s, b, axis_name="model"), mesh=mesh,
        in_specs=(P("data", None, "model"), P("model"), P("model")),
        out_specs=P("data", None, "model"))(x, s, b)

  plain = lambda x, s, b: jaxnorm.layer_norm(x, s, b)
  got = jax.jit(lambda x, s, b: jax.vjp(sharded, x, s, b)[1](dy))(x, s, b)
  want = jax.vjp(plain, x, s, b)[1](dy)
  for g, w in zip(got, want):
    assert_close(g, w, jnp.float32)


def test_axis_index_groups():
  """Two independent groups of two devices each normalize their own half of the features."""
  mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
  x, s, b, dy, _ = _data(d=16)
  groups = [[0, 1], [2, 3]]

  def sharded(x):
    return jax.shard_map(
        lambda x: jaxnorm.rms_norm(x, axis_name="model", axis_index_groups=groups), mesh=mesh,
        in_specs=P(None, "model"), out_specs=P(None, "model"), check_vma=False)(x)

  y = jax.jit(sharded)(x)
  want = jnp.concatenate([jaxnorm.rms_norm(x[:, :8]), jaxnorm.rms_norm(x[:, 8:])], -1)
  assert_close(y, want, jnp.float32)


def test_mesh_and_vmap_axis_in_one_name_behave_as_flax():
  """``axis_name`` naming a shard_map mesh axis and a vmap axis together: a psum JAX does not
  batch at the versions tested (jax 0.10: a ValueError on the operands' varying axes; 0.8.1: a
  TypeError). jaxnorm raises JAX's own error on the psum, as Flax's LayerNorm does on the same
  program, not a bare AssertionError from a psum of the constant element count. Should a JAX
  batch it, the two must agree in value instead."""
  from flax import linen as nn

  mesh = Mesh(np.array(jax.devices()[:2]), ("model",))
  x = jax.device_put(random(jax.random.key(0), (3, 4, 16), jnp.float32),
                     jax.sharding.NamedSharding(mesh, P(None, None, "model")))

  def run(norm):
    per_row = jax.vmap(norm, axis_name="rows")
    return jax.jit(jax.shard_map(per_row, mesh=mesh, in_specs=P(None, None, "model"),
                                 out_specs=P(None, None, "model")))(x)

  flax_ln = nn.LayerNorm(axis_name=("model", "rows"), use_scale=False, use_bias=False)
  ours = lambda r: jaxnorm.layer_norm(r, axis_name=("model", "rows"))  # noqa: E731
  try:
    want = run(lambda r: flax_ln.apply({}, r))
  except Exception as flax_error:  # noqa: BLE001  (whatever JAX raises, jaxnorm must match)
    assert not isinstance(flax_error, AssertionError)
    with pytest.raises(type(flax_error), match="psum"):
      run(ours)
    assert "psum" in str(flax_error)
  else:
    assert_close(run(ours), want, jnp.float32)
