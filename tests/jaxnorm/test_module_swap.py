"""Swapping Flax's norm layers for jaxnorm's in existing models changes only the gradient path.

The same model code is built twice, once with ``flax.nnx``/``flax.linen`` norm layers and once
with ``jaxnorm.nnx``/``jaxnorm.linen`` ones (the only difference is the module the layers come
from), for a Dense -> norm -> Dense network and a 2-block pre-norm Transformer. The losses and
all parameter gradients must agree, and a checkpoint written from the Flax-norm model (orbax
``StandardCheckpointer`` and a plain state dict) must restore into the jaxnorm model and give
the same outputs.
"""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from flax import serialization

from jaxnorm import linen as jln
from jaxnorm import nnx as jnn

NNX_LIBS = {"flax": nnx, "jaxnorm": jnn}
LINEN_LIBS = {"flax": nn, "jaxnorm": jln}
D, HEADS, SEQ, BATCH, VOCAB = 16, 2, 8, 2, 11


def _data():
  x = jax.random.normal(jax.random.key(1), (BATCH, SEQ, D)) + 0.5
  target = jax.random.normal(jax.random.key(2), (BATCH, SEQ, D))
  tokens = jax.random.randint(jax.random.key(3), (BATCH, SEQ), 0, VOCAB)
  return x, target, tokens


def _assert_trees_close(a, b, rtol=2e-5, atol=2e-5):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert u.shape == w.shape and u.dtype == w.dtype
    np.testing.assert_allclose(u, w, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- NNX models


class NnxMLP(nnx.Module):
  """Dense -> norm -> Dense; ``lib`` is the module the norm layer comes from."""

  def __init__(self, lib: types.ModuleType, kind: str, *, rngs: nnx.Rngs):
    self.inp = nnx.Linear(D, 2 * D, rngs=rngs)
    self.norm = getattr(lib, kind)(2 * D, rngs=rngs)
    self.out = nnx.Linear(2 * D, D, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.gelu(self.norm(self.inp(x))))


class NnxBlock(nnx.Module):
  def __init__(self, lib: types.ModuleType, *, rngs: nnx.Rngs):
    self.ln_1 = lib.LayerNorm(D, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(HEADS, D, decode=False, rngs=rngs)
    self.ln_2 = lib.RMSNorm(D, epsilon=1e-5, rngs=rngs)
    self.mlp = nnx.Sequential(nnx.Linear(D, 4 * D, rngs=rngs), jax.nn.gelu,
                              nnx.Linear(4 * D, D, rngs=rngs))

  def __call__(self, x, mask):
    x = x + self.attn(self.ln_1(x), mask=mask)
    return x + self.mlp(self.ln_2(x))


class NnxTransformer(nnx.Module):
  """Two pre-norm blocks and a final norm over token embeddings."""

  def __init__(self, lib: types.ModuleType, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
    self.blocks = nnx.List([NnxBlock(lib, rngs=rngs) for _ in range(2)])
    self.ln_f = lib.LayerNorm(D, rngs=rngs)
    self.head = nnx.Linear(D, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    mask = nnx.make_causal_mask(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.ln_f(x))


def _nnx_models(make):
  """The same architecture with Flax's norms and with jaxnorm's, from the same seed."""
  return {k: make(lib, rngs=nnx.Rngs(0)) for k, lib in NNX_LIBS.items()}


def _nnx_loss_and_grads(model, loss_fn, *args):
  return nnx.jit(nnx.value_and_grad(loss_fn))(model, *args)


def _mlp_loss(model, x, target):
  return jnp.mean((model(x) - target) ** 2)


def _perturb_norms(model):
  """Moves every norm parameter off its (1, 0) initialization so that they matter."""
  state = nnx.state(model, nnx.Param)
  flat = dict(nnx.to_flat_state(state))
  key, n = jax.random.key(9), 0
  for path, var in flat.items():
    if path[-1] in ("scale", "bias") and any(("norm" in str(p) or "ln" in str(p)) for p in path):
      key, sub = jax.random.split(key)
      var.set_value(var.get_value() + 0.3 * jax.random.normal(sub, var.get_value().shape))
      n += 1
  assert n > 0
  nnx.update(model, state)


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_nnx_mlp_swap_same_init_loss_and_grads(kind):
  x, target, _ = _data()
  models = _nnx_models(lambda lib, rngs: NnxMLP(lib, kind, rngs=rngs))
  # The same seed gives the same parameters: the norm draws its keys as Flax's does, so the
  # layers built after it are initialized identically too.
  _assert_trees_close(nnx.state(models["jaxnorm"]), nnx.state(models["flax"]), 0, 0)
  _perturb_norms(models["flax"])
  nnx.update(models["jaxnorm"], nnx.state(models["flax"]))
  (l1, g1) = _nnx_loss_and_grads(models["flax"], _mlp_loss, x, target)
  (l2, g2) = _nnx_loss_and_grads(models["jaxnorm"], _mlp_loss, x, target)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  _assert_trees_close(g2, g1)


def _lm_loss_and_logits(model, tokens):
  logits = model(tokens)
  targets = jnp.roll(tokens, -1, axis=1)
  loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))
  return loss, logits


def _abstract_jaxnorm_transformer():
  return nnx.split(nnx.eval_shape(lambda: NnxTransformer(jnn, rngs=nnx.Rngs(1))))


def test_nnx_transformer_swap_same_loss_grads_and_checkpoint(tmp_path):
  _, _, tokens = _data()
  # Built under nnx.jit: one compiled program instead of one per initializer op.
  flax_model = nnx.jit(lambda: NnxTransformer(nnx, rngs=nnx.Rngs(0)))()
  _perturb_norms(flax_model)
  s_flax = nnx.state(flax_model)
  graphdef, abstract_state = _abstract_jaxnorm_transformer()
  # Same state structure, shapes and dtypes: the norms hold the same variables.
  assert jax.tree.structure(s_flax) == jax.tree.structure(abstract_state)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), s_flax) == \
      jax.tree.map(lambda a: (a.shape, a.dtype), abstract_state)

  # 1. An orbax checkpoint written from the Flax-norm model restores into the jaxnorm model.
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "flax_norms", s_flax)
  ckpt.wait_until_finished()
  restored = nnx.merge(graphdef, ckpt.restore(tmp_path / "flax_norms", abstract_state))
  ckpt.close()
  assert isinstance(restored.ln_f, jnn.LayerNorm)
  assert isinstance(restored.blocks[0].ln_2, jnn.RMSNorm)

  # 2. So does a plain (pure) state dict, to the same values.
  graphdef2, state2 = _abstract_jaxnorm_transformer()
  nnx.replace_by_pure_dict(state2, nnx.to_pure_dict(s_flax))
  from_dict = nnx.merge(graphdef2, state2)
  _assert_trees_close(nnx.state(from_dict), nnx.state(restored), 0, 0)

  # 3. The same outputs, loss and gradients for every parameter.
  (l1, logits1), g1 = nnx.jit(nnx.value_and_grad(_lm_loss_and_logits, has_aux=True))(
      flax_model, tokens)
  (l2, logits2), g2 = nnx.jit(nnx.value_and_grad(_lm_loss_and_logits, has_aux=True))(
      restored, tokens)
  np.testing.assert_allclose(logits2, logits1, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  _assert_trees_close(g2, g1, rtol=1e-4, atol=2e-5)


# --------------------------------------------------------------------------- Linen models


class LinenMLP(nn.Module):
  lib: types.ModuleType
  kind: str

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(2 * D)(x)
    h = getattr(self.lib, self.kind)()(h)
    return nn.Dense(D)(nn.gelu(h))


class LinenBlock(nn.Module):
  lib: types.ModuleType

  @nn.compact
  def __call__(self, x, mask):
    x = x + nn.MultiHeadDotProductAttention(HEADS)(self.lib.LayerNorm()(x), mask=mask)
    h = self.lib.RMSNorm(epsilon=1e-5)(x)
    return x + nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(h)))


