"""The model's QK-norm, LayerNorm Scaling and attention statistics (issue 25).

QK-norm: parameter shapes (per-head and shared), that the model normalizes q and k per head
before the rotary embedding (checked against attention written out by hand), the logit bound it
implies, jaxnorm vs Flax, scan vs unrolled. LayerNorm Scaling: one block against the formula.
Attention statistics: uniform attention (``qk_zero_init``) against its closed form.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm.models import TransformerConfig, TransformerLM

TINY = dict(d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16)


def _config(**kw):
  return TransformerConfig(**{**TINY, "scan_layers": False, **kw})


def _tokens(b=2, t=12, seed=0):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, 256, dtype=jnp.int32)


@pytest.mark.parametrize("kw, match", [
    (dict(qk_norm="l2"), "qk_norm must be one of"),
    (dict(qk_norm="rms_norm", qk_norm_scale="per_layer"), "qk_norm_scale must be one of"),
    (dict(norm_scaling=True, norm_position="post"), "norm_scaling=True .* 'pre' or 'sandwich'"),
    (dict(norm_scaling=True, norm_position="deepnorm"), "got 'deepnorm'"),
])
def test_config_rejects_bad_values(kw, match):
  with pytest.raises(ValueError, match=match):
    _config(**kw)


def test_config_rejects_bad_types():
  with pytest.raises(ValueError, match="qk_norm must be one of"):  # one rule for every choice
    _config(qk_norm=None)
  with pytest.raises(TypeError, match="norm_scaling must be a bool"):
    _config(norm_scaling=1)


@pytest.mark.parametrize("impl", ["jaxnorm", "flax"])
@pytest.mark.parametrize("qk_norm, scale, shape", [
    ("rms_norm", "per_head", (3, 4 * 8)), ("rms_norm", "shared", (3, 8)),
    ("layer_norm", "per_head", (3, 4 * 8)), ("layer_norm", "shared", (3, 8))])
def test_qk_norm_parameter_shapes(impl, qk_norm, scale, shape):
  """Stacked over the layers: per-head (L, H * Dh) in Flax's spelling, shared (L, Dh)."""
  cfg = _config(n_layers=3, norm_impl=impl, qk_norm=qk_norm, qk_norm_scale=scale)
  model = nnx.eval_shape(lambda: TransformerLM(cfg, rngs=nnx.Rngs(0)))
  for name in ("q_norm", "k_norm"):
    norm = getattr(model.blocks.attn, name)
    assert norm.scale.shape == shape
    if qk_norm == "layer_norm":
      assert norm.bias.shape == shape
    else:
      assert not hasattr(norm, "bias") or norm.bias is None


def test_no_qk_norm_has_no_parameters():
  model = TransformerLM(_config(), rngs=nnx.Rngs(0))
  assert not hasattr(model.blocks.attn, "q_norm")
  assert not hasattr(model.blocks.attn, "k_norm")


def _lead(a, ndim):
  """``a`` with leading unit axes up to ``ndim`` (the tests run with rank promotion off)."""
  return a.reshape((1,) * (ndim - a.ndim) + a.shape)


def _attention_by_hand(attn, x, qk_norm, eps, rotary):
  """Causal attention of ``attn`` on ``x`` with per-head q/k norms written out (no modules)."""
  b, t, d = x.shape
  h, dh = attn.n_heads, attn.head_dim
  qkv = (x @ attn.qkv.kernel[...] + _lead(attn.qkv.bias[...], 3)).reshape(b, t, 3, h, dh)
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

  def norm(z, module):
    if qk_norm == "layer_norm":
      z = z - z.mean(-1, keepdims=True)
    z = z / jnp.sqrt(jnp.mean(jnp.square(z), -1, keepdims=True) + eps)
    scale = module.scale[...]
    out = z * _lead(scale.reshape(h, dh) if scale.shape[-1] == h * dh else scale, 4)
    if qk_norm == "layer_norm":
      bias = module.bias[...]
      out = out + _lead(bias.reshape(h, dh) if bias.shape[-1] == h * dh else bias, 4)
    return out, z

  q, q_hat = norm(q, attn.q_norm)
  k, _ = norm(k, attn.k_norm)
  if rotary:
    half = dh // 2
    inv = 10000.0 ** (-np.arange(half) * 2.0 / dh)
    th = np.arange(t)[:, None] * inv[None]
    cos, sin = np.cos(th)[None, :, None], np.sin(th)[None, :, None]   # (1, T, 1, Dh/2)
    rot = lambda z: jnp.concatenate([z[..., :half] * cos - z[..., half:] * sin,  # noqa: E731
                                     z[..., half:] * cos + z[..., :half] * sin], -1)
    q, k = rot(q), rot(k)
  s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(dh)
  s = jnp.where(np.tril(np.ones((t, t), bool))[None, None], s, -jnp.inf)
  y = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1), v).reshape(b, t, d)
  return y @ attn.out.kernel[...] + _lead(attn.out.bias[...], 3), q_hat


@pytest.mark.parametrize("impl", ["jaxnorm", "flax"])
@pytest.mark.parametrize("qk_norm, scale, positions", [
    ("rms_norm", "per_head", "rotary"), ("layer_norm", "shared", "rotary"),
    ("rms_norm", "shared", "learned"), ("layer_norm", "per_head", "learned")])
