"""The ``residual=`` keyword of the NNX and Linen layers, and the model's fused add+norm switch.

``layer(x, residual=r)`` must equal ``h = x + r; layer(h)`` in value and in every gradient
(random cotangents on both outputs), for any reduction/feature axes; the Transformer with
``fuse_residual_norm`` on and off must train along the same loss curve.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm.models import NORM_POSITIONS, NORM_TYPES, TransformerConfig, TransformerLM
from _numerics import assert_close, random


def _inputs(shape, x_dtype=jnp.float32, r_dtype=jnp.float32, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  return (random(ks[0], shape, x_dtype), random(ks[1], shape, r_dtype, loc=1.0),
          random(ks[2], shape, jnp.float32), random(ks[3], shape, jnp.float32))


# (layer kwargs, x shape, residual_scale, x dtype, residual dtype)
NNX_CASES = [
    (dict(), (3, 4, 16), 1.0, jnp.float32, jnp.float32),
    (dict(reduction_axes=(1, 2), feature_axes=-1), (3, 4, 16), 1.5, jnp.float32, jnp.float32),
    (dict(reduction_axes=1, feature_axes=1), (3, 16, 4), 1.0, jnp.float32, jnp.float32),
    (dict(epsilon_placement="outside", zero_centered_scale=True), (5, 16), 0.8, jnp.bfloat16,
     jnp.float32),
]


@pytest.mark.parametrize("cls", [jnn.LayerNorm, jnn.RMSNorm], ids=["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("case", NNX_CASES, ids=lambda c: str(c[0]) + f"-{c[2]}")
def test_nnx_residual_equals_add_then_layer(cls, case):
  kw, shape, alpha, xd, rd = case
  feat_axes = kw.get("feature_axes", -1)
  n_features = shape[feat_axes]
  layer = cls(n_features, rngs=nnx.Rngs(0), **kw)
  x, r, dy, dh = _inputs(shape, xd, rd)
  graphdef, params = nnx.split(layer)

  def fused(params, x, r):
    return nnx.merge(graphdef, params)(x, residual=r, residual_scale=alpha)

  def unfused(params, x, r):
    h = x + alpha * r
    return nnx.merge(graphdef, params)(h), h

  (y, h), pull = jax.vjp(fused, params, x, r)
  (y_ref, h_ref), pull_ref = jax.vjp(unfused, params, x, r)
  assert y.dtype == y_ref.dtype and h.dtype == h_ref.dtype == jnp.promote_types(xd, rd)
  tol = 2e-2 if xd == jnp.bfloat16 else 2e-5
  assert_close(h, h_ref, tol=tol, what="h")
  assert_close(y, y_ref, tol=tol, what="y")
  cts = (dy.astype(y.dtype), dh.astype(h.dtype))
  for g, g_ref in zip(jax.tree.leaves(pull(cts)), jax.tree.leaves(pull_ref(cts))):
    assert g.dtype == g_ref.dtype and g.shape == g_ref.shape
    assert_close(g, g_ref, tol=tol, floor=1.0, what="grad")


@pytest.mark.parametrize("cls", [jln.LayerNorm, jln.RMSNorm], ids=["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("kw", [dict(), dict(reduction_axes=(1, 2), feature_axes=-1)],
                         ids=["default", "non-trailing-features"])
def test_linen_residual_equals_add_then_layer(cls, kw):
  x, r, dy, dh = _inputs((3, 4, 16))
  layer = cls(**kw)
  variables = layer.init(jax.random.key(0), x)
  # init through the fused call creates the same parameters
  v2 = layer.init(jax.random.key(0), x, residual=r)
  jax.tree.map(np.testing.assert_array_equal, variables, v2)

  def fused(v, x, r):
    return layer.apply(v, x, residual=r, residual_scale=2.0)

  def unfused(v, x, r):
    h = x + 2.0 * r
    return layer.apply(v, h), h

  out, pull = jax.vjp(fused, variables, x, r)
  out_ref, pull_ref = jax.vjp(unfused, variables, x, r)
  for a, e in zip(out, out_ref):
    assert_close(a, e, jnp.float32)
  for g, g_ref in zip(jax.tree.leaves(pull((dy, dh))), jax.tree.leaves(pull_ref((dy, dh)))):
    assert_close(g, g_ref, jnp.float32, floor=1.0)


def test_module_residual_errors():
  layer = jnn.LayerNorm(16, rngs=nnx.Rngs(0))
  x = jnp.ones((2, 16))
  with pytest.raises(ValueError, match=r"residual must have the shape of x \(2, 16\)"):
    layer(x, residual=jnp.ones((1, 16)))
  with pytest.raises(TypeError, match="residual must have a floating dtype"):
    layer(x, residual=jnp.ones((2, 16), jnp.int32))
  with pytest.raises(ValueError, match="pass residual= as well"):
    layer(x, residual_scale=2.0)
  with pytest.raises(ValueError, match="pass residual= as well"):
    jln.RMSNorm().init(jax.random.key(0), x, residual_scale=2.0)
  # Without residual nothing changes: one array comes back.
  assert isinstance(layer(x), jax.Array)


# --------------------------------------------------------------------------- the model switch

TINY = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=16)


def _train_losses(cfg, steps=4):
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tx = optax.adam(3e-3)
  opt = tx.init(params)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 256, dtype=jnp.int32)

  def loss_fn(params):
    logits = nnx.merge(graphdef, params)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def step(params, opt):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  losses = []
  for _ in range(steps):
    params, opt, loss = step(params, opt)
    losses.append(float(loss))
  return np.array(losses)


# Every position with LayerNorm, and every other norm type at a position of its own (a Latin
# square's diagonal): each position's residual wiring and each norm family's add (the fused
# add+norm op for the norms, XLA's add before an elementwise op for DyT/Derf) are both covered,
# in 7 of the 16 combinations (each costs two train-step compiles).
_FUSE_CASES = ([(p, "layer_norm") for p in NORM_POSITIONS]
               + [(NORM_POSITIONS[i], t) for i, t in enumerate(NORM_TYPES) if t != "layer_norm"])


@pytest.mark.parametrize("position, norm_type", _FUSE_CASES)
def test_fused_and_unfused_models_train_alike(position, norm_type):
  """Loss curves with and without the fused add+norm agree to float32 rounding."""
  cfgs = [TransformerConfig(**TINY, norm_position=position, norm_type=norm_type,
                            norm_impl="jaxnorm", fuse_residual_norm=f) for f in (True, False)]
  fused, unfused = (_train_losses(c) for c in cfgs)
  assert fused[-1] < fused[0]  # it trains
  np.testing.assert_allclose(fused, unfused, rtol=1e-5)


@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_fused_model_uses_the_fused_op_and_same_stats(position):
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, 256, dtype=jnp.int32)
  outs = []
  for f in (True, False):
    model = TransformerLM(TransformerConfig(**TINY, norm_position=position,
                                            fuse_residual_norm=f), rngs=nnx.Rngs(0))
    text = str(jax.make_jaxpr(lambda t, model=model: model(t))(tokens))
    # the fused custom VJP (_add_norm) appears only when fusing
    assert ("_add_norm" in text) == f, position
    outs.append(model(tokens, collect_stats=True))
  (l1, s1), (l2, s2) = outs
  np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s1["residual_sq_norm"], s2["residual_sq_norm"], rtol=1e-5)
  with pytest.raises(TypeError, match="fuse_residual_norm must be a bool"):
    TransformerConfig(**TINY, fuse_residual_norm=1)