class LinenTransformer(nn.Module):
  lib: types.ModuleType

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D)(tokens)
    mask = nn.make_causal_mask(tokens)
    for _ in range(2):
      x = LinenBlock(self.lib)(x, mask)
    return nn.Dense(VOCAB)(self.lib.LayerNorm()(x))


def _perturb_linen(params):
  flat = {k: v for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  key, n = jax.random.key(9), 0
  out = {}
  for path, leaf in flat.items():
    names = [getattr(p, "key", "") for p in path]
    if names[-1] in ("scale", "bias") and any("Norm" in n for n in names):
      key, sub = jax.random.split(key)
      leaf = leaf + 0.3 * jax.random.normal(sub, leaf.shape)
      n += 1
    out[path] = leaf
  assert n > 0
  treedef = jax.tree.structure(params)
  return jax.tree.unflatten(treedef, [out[p] for p, _ in jax.tree_util.tree_flatten_with_path(
      params)[0]])


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_linen_mlp_swap_same_loss_and_grads(kind):
  x, target, _ = _data()
  flax_model, ours = LinenMLP(nn, kind), LinenMLP(jln, kind)
  v = _perturb_linen(flax_model.init(jax.random.key(0), x))
  v_ours = ours.init(jax.random.key(0), x)
  assert jax.tree.structure(v) == jax.tree.structure(v_ours)

  def loss(model):
    return jax.jit(jax.value_and_grad(
        lambda v: jnp.mean((model.apply(v, x) - target) ** 2)))

  l1, g1 = loss(flax_model)(v)
  l2, g2 = loss(ours)(v)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  _assert_trees_close(g2, g1)


def test_linen_transformer_swap_same_loss_grads_and_checkpoint(tmp_path):
  _, _, tokens = _data()
  flax_model, ours = LinenTransformer(nn), LinenTransformer(jln)
  # Initialized under jax.jit: one compiled program instead of one per initializer op. Same
  # param tree and the same initial values from the same key.
  v0 = jax.jit(flax_model.init)(jax.random.key(0), tokens)
  _assert_trees_close(jax.jit(ours.init)(jax.random.key(0), tokens), v0, 0, 0)
  v = _perturb_linen(v0)

  # 1. An orbax checkpoint of the Flax-norm variables restores for the jaxnorm model.
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "flax_norms", v)
  ckpt.wait_until_finished()
  abstract = jax.eval_shape(ours.init, jax.random.key(1), tokens)
  restored = ckpt.restore(tmp_path / "flax_norms", abstract)
  ckpt.close()

  # 2. So does a plain state dict through flax.serialization (msgpack bytes), to the same values.
  loaded = serialization.from_bytes(abstract, serialization.to_bytes(v))
  _assert_trees_close(loaded, restored, 0, 0)

  # 3. The same outputs, loss and gradients.
  def loss_and_grads(model):
    def f(v):
      logits = model.apply(v, tokens)
      targets = jnp.roll(tokens, -1, axis=1)
      loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))
      return loss, logits
    return jax.jit(jax.value_and_grad(f, has_aux=True))

  (l1, logits1), g1 = loss_and_grads(flax_model)(v)
  (l2, logits2), g2 = loss_and_grads(ours)(restored)
  np.testing.assert_allclose(logits2, logits1, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  _assert_trees_close(g2, g1, rtol=1e-4, atol=2e-5)
