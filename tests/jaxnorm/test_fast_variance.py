"""``use_fast_variance=True``: Flax's ``E[x^2] - E[x]^2`` in the LayerNorm op family and layers.

The forward is checked against a float64 reference at moderate mean/std ratios and against
Flax's fast form; the documented loss (about ``2 log2(mean/std)`` bits of the variance, every
digit at ``1e4`` in float32) against the default's accuracy on the same data; the derived
backward and tangent against autodiff of the same fast formula; the layers' flag (default
False) and the argument checks.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn

EPS = 1e-6


def _reference(x64, eps=EPS):
  """Exact LayerNorm (no affine) of float32 data, in float64."""
  x64 = np.asarray(x64, np.float64)
  mean = x64.mean(-1, keepdims=True)
  return (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + eps)


def _fast_formula(x, scale=None, bias=None, mask=None, eps=EPS):
  """Flax's fast form, written out (what autodiff differentiates)."""
  xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  mean = jnp.mean(xf, -1, keepdims=True, where=mask)
  mean2 = jnp.mean(xf * xf, -1, keepdims=True, where=mask)
  var = jnp.maximum(mean2 - mean * mean, 0.0)
  y = (xf - mean) * jax.lax.rsqrt(var + eps)
  if scale is not None:
    y = y * scale[None]
  if bias is not None:
    y = y + bias[None]
  return y.astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("ratio", [0.0, 3.0, 30.0])
def test_matches_float64_reference_at_moderate_mean(dtype, ratio):
  x = (ratio + jax.random.normal(jax.random.key(0), (16, 512))).astype(dtype)
  want = _reference(np.asarray(x.astype(jnp.float32)))
  got = np.asarray(jaxnorm.layer_norm(x, use_fast_variance=True).astype(jnp.float32))
  # float32: the fast variance loses about 2 log2(1 + ratio) bits; bfloat16: the output rounds.
  tol = 2.0**-7 if dtype == "bfloat16" else 8 * 2.0**-24 * (1 + ratio**2) * np.abs(want).max()
  np.testing.assert_allclose(got, want, atol=max(tol, 1e-6), rtol=0)


@pytest.mark.parametrize("shape", [(16, 64), (4096, 8)])  # fewer / more rows than YNNPACK takes whole
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_equals_flax_fast_variance(shape, dtype):
  ks = jax.random.split(jax.random.key(1), 3)
  x = (3.0 + jax.random.normal(ks[0], shape)).astype(dtype)
  s = 1.0 + 0.1 * jax.random.normal(ks[1], shape[-1:])
  b = 0.1 * jax.random.normal(ks[2], shape[-1:])
  flax = nn.LayerNorm(epsilon=EPS, dtype=x.dtype)  # Flax's default: use_fast_variance=True
  want = jax.jit(lambda x, s, b: flax.apply({"params": {"scale": s, "bias": b}}, x))(x, s, b)
  got = jax.jit(lambda x, s, b: jaxnorm.layer_norm(x, s, b, epsilon=EPS,
                                                   use_fast_variance=True))(x, s, b)
  tol = 2.0**-7 if dtype == "bfloat16" else 1e-6
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             atol=tol, rtol=tol)


def test_documented_loss_at_large_mean():
  """At mean/std 1e2 and 1e3 the fast variance keeps ``24 - 2 log2(ratio)`` bits (within the
  factor 8 of the rounding of the sums); at 1e4 nothing is left, while the default (shifted-data)
  variance is exact to float32 rounding on the same data."""
  noise = jax.random.normal(jax.random.key(2), (16, 1024), jnp.float32)
  for ratio in (1e2, 1e3, 1e4):
    x = ratio + noise
    want = _reference(np.asarray(x))
    err_fast = np.abs(np.asarray(jaxnorm.layer_norm(x, use_fast_variance=True), np.float64)
                      - want).max()
    err_default = np.abs(np.asarray(jaxnorm.layer_norm(x), np.float64) - want).max()
    assert err_default < 1e-5 * np.abs(want).max(), (ratio, err_default)
    if ratio < 1e4:
      assert err_fast < 8 * 2.0**-24 * ratio**2 * np.abs(want).max(), (ratio, err_fast)
      assert err_fast > 10 * err_default, (ratio, err_fast, err_default)
    else:  # every digit of the variance lost: the rows are no longer standardized
      assert err_fast > 0.1, err_fast
    # The same numbers as Flax's default.
    flax = nn.LayerNorm(epsilon=EPS, use_scale=False, use_bias=False).apply({}, x)
    np.testing.assert_allclose(jaxnorm.layer_norm(x, use_fast_variance=True), flax,
                               rtol=1e-6, atol=1e-6 * max(1.0, err_fast))


