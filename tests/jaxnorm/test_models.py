"""Tests of jaxnorm.models: config checks, shapes, causality, init switches, jaxnorm vs Flax."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import nnx as jaxnorm_nnx
from jaxnorm.models import (NORM_POSITIONS, TransformerConfig, TransformerLM, block_weight_paths,
                            deepnorm_alpha_beta)

TINY = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=16)
# The norm family of jaxnorm.OPS: the ops with a layer in Flax as well (compared against it).
NORM_TYPES = tuple(name for name, op in jaxnorm.OPS.items() if op.family == "norm")


def _config(**kw):
  """A tiny config; unrolled layers (cheap eagerly) unless ``scan_layers=True`` is passed."""
  return TransformerConfig(**{**TINY, "norm_impl": "flax", "scan_layers": False, **kw})


def _build(cfg, seed=0):
  return TransformerLM(cfg, rngs=nnx.Rngs(seed))


def _tokens(b=2, t=12, seed=0):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, 256, dtype=jnp.int32)


def _n_norm_inputs(position, n_layers):
  return {"pre": 2 * n_layers + 1, "post": 2 * n_layers, "sandwich": 4 * n_layers + 1,
          "deepnorm": 2 * n_layers}[position]


@pytest.mark.parametrize("kw, match", [
    (dict(norm_position="middle"), "norm_position"),
    (dict(norm_type="batchnorm"), "norm_type"),
    (dict(norm_impl="torch"), "norm_impl"),
    (dict(init="he"), "init"),
    (dict(positions="sinusoidal"), "positions"),
    (dict(dtype="int8"), "dtype"),
    (dict(n_heads=3), "n_heads=3 must divide d_model=32"),
    (dict(d_model=12, n_heads=4, positions="rotary"), "even head size"),
    (dict(n_layers=0), "n_layers must be >= 1"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(activation="tanh"), "activation"),
    (dict(embed_scale=0.0), "embed_scale must be a finite float > 0"),
])
def test_config_rejects_bad_values(kw, match):
  with pytest.raises(ValueError, match=match):
    _config(**kw)


def test_config_rejects_bad_types():
  with pytest.raises(TypeError, match="d_model must be a Python int"):
    _config(d_model=32.0)
  with pytest.raises(TypeError, match="qk_zero_init must be a bool"):
    _config(qk_zero_init=1)
  with pytest.raises(ValueError, match=r"norm_type must be one of .* got 1"):
    _config(norm_type=1)
  with pytest.raises(TypeError, match="epsilon must be a real number"):
    _config(epsilon="1e-6")
  with pytest.raises(TypeError, match="config must be a TransformerConfig"):
    TransformerLM(dict(TINY), rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="embed_scale must be a Python float"):
    _config(embed_scale="1")


def test_theory_variant_options():
  """ReLU MLP, a scaled (unit-variance) input and the hidden state before the head."""
  tokens = _tokens(4, 16)
  base = _config(d_ff=32, qk_zero_init=True)
  relu = _config(d_ff=32, qk_zero_init=True, activation="relu")
  m_gelu, m_relu = _build(base), _build(relu)
  h = jnp.linspace(-2.0, 2.0, 32)[None, None, :]
  mlp = m_relu.block(0).mlp
  np.testing.assert_allclose(mlp(h), mlp.fc_out(jax.nn.relu(mlp.fc_in(h))), rtol=1e-6)
  assert not np.allclose(m_gelu.block(0).mlp(h), mlp(h))
  # Unit-variance input: E||h_0||^2/d = 2 s^2 at init; the first norm input of Pre-LN is h_0.
  big = TransformerConfig(d_model=256, n_layers=1, n_heads=4, d_ff=256, max_len=64,
                          norm_impl="flax", embed_scale=2 ** -0.5, scan_layers=False)
  _, stats = _build(big)(_tokens(8, 64), collect_stats=True)
  assert abs(float(stats["residual_sq_norm"][0]) - 1.0) < 0.15
  # The hidden state is the head's input.
  model = _build(_config(norm_position="pre"))
  hidden = model(tokens, return_hidden=True)
  assert hidden.shape == (4, 16, 32)
  np.testing.assert_allclose(model.head(hidden), model(tokens), rtol=1e-5, atol=1e-5)
  hidden2, stats = model(tokens, return_hidden=True, collect_stats=True)
  np.testing.assert_allclose(hidden2, hidden)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_shapes_and_stats(position, norm_type):
  cfg = _config(norm_position=position, norm_type=norm_type)
  model = _build(cfg, 0)
  logits, stats = model(_tokens(), collect_stats=True)
  assert logits.shape == (2, 12, 256) and logits.dtype == jnp.float32
  r = stats["residual_sq_norm"]
  assert r.shape == (_n_norm_inputs(position, cfg.n_layers),)
  assert np.all(np.isfinite(r)) and np.all(r > 0)
  # The first norm input is the embedding sum (pre/sandwich) or embedding + sub-layer output:
  # its statistic must equal E||x||^2/d computed by hand.
  if position in ("pre", "sandwich"):
    x = model.embed(_tokens()) + model.pos_embed[...][None, :12]
    np.testing.assert_allclose(r[0], jnp.mean(jnp.square(x)), rtol=1e-5)
  np.testing.assert_array_equal(model(_tokens()), logits)


@pytest.mark.parametrize("position, positions", [("pre", "learned"), ("post", "rotary"),
                                                 ("sandwich", "rotary"), ("deepnorm", "learned")])
def test_causal(position, positions):
  """Changing a future token does not change any logit at an earlier position."""
  model = _build(_config(norm_position=position, positions=positions), 1)
  fwd = model  # eager: the ops are shared with the other tests' compiled-op cache
  tokens = _tokens(t=12)
  k = 7
  changed = tokens.at[:, k].set((tokens[:, k] + 1) % 256)
  a, b = fwd(tokens), fwd(changed)
  np.testing.assert_array_equal(a[:, :k], b[:, :k])
  assert np.abs(np.asarray(a[:, k:] - b[:, k:])).max() > 1e-4  # and it does change later ones


def test_rotary_scores_depend_on_offsets_only():
  """RoPE: <rot(q, t), rot(k, s)> depends on t - s only; position 0 is the identity."""
  from jaxnorm.models._layers import _rotary
  dh, t = 8, 6
  q = jax.random.normal(jax.random.key(0), (dh,))
  k = jax.random.normal(jax.random.key(1), (dh,))
  rq = _rotary(jnp.broadcast_to(q, (1, t, 1, dh)))[0, :, 0]  # (T, Dh)
  rk = _rotary(jnp.broadcast_to(k, (1, t, 1, dh)))[0, :, 0]
  scores = np.asarray(rq @ rk.T)
  np.testing.assert_allclose(scores[1:, 1:], scores[:-1, :-1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(rq[0], q, rtol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q) * np.ones(t),
                             rtol=1e-5)
  assert np.abs(scores[0, 1] - scores[0, 0]) > 1e-4  # and it is not trivially constant
  model = _build(_config(positions="rotary"), 2)
  assert not hasattr(model, "pos_embed")


def test_tokens_validation():
  model = _build(_config(), 0)
  with pytest.raises(TypeError, match="tokens must be an integer array"):
    model(jnp.zeros((2, 4), jnp.float32))
  with pytest.raises(ValueError, match=r"shape \(batch, seq_len\), got shape \(4,\)"):
    model(jnp.zeros((4,), jnp.int32))
  with pytest.raises(ValueError, match="seq_len 17 > max_len 16"):
    model(jnp.zeros((1, 17), jnp.int32))


def test_deepnorm_alpha_beta():
  alpha, beta = deepnorm_alpha_beta(6)
  assert alpha == pytest.approx(12 ** 0.25) and beta == pytest.approx(48 ** -0.25)
  with pytest.raises(ValueError, match="n_layers"):
    deepnorm_alpha_beta(0)


def _kernel(model, *path):
  return np.asarray(nnx.to_pure_dict(nnx.state(model))["blocks"][path[0]][path[1]]["kernel"][0])


def test_xavier_and_qk_zero_init():
  cfg = _config(d_model=64, n_heads=4, d_ff=256)
  model = _build(cfg, 0)
  qkv = _kernel(model, "attn", "qkv")
  xavier_std = math.sqrt(2.0 / (64 + 64))
  for part in np.split(qkv, 3, axis=1):
    assert part.std() == pytest.approx(xavier_std, rel=0.1)
  assert _kernel(model, "mlp", "fc_in").std() == pytest.approx(math.sqrt(2 / 320), rel=0.1)
  assert np.asarray(model.embed.embedding[...]).std() == pytest.approx(1.0, rel=0.05)
  zero = _build(_config(d_model=64, n_heads=4, qk_zero_init=True), 0)
  q, k, v = np.split(_kernel(zero, "attn", "qkv"), 3, axis=1)
  assert not q.any() and not k.any() and v.std() == pytest.approx(xavier_std, rel=0.1)
  # W^Q = W^K = 0: every causal attention row is uniform over the visible prefix, so the
  # first block's attention output at position t is the mean of the values of 0..t.
  # Full float32 matmuls: a GPU's default (TF32) would differ from the closed form by ~1e-3.
  with jax.default_matmul_precision("highest"):
    x = jax.random.normal(jax.random.key(3), (1, 5, 64))
    attn = zero.block(0).attn
    vals = attn.qkv(x)[..., 128:]
    expected = attn.out(
        jnp.cumsum(vals, axis=1) / jnp.arange(1, 6, dtype=jnp.float32)[None, :, None])
    np.testing.assert_allclose(attn(x), expected, rtol=1e-5, atol=1e-5)


def test_small_init_and_deepnorm_beta():
  n = 2
  small = _build(_config(d_model=64, n_heads=4, d_ff=256, init="small"), 0)
  assert _kernel(small, "mlp", "fc_in").std() == pytest.approx(0.02, rel=0.1)
  assert _kernel(small, "mlp", "fc_out").std() == pytest.approx(0.02 / math.sqrt(2 * n), rel=0.1)
  assert _kernel(small, "attn", "out").std() == pytest.approx(0.02 / math.sqrt(2 * n), rel=0.1)
  assert np.asarray(small.embed.embedding[...]).std() == pytest.approx(0.02, rel=0.05)
  _, beta = deepnorm_alpha_beta(n)
  deep = _build(_config(d_model=64, n_heads=4, d_ff=256, norm_position="deepnorm"), 0)
  plain = _build(_config(d_model=64, n_heads=4, d_ff=256), 0)
  q_d, k_d, v_d = np.split(_kernel(deep, "attn", "qkv"), 3, axis=1)
  q_p, k_p, v_p = np.split(_kernel(plain, "attn", "qkv"), 3, axis=1)
  np.testing.assert_allclose(q_d, q_p, rtol=1e-6)  # W^Q, W^K: no beta
  np.testing.assert_allclose(k_d, k_p, rtol=1e-6)
  for got, ref in [(v_d, v_p), (_kernel(deep, "attn", "out"), _kernel(plain, "attn", "out")),
                   (_kernel(deep, "mlp", "fc_in"), _kernel(plain, "mlp", "fc_in")),
                   (_kernel(deep, "mlp", "fc_out"), _kernel(plain, "mlp", "fc_out"))]:
    np.testing.assert_allclose(got, beta * ref, rtol=1e-5, atol=1e-7)


def test_block_weight_paths_index_the_params():
  model = _build(_config(n_layers=3), 0)
  paths = block_weight_paths(model)
  assert sorted(paths) == ["attn_out", "attn_qkv", "mlp_in", "mlp_out"]
  params = nnx.to_pure_dict(nnx.state(model))
  shapes = {"attn_qkv": (32, 96), "attn_out": (32, 32), "mlp_in": (32, 64), "mlp_out": (64, 32)}
  for group, group_paths in paths.items():
    assert [p[-1] for p in group_paths] == [0, 1, 2]
    for p in group_paths:
      leaf = params
      for key in p:
        leaf = leaf[key]
      assert leaf.shape == shapes[group]
  with pytest.raises(TypeError, match="model must be a TransformerLM"):
    block_weight_paths(params)


def test_blocks_are_stacked_on_a_layer_axis():
  """Every block parameter has a leading (n_layers,) axis; block(i) is layer i alone."""
  model = _build(_config(n_layers=3, norm_position="sandwich"), 0)
  params = nnx.to_pure_dict(nnx.state(model))
  for leaf in jax.tree.leaves(params["blocks"]):
    assert leaf.shape[0] == 3
  one = nnx.to_pure_dict(nnx.state(model.block(2)))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b[2]), one, params["blocks"])
  # Each layer has its own draw (the blocks are initialized one after the other).
  assert not np.allclose(params["blocks"]["attn"]["qkv"]["kernel"][0],
                         params["blocks"]["attn"]["qkv"]["kernel"][1])
  with pytest.raises(ValueError, match=r"i must be in \[0, n_layers=3\), got 3"):
    model.block(3)
  with pytest.raises(TypeError, match="i must be a Python int"):
    model.block(1.0)
  with pytest.raises(TypeError, match="scan_layers must be a bool"):
    _config(scan_layers=1)


@pytest.mark.parametrize("position, norm_type, impl", [
    ("pre", "layer_norm", "jaxnorm"), ("sandwich", "rms_norm", "jaxnorm"),  # fused: carried add
    ("post", "rms_norm", "flax"), ("deepnorm", "layer_norm", "jaxnorm")])
def test_scan_matches_unrolled(position, norm_type, impl):
  """Scanned and unrolled layers: same parameters, same logits, stats and VJP (round-off).

  The other tests here run the unrolled loop eagerly (their op compilations are shared); this
  one ties the scan, the default, to it for every layout.
  """
  tokens = _tokens(t=10)
  dy = jax.random.normal(jax.random.key(5), (*tokens.shape, 256))
  results = {}
  for scan in (True, False):
    cfg = _config(norm_position=position, norm_type=norm_type, norm_impl=impl, n_layers=3,
                  scan_layers=scan)
    graphdef, state = nnx.split(_build(cfg, 4))
    params = nnx.to_pure_dict(state)

    def f(params, graphdef=graphdef):
      logits, stats = nnx.merge(graphdef, params)(tokens, collect_stats=True)
      return logits, stats["residual_sq_norm"]

    def value_and_vjp(params, f=f):
      (logits, stats), vjp = jax.vjp(f, params)
      return params, logits, stats, vjp((dy, jnp.linspace(0.5, 1.5, stats.shape[0])))[0]

    # The scan jitted: eagerly, every call of a scan compiles it again.
    results[scan] = (jax.jit(value_and_vjp) if scan else value_and_vjp)(params)
  (p_s, y_s, r_s, g_s), (p_u, y_u, r_u, g_u) = results[True], results[False]
  jax.tree.map(np.testing.assert_array_equal, p_s, p_u)
  np.testing.assert_allclose(y_s, y_u, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(r_s, r_u, rtol=1e-5)
  assert r_s.shape == (_n_norm_inputs(position, 3),)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g_s, g_u)
  g = g_s["blocks"]["mlp"]["fc_in"]["kernel"]
  assert all(float(jnp.abs(g[i]).max()) > 1e-4 for i in range(3))  # every layer has a gradient


@pytest.mark.parametrize("position", ["pre", "sandwich"])
def test_fused_scan_differentiates_its_body_once(monkeypatch, position):
  """The carried (fused) scan's first pending sub-layer output has a tangent that JAX does not
  treat as symbolically zero, so reverse mode linearizes the scanned body once (issue 62: with
  ``jnp.zeros_like`` it linearized it twice, and the cpu preset's step traced 1.5x Flax's):
  every add + norm forward rule runs once per call in the traced gradient. The pending zeros
  are exact zeros, in value, tangent and cotangent, even along a NaN tangent or cotangent."""
  from jaxnorm.backends import table
  from jaxnorm.models import _transformer

  calls = []
  add_forward = table.add_forward
  monkeypatch.setattr(table, "add_forward", lambda *a, **k: calls.append(1) or add_forward(*a, **k))
  cfg = _config(norm_position=position, norm_impl="jaxnorm", n_layers=3, scan_layers=True)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: _build(cfg)))
  tokens = _tokens()

  def loss(state):
    return jnp.mean(nnx.merge(graphdef, state)(tokens) ** 2)

  jax.make_jaxpr(jax.grad(loss))(state)
  # The scanned body's two fused adds + norms (traced once for every layer) and the final one.
  assert len(calls) == 3, len(calls)

  x = jnp.arange(6.0).reshape(2, 3)
  nan = jnp.full_like(x, jnp.nan)
  y, t = jax.jvp(_transformer._pending_zeros, (x,), (nan,))
  y_bar = jax.vjp(_transformer._pending_zeros, x)[1](nan)[0]
  for a in (y, t, y_bar):
    np.testing.assert_array_equal(a, jnp.zeros_like(x))


def test_fused_scan_differentiates_under_an_explicit_mesh():
  """The first pending output's tangent (``_pending_zeros``) takes a scalar predicate: a full-shape
  one has no sharding of its own, and ``grad`` through it fails under an explicitly sharded mesh."""
  from jax.sharding import AxisType, NamedSharding, PartitionSpec
  from jaxnorm.models import _transformer

  mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Explicit,),
                       devices=jax.devices()[:2])
  with jax.set_mesh(mesh):
    x = jax.device_put(jnp.arange(8.0).reshape(4, 2), NamedSharding(mesh, PartitionSpec("data")))
    g = jax.jit(jax.grad(lambda x: jnp.sum(2 * x + _transformer._pending_zeros(x))))(x)
  np.testing.assert_array_equal(g, jnp.full((4, 2), 2.0))


def test_scanned_program_does_not_grow_with_depth():
  """The traced forward+backward of a 2- and an 8-layer model have the same number of ops."""
  def n_eqns(n_layers):
    cfg = _config(n_layers=n_layers, norm_impl="jaxnorm", norm_position="pre", scan_layers=True)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: _build(cfg)))
    params = nnx.to_pure_dict(state)
    loss = lambda p: nnx.merge(graphdef, p)(_tokens(t=8)).mean()  # noqa: E731
    return len(jax.make_jaxpr(jax.grad(loss))(params).jaxpr.eqns)
  assert n_eqns(2) == n_eqns(8)


def test_norm_impl_selects_the_modules():
  model = _build(_config(norm_impl="jaxnorm", norm_type="rms_norm"), 0)
  assert isinstance(model.block(0).attn_norm, jaxnorm_nnx.RMSNorm)
  assert isinstance(model.final_norm, jaxnorm_nnx.RMSNorm)
  model = _build(_config(norm_impl="flax"), 0)
  assert type(model.block(1).mlp_norm) is nnx.LayerNorm


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("position", NORM_POSITIONS)
def test_jaxnorm_matches_flax_loss_and_grads(position, norm_type):
  """Same parameters, same loss; gradients of a random-cotangent VJP agree."""
  tokens = _tokens(t=10)
  results = {}
  for impl in ("jaxnorm", "flax"):
    model = _build(_config(norm_position=position, norm_type=norm_type, norm_impl=impl,
                           n_layers=1))
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)

    def f(params, graphdef=graphdef):
      return nnx.merge(graphdef, params)(tokens)

    dy = jax.random.normal(jax.random.key(7), (*tokens.shape, 256))

    logits, vjp = jax.vjp(f, params)  # eager: op compilations are shared between cases
    results[impl] = (logits, vjp(dy)[0])
  (y_j, g_j), (y_f, g_f) = results["jaxnorm"], results["flax"]
  np.testing.assert_allclose(y_j, y_f, rtol=1e-4, atol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4), g_j, g_f)
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_j)) > 1e-3


def test_bfloat16_compute():
  model = _build(_config(dtype="bfloat16", norm_impl="jaxnorm"), 0)
  logits = model(_tokens())
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))
  assert model.embed.embedding[...].dtype == jnp.float32  # parameters stay float32


def test_float64_without_x64_is_refused():
  from flax import nnx
  from jaxnorm.models import TransformerConfig, TransformerLM
  with pytest.raises(ValueError, match="dtype='float64' needs 64-bit mode"):
    TransformerLM(TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dtype="float64"),
                  rngs=nnx.Rngs(0))
