"""Mathematical properties of the ops, numerical precision and edge cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from _numerics import assert_close, random


@pytest.mark.parametrize("a", [1e-2, 0.3, 7.0, 1e2])
def test_rms_norm_scale_invariance(a):
  """RMSNorm(a x) = RMSNorm(x) for a > 0, and d/dx RMSNorm(a x) does not depend on a."""
  ks = jax.random.split(jax.random.key(0), 3)
  x = random(ks[0], (4, 64), jnp.float32)
  scale = random(ks[1], (64,), jnp.float32, loc=1.0, scale=0.2)
  dy = random(ks[2], (4, 64), jnp.float32)
  f = lambda x: jaxnorm.rms_norm(x, scale, epsilon=1e-12)
  assert_close(f(a * x), f(x), jnp.float32, what="forward")
  # Gradient w.r.t. x of x -> RMSNorm(a x): the chain rule's a cancels the 1/a of the Jacobian.
  (g_a,) = jax.vjp(lambda x: f(a * x), x)[1](dy)
  (g_1,) = jax.vjp(f, x)[1](dy)
  assert_close(g_a, g_1, jnp.float32, what="gradient")


def test_rms_norm_epsilon_breaks_invariance_for_tiny_inputs():
  x = random(jax.random.key(1), (2, 32), jnp.float32)
  f = lambda x: jaxnorm.rms_norm(x, epsilon=1e-6)
  err = float(jnp.max(jnp.abs(f(1e-4 * x) - f(x))))
  assert err > 0.1  # at rms(x) ~ 1e-4, eps = 1e-6 dominates 1e-8 = ms(x)


@pytest.mark.parametrize("shift,a", [(0.0, 3.0), (5.0, 1.0), (-2.0, 0.5)])
def test_layer_norm_shift_and_scale_invariance(shift, a):
  ks = jax.random.split(jax.random.key(2), 2)
  x = random(ks[0], (4, 64), jnp.float32)
  c = random(ks[1], (4, 1), jnp.float32)  # a per-row constant
  f = lambda x: jaxnorm.layer_norm(x, epsilon=1e-12)
  assert_close(f(a * x + shift * c), f(x), jnp.float32)


@pytest.mark.parametrize("placement", ["inside", "outside"])
def test_layer_norm_input_gradient_sums_to_zero(placement):
  """Each row of dx is orthogonal to the all-ones vector (the mean path removes it)."""
  ks = jax.random.split(jax.random.key(3), 3)
  x = random(ks[0], (8, 100), jnp.float32, loc=3.0)
  s = random(ks[1], (100,), jnp.float32, loc=1.0)
  dy = random(ks[2], (8, 100), jnp.float32)
  (dx,) = jax.vjp(lambda x: jaxnorm.layer_norm(x, s, epsilon_placement=placement), x)[1](dy)
  row_sum = jnp.abs(dx.sum(-1))
  assert float(row_sum.max()) < 1e-5 * float(jnp.abs(dx).sum(-1).max())


@pytest.mark.parametrize("ratio", [1e2, 1e3, 1e4])
def test_layer_norm_precision_at_large_mean(x64, ratio):
  """float32 LayerNorm stays within 1e-5 of a float64 reference on the same float32 inputs,
  at mean/std ratios where E[x^2] - E[x]^2 loses every digit."""
  ks = jax.random.split(jax.random.key(4), 3)
  x32 = (ratio + jax.random.normal(ks[0], (16, 1024), jnp.float32)).astype(jnp.float32)
  x64_ = x32.astype(jnp.float64)
  mean = x64_.mean(-1, keepdims=True)
  want = (x64_ - mean) / jnp.sqrt(((x64_ - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
  got = jaxnorm.layer_norm(x32)
  err = float(jnp.max(jnp.abs(got.astype(jnp.float64) - want)) / jnp.max(jnp.abs(want)))
  assert err < 1e-5, err
  # The input gradient too, against float64 autodiff of the same formula.
  dy = jax.random.normal(ks[1], x32.shape, jnp.float32)
  (dx,) = jax.vjp(jaxnorm.layer_norm, x32)[1](dy)
  (dx64,) = jax.vjp(jaxnorm.layer_norm, x64_)[1](dy.astype(jnp.float64))
  err_dx = float(jnp.max(jnp.abs(dx - dx64)) / jnp.max(jnp.abs(dx64)))
  assert err_dx < 1e-4, err_dx
  # Masked and sharding-style pivots (a plain mean) are as accurate.
  mask = jnp.ones(x32.shape, bool).at[:, -1].set(False)
  mean_m = x64_[:, :-1].mean(-1, keepdims=True)
  want_m = (x64_ - mean_m) / jnp.sqrt(((x64_[:, :-1] - mean_m) ** 2).mean(-1, keepdims=True) + 1e-6)
  got_m = jaxnorm.layer_norm(x32, mask=mask)
  assert float(jnp.max(jnp.abs(got_m - want_m)) / jnp.max(jnp.abs(want_m))) < 1e-5


@pytest.mark.parametrize("dtype,ratio", [(jnp.float32, 1e4), (jnp.bfloat16, 30.0),
                                         (jnp.float16, 300.0)])
def test_forward_alone_on_many_rows_keeps_the_precision(x64, dtype, ratio):
  """The jitted forward alone on 4096 rows (XLA:CPU's YNNPACK takes it whole, and the XLA backend
  builds it differently: ``backends/xla/statistics._two_pass_statistics`` for 16-bit ``x``, the
  mean pivot with its offset for float32) is as accurate as the differentiated forward: float32
  within 1e-5 of float64 at mean/std 1e4 (where the textbook two-pass's rounded mean costs
  1.3e-3), a 16-bit ``x`` within one rounding of its output dtype (at a mean/std its format
  still resolves)."""
  x = (ratio + jax.random.normal(jax.random.key(7), (4096, 64), jnp.float32)).astype(dtype)
  x64_ = x.astype(jnp.float64)
  mean = x64_.mean(-1, keepdims=True)
  want = (x64_ - mean) / jnp.sqrt(((x64_ - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
  got = jax.jit(jaxnorm.layer_norm)(x).astype(jnp.float64)
  rel = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
  bound = 1e-5 if dtype == jnp.float32 else float(jnp.finfo(dtype).eps)
  assert rel < bound, (rel, bound)


@pytest.mark.parametrize("k", [0.0, 10.0, 100.0])
def test_outlier_first_element_costs_bounded_precision(x64, k):
  """The first-element pivot's one weakness, pinned: a first feature ``k_r`` row standard
  deviations from its row's mean costs about ``2 log2(k_r)`` bits of the variance
  (docs/derivations.md): ``v`` is the difference of two terms of size ``(1 + k_r^2) v``. So the
  float32 output is within ``8 * 2^-24 * (1 + k_r^2) * max|y|`` of float64 (k_r the largest over
  the rows; the factor 8 covers the rounding of the d-term sums, whose order is XLA's: measured
  0.6-3.0 at jax 0.10.2 and 0.8.1). ``k = 0``: no outlier, ``k_r`` is the first element's own
  distance (at most about 3)."""
  x = jax.random.normal(jax.random.key(8), (32, 512), jnp.float32)
  if k:
    x = x.at[:, 0].set(k)  # an outlier channel in feature 0, every row
  x64_ = x.astype(jnp.float64)
  mean = x64_.mean(-1, keepdims=True)
  std = jnp.sqrt(((x64_ - mean) ** 2).mean(-1, keepdims=True))
  want = (x64_ - mean) / jnp.sqrt(std**2 + 1e-6)
  k_r = float(jnp.max(jnp.abs(x64_[:, 0:1] - mean) / std))
  err = float(jnp.max(jnp.abs(jaxnorm.layer_norm(x).astype(jnp.float64) - want)))
  bound = 8 * 2.0**-24 * (1 + k_r**2) * float(jnp.max(jnp.abs(want)))
  assert err < bound, (err, bound, k_r)


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
def test_large_mean_rows_come_out_standardized(op):
  """At mean/std = 1e4 each float32 output row of jaxnorm has mean 0 and variance 1 (to 1e-4).

  The failure this guards against is shown on the same data: E[x^2] - E[x]^2 in float32 is off
  by more than 10% there, so a LayerNorm built on it gives rows whose variance is not 1.
  """
  ks = jax.random.split(jax.random.key(5), 2)
  noise = jax.random.normal(ks[0], (4, 1024), jnp.float32)
  x = 1e4 + noise
  if op == "layer_norm":
    y = jaxnorm.layer_norm(x)
  else:  # the fused op normalizes h = x + residual: the large mean comes in with the residual
    y, h = jaxnorm.add_layer_norm(noise, jnp.full_like(noise, 1e4))
    np.testing.assert_array_equal(h, x)
  y64 = np.asarray(y, np.float64)
  var = np.var(np.asarray(x, np.float64), -1, keepdims=True)
  # What an exact LayerNorm gives for these float32 inputs: mean 0, variance var / (var + eps).
  np.testing.assert_allclose(y64.mean(-1), 0.0, atol=1e-4)
  np.testing.assert_allclose(y64.var(-1, keepdims=True), var / (var + 1e-6), rtol=1e-4)
  # The one-pass formula on the same float32 data misses the variance by more than 10%, and
  # the rows it normalizes miss unit variance (or are NaN, where it went negative).
  naive_var = jnp.mean(x * x, -1, keepdims=True) - jnp.mean(x, -1, keepdims=True) ** 2
  assert float(np.max(np.abs(np.asarray(naive_var) - var) / var)) > 0.1
  naive_y = np.asarray((x - x.mean(-1, keepdims=True)) / jnp.sqrt(naive_var + 1e-6), np.float64)
  assert not np.all(np.abs(naive_y.var(-1) - 1.0) < 0.05)


@pytest.mark.parametrize("placement", ["inside", "outside"])
def test_constant_row_gives_bias_and_finite_gradients(placement):
  x = jnp.stack([jnp.full((16,), 3.0), random(jax.random.key(6), (16,), jnp.float32)])
  s = random(jax.random.key(7), (16,), jnp.float32, loc=1.0)
  b = random(jax.random.key(8), (16,), jnp.float32)
  dy = random(jax.random.key(9), x.shape, jnp.float32)
  f = lambda x, s, b: jaxnorm.layer_norm(x, s, b, epsilon_placement=placement)
  y, pull = jax.vjp(f, x, s, b)
  np.testing.assert_allclose(y[0], b, atol=1e-6)
  for g in pull(dy):
    assert bool(jnp.all(jnp.isfinite(g)))
  r = lambda x, s: jaxnorm.rms_norm(x, s, epsilon_placement=placement)
  xz = x.at[0].set(0.0)
  y, pull = jax.vjp(r, xz, s)
  np.testing.assert_allclose(y[0], 0.0, atol=1e-6)
  for g in pull(dy):
    assert bool(jnp.all(jnp.isfinite(g)))


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf])
def test_non_finite_row_does_not_leak(bad):
  ks = jax.random.split(jax.random.key(10), 3)
  x = random(ks[0], (4, 32), jnp.float32)
  s = random(ks[1], (32,), jnp.float32, loc=1.0)
  dy = random(ks[2], (4, 32), jnp.float32)
  xb = x.at[1, 5].set(bad)
  for f in (lambda x: jaxnorm.layer_norm(x, s), lambda x: jaxnorm.rms_norm(x, s)):
    (y, pull), (y0, pull0) = jax.vjp(f, xb), jax.vjp(f, x)
    (dx,), (dx0,) = pull(dy), pull0(dy)
    keep = jnp.array([0, 2, 3])
    np.testing.assert_array_equal(y[keep], y0[keep])
    np.testing.assert_array_equal(dx[keep], dx0[keep])


@pytest.mark.parametrize("op", [jaxnorm.layer_norm, jaxnorm.rms_norm])
def test_feature_size_one(op):
  x = random(jax.random.key(11), (5, 1), jnp.float32)
  y, pull = jax.vjp(op, x)
  (dx,) = pull(jnp.ones_like(x))
  assert y.shape == x.shape and bool(jnp.all(jnp.isfinite(y))) and bool(jnp.all(jnp.isfinite(dx)))
  if op is jaxnorm.layer_norm:
    np.testing.assert_array_equal(y, 0.0)
    np.testing.assert_array_equal(dx, 0.0)


def test_empty_batch():
  x = jnp.zeros((0, 8), jnp.float32)
  y, pull = jax.vjp(lambda x: jaxnorm.layer_norm(x, jnp.ones(8), jnp.zeros(8)), x)
  assert y.shape == (0, 8) and pull(y)[0].shape == (0, 8)