def test_attention_normalizes_q_and_k_per_head_before_rotary(impl, qk_norm, scale, positions):
  """The model's attention equals attention with q, k normalized over Dh (by hand), then RoPE.

  The learned scales and biases are randomized first (one value per head and feature, or per
  feature), so a scale applied to the wrong axis, or rotary before the norm, would show.
  """
  cfg = _config(qk_norm=qk_norm, qk_norm_scale=scale, positions=positions, norm_impl=impl)
  attn = TransformerLM(cfg, rngs=nnx.Rngs(1)).block(0).attn
  for i, name in enumerate(("q_norm", "k_norm")):
    module = getattr(attn, name)
    key = jax.random.key(10 + i)
    module.scale[...] = 1.0 + 0.5 * jax.random.normal(key, module.scale.shape)
    if qk_norm == "layer_norm":
      module.bias[...] = 0.3 * jax.random.normal(jax.random.fold_in(key, 1), module.bias.shape)
  x = 3.0 * jax.random.normal(jax.random.key(2), (2, 10, cfg.d_model))
  want, q_hat = _attention_by_hand(attn, x, qk_norm, cfg.epsilon, positions == "rotary")
  np.testing.assert_allclose(attn(x), want, rtol=2e-4, atol=2e-5)
  # Before its scale, every normalized query row (one head, one position) has unit RMS.
  np.testing.assert_allclose(jnp.sqrt(jnp.mean(jnp.square(q_hat), -1)), 1.0, rtol=1e-4)


def test_qk_norm_bounds_the_attention_logits():
  r"""With RMS QK-norm and unit scales, :math:`|q\cdot k|/\sqrt{D_h} \le \sqrt{D_h}`, however large W^Q, W^K.

  Without it the largest logit grows as the square of the projection scale.
  """
  tokens = _tokens(t=16)
  logits = {}
  for qk_norm in ("none", "rms_norm"):
    model = TransformerLM(_config(qk_norm=qk_norm, positions="rotary"), rngs=nnx.Rngs(0))
    kernel = model.blocks.attn.qkv.kernel                       # (L, d, 3d)
    d = model.config.d_model
    kernel[...] = kernel[...].at[..., :2 * d].multiply(30.0)   # W^Q and W^K only
    logits[qk_norm] = model(tokens, collect_stats=True)[1]["attn_max_logit"]
  dh = TINY["d_model"] // TINY["n_heads"]
  assert np.all(np.asarray(logits["rms_norm"]) <= math.sqrt(dh) * (1 + 1e-5))
  assert np.all(np.asarray(logits["none"]) > 10 * math.sqrt(dh))


def test_qk_norm_jaxnorm_matches_flax():
  """The norm_impl switch covers the QK norms: same parameters, same logits."""
  out = {}
  for impl in ("jaxnorm", "flax"):
    cfg = _config(qk_norm="layer_norm", qk_norm_scale="per_head", norm_impl=impl,
                  positions="rotary")
    out[impl] = TransformerLM(cfg, rngs=nnx.Rngs(3))(_tokens())
  np.testing.assert_allclose(out["jaxnorm"], out["flax"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position, fused", [("pre", True), ("sandwich", False)])
def test_scan_matches_unrolled_with_qk_norm_and_norm_scaling(position, fused):
  """The scan carries each layer's 1/sqrt(l) in its xs: the same values as the Python loop."""
  tokens = _tokens(t=10)
  out = {}
  for scan in (True, False):
    cfg = _config(n_layers=3, norm_position=position, qk_norm="rms_norm", norm_scaling=True,
                  norm_impl="jaxnorm", fuse_residual_norm=fused, scan_layers=scan)
    graphdef, state = nnx.split(TransformerLM(cfg, rngs=nnx.Rngs(4)))
    f = lambda p, g=graphdef: nnx.merge(g, p)(tokens, collect_stats=True)  # noqa: E731
    out[scan] = (jax.jit(f) if scan else f)(nnx.to_pure_dict(state))
  np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-5, atol=1e-5)
  for key in ("residual_sq_norm", "attn_max_logit", "attn_entropy"):
    np.testing.assert_allclose(out[True][1][key], out[False][1][key], rtol=1e-5, err_msg=key)
  assert out[True][1]["attn_max_logit"].shape == (3,)


@pytest.mark.parametrize("fused", [True, False])
def test_norm_scaling_block_formula(fused):
  r"""Pre-LN block with LayerNorm Scaling: x + A(s N(x)), then h + M(s N'(h)), s = 1/sqrt(l)."""
  cfg = _config(norm_impl="jaxnorm", fuse_residual_norm=fused)
  block = TransformerLM(cfg, rngs=nnx.Rngs(5)).block(1)
  x = jax.random.normal(jax.random.key(6), (2, 8, cfg.d_model))
  s = 1.0 / math.sqrt(2.0)
  h = x + block.attn(s * block.attn_norm(x))
  want = h + block.mlp(s * block.mlp_norm(h))
  np.testing.assert_allclose(block(x, norm_scale=s), want, rtol=1e-5, atol=1e-5)


def test_norm_scaling_changes_only_layers_after_the_first():
  """1/sqrt(1) = 1: a one-layer model is unchanged; a two-layer one is not."""
  tokens = _tokens()
  for n_layers, same in ((1, True), (2, False)):
    a, b = (TransformerLM(_config(n_layers=n_layers, norm_scaling=ns), rngs=nnx.Rngs(0))(tokens)
            for ns in (False, True))
    assert bool(jnp.array_equal(a, b)) is same


def test_attention_stats_of_uniform_attention():
  """W^Q = W^K = 0: every logit is 0 and row t attends uniformly to t + 1 keys.

  So the largest logit is 0 and the mean entropy is mean_t log(t + 1), in every layer.
  """
  t = 12
  model = TransformerLM(_config(qk_zero_init=True, n_layers=3), rngs=nnx.Rngs(0))
  _, stats = model(_tokens(t=t), collect_stats=True)
  np.testing.assert_allclose(stats["attn_max_logit"], 0.0, atol=1e-6)
  want = np.mean(np.log(np.arange(1, t + 1)))
  np.testing.assert_allclose(stats["attn_entropy"], want, rtol=1e-5)