@pytest.mark.parametrize("masked", [False, True])
def test_derived_rules_match_autodiff_of_the_fast_formula(x64, masked):
  """Backward (dx, dscale, dbias) and tangent of the op against autodiff of the written-out fast
  formula, in float64, where the two differ by rounding only."""
  ks = jax.random.split(jax.random.key(3), 6)
  x = 2.0 + jax.random.normal(ks[0], (6, 40), jnp.float64)
  s = 1.0 + 0.1 * jax.random.normal(ks[1], (40,), jnp.float64)
  b = 0.1 * jax.random.normal(ks[2], (40,), jnp.float64)
  dy = jax.random.normal(ks[3], x.shape, jnp.float64)
  tx = jax.random.normal(ks[4], x.shape, jnp.float64)
  mask = (jax.random.uniform(ks[5], x.shape) < 0.7).at[:, 0].set(True) if masked else None

  def ours(x, s, b):
    return jaxnorm.layer_norm(x, s, b, epsilon=EPS, mask=mask, use_fast_variance=True)

  def theirs(x, s, b):
    return _fast_formula(x, s, b, mask=mask)

  y1, vjp1 = jax.vjp(ours, x, s, b)
  y2, vjp2 = jax.vjp(theirs, x, s, b)
  np.testing.assert_allclose(y1, y2, rtol=1e-12, atol=1e-12)
  for g1, g2 in zip(vjp1(dy), vjp2(dy)):
    np.testing.assert_allclose(g1, g2, rtol=1e-10, atol=1e-10)
  t1 = jax.jvp(ours, (x, s, b), (tx, 0.5 * s, b))[1]
  t2 = jax.jvp(theirs, (x, s, b), (tx, 0.5 * s, b))[1]
  np.testing.assert_allclose(t1, t2, rtol=1e-10, atol=1e-10)
  # Second order goes through the same rules.
  h1 = jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(ours(x, s, b) * dy))(x) ** 2))(x)
  h2 = jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(theirs(x, s, b) * dy))(x) ** 2))(x)
  np.testing.assert_allclose(h1, h2, rtol=1e-8, atol=1e-8)


def test_reverse_mode_is_the_derived_backward():
  """The jitted gradient program holds no autodiff of the statistics: its reductions are the
  forward's two sums and the backward's row and column sums (as with the default variance)."""
  x = 3.0 + jax.random.normal(jax.random.key(4), (32, 64))

  def loss(x, fast):
    return jnp.sum(jaxnorm.layer_norm(x, use_fast_variance=fast) ** 2)

  text = {fast: jax.jit(jax.grad(loss), static_argnums=1).lower(x, fast).as_text()
          for fast in (False, True)}
  assert text[True].count("reduce") == text[False].count("reduce")


def test_fused_op_takes_the_flag():
  ks = jax.random.split(jax.random.key(5), 2)
  x = jax.random.normal(ks[0], (8, 64))
  r = 5.0 + jax.random.normal(ks[1], (8, 64))
  y, h = jaxnorm.add_layer_norm(x, r, use_fast_variance=True)
  np.testing.assert_allclose(y, jaxnorm.layer_norm(h, use_fast_variance=True), rtol=1e-6,
                             atol=1e-6)
  g = jax.grad(lambda x: jnp.sum(jaxnorm.add_layer_norm(x, r, use_fast_variance=True)[0] ** 3))(x)
  g_ref = jax.grad(lambda x: jnp.sum(_fast_formula(x + r) ** 3))(x)
  np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)


def test_layers_honour_the_flag_default_false():
  rng = np.random.default_rng(0)
  x = jnp.asarray(1e4 + rng.standard_normal((8, 64)), jnp.float32)  # where the forms differ
  r = jnp.zeros_like(x)
  for fast in (False, True):
    kw = {} if not fast else {"use_fast_variance": True}
    want = jaxnorm.layer_norm(x, jnp.ones(64), jnp.zeros(64), use_fast_variance=fast)
    layer = jnn.LayerNorm(64, rngs=nnx.Rngs(0), **kw)
    np.testing.assert_array_equal(layer(x), want)
    np.testing.assert_allclose(layer(x, residual=r)[0], want, rtol=1e-6, atol=1e-6)
    module = jln.LayerNorm(**kw)
    v = module.init(jax.random.key(0), x)
    np.testing.assert_array_equal(module.apply(v, x), want)
    np.testing.assert_allclose(module.apply(v, x, residual=r)[0], want, rtol=1e-6, atol=1e-6)
  assert jnn.LayerNorm(4, rngs=nnx.Rngs(0)).use_fast_variance is False
  assert jln.LayerNorm().use_fast_variance is False


def test_layers_match_flax_with_the_same_flag():
  rng = np.random.default_rng(1)
  x = jnp.asarray(30.0 + rng.standard_normal((8, 64)), jnp.float32)
  mask = jnp.asarray(rng.uniform(size=(8, 64)) < 0.8)
  for fast in (False, True):
    ours = jnn.LayerNorm(64, use_fast_variance=fast, rngs=nnx.Rngs(0))
    theirs = nnx.LayerNorm(64, use_fast_variance=fast, rngs=nnx.Rngs(0))
    tol = 1e-4 if fast else 1e-5
    np.testing.assert_allclose(ours(x), theirs(x), rtol=tol, atol=tol)
    np.testing.assert_allclose(ours(x, mask=mask), theirs(x, mask=mask), rtol=tol, atol=tol)


def test_bad_flag_raises():
  x = jnp.ones((2, 8))
  for op in (lambda v: jaxnorm.layer_norm(x, use_fast_variance=v),
             lambda v: jaxnorm.add_layer_norm(x, x, use_fast_variance=v),
             lambda v: jnn.LayerNorm(8, use_fast_variance=v, rngs=nnx.Rngs(0)),
             lambda v: jln.LayerNorm(use_fast_variance=v)):
    with pytest.raises(TypeError, match="use_fast_variance must be a bool, got 'yes'"):
      op("yes")
  with pytest.raises(ValueError, match=r"impl='pallas' cannot run this call: .*use_fast_variance"):
    jaxnorm.layer_norm(x, use_fast_variance=True, impl="pallas")
