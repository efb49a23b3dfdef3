"""memory_efficient=True (Apex's memory-saving backward): reverse mode keeps y and rstd instead of
x and recovers x_hat = (y - beta) / gamma. Checked against float64 autodiff of the reference
through jaxnorm.testing.check_rule (both modes, every transformation), what is saved, the
zero-gamma contract (a ValueError where the scale is concrete, differentiated or not; NaN in
the zero feature's dx column and dscale entry where it is traced), and the
kernels' refusal."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm import reference
from jaxnorm import testing as jt
from _backends import lowered_for

OPS = {"layer_norm": (jaxnorm.layer_norm, reference.layer_norm, True),
       "rms_norm": (jaxnorm.rms_norm, reference.rms_norm, False)}
TRITON_CALL = "__gpu$xla.gpu.triton"


def _normal(rng, shape, dtype, loc, scale):
  a = (loc + scale * rng.standard_normal(shape)).astype(jnp.dtype(dtype))
  with jax.enable_x64(a.dtype == np.float64):
    return jnp.asarray(a)


def _args(op_name, dtype, shape=(3, 5, 48), seed=7):
  """x, and a scale bounded away from 0 (in [0.4, 1.6] here): x_hat = (y - beta) / gamma loses
  about log2(|beta / gamma|) bits to the subtraction, so a gamma near 0 (one of 48 normal draws
  at 1 +- 0.5 came to -1e-3) is outside the kit's budgets by design (docs/derivations.md)."""
  rng = np.random.default_rng(seed)
  x = _normal(rng, shape, dtype, 1.0, 2.0)
  scale = _normal(rng, shape[-1:], dtype, 1.0, 0.2)
  bias = _normal(rng, shape[-1:], dtype, 0.0, 1.0)
  return (x, scale, bias) if OPS[op_name][2] else (x, scale)


def _check(op_name, args, transforms, tolerance=None, **kw):
  op, ref, _ = OPS[op_name]
  rule = functools.partial(op, memory_efficient=True, **kw)
  jt.check_rule(rule, functools.partial(ref, **kw), args, transforms=transforms,
                tolerance=tolerance or jt.Tolerance())


# The kit's transformations each float32 variant runs, a covering design (issue 51, goal 9):
# per op, every transformation runs with each epsilon placement and each form of the scale (the
# variants change the arithmetic, which every entry checks plainly; the transformations change
# how it is traced), and second order, where the placements differ most, in all four.
_HALVES = (("eager", "vmap", "scan", "grad2"), ("vmap_unbatched", "checkpoint", "zeros", "grad2"))
_VARIANT_TRANSFORMS = {("inside", False): _HALVES[0], ("outside", True): _HALVES[0],
                       ("inside", True): _HALVES[1], ("outside", False): _HALVES[1]}


def test_the_variants_cover_every_transformation():
  """Each epsilon placement, and each form of the scale, meets every transformation."""
  for axis, values in ((0, ("inside", "outside")), (1, (False, True))):
    for value in values:
      cover = {t for key, ts in _VARIANT_TRANSFORMS.items() if key[axis] == value for t in ts}
      assert cover == set(jt.TRANSFORMS), (axis, value)


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("placement", ["inside", "outside"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_rule_matches_autodiff(op_name, dtype, placement, zero_centered):
  """Value, VJP, JVP and the adjoint identity, and in float32 the kit's transformations of
  :data:`_VARIANT_TRANSFORMS` (second order in every variant); float64 plain."""
  transforms = _VARIANT_TRANSFORMS[placement, zero_centered] if dtype == "float32" else ()
  _check(op_name, _args(op_name, dtype), transforms, epsilon=1e-3, epsilon_placement=placement,
         zero_centered_scale=zero_centered)


@pytest.mark.parametrize("op_name", list(OPS))
def test_bfloat16_within_the_budget_of_a_rounded_y(op_name):
  """x_hat comes back from a bfloat16 y: the backward computes with bfloat16's precision of
  x_hat (docs/derivations.md), so the budget is bfloat16's."""
  _check(op_name, _args(op_name, "bfloat16"), ("vmap", "checkpoint"),
         tolerance=jt.Tolerance(compute_dtype=jnp.bfloat16), epsilon=1e-5)


@pytest.mark.parametrize("op_name", list(OPS))
def test_without_scale_and_per_head_scale(op_name):
  rng = np.random.default_rng(1)
  x = _normal(rng, (2, 3, 4, 16), "float32", 0.5, 1.5)
  _check(op_name, (x,), ("vmap",))
  heads = (x, _normal(rng, (4, 16), "float32", 1.0, 0.3)) + (
      (_normal(rng, (4, 16), "float32", 0.0, 1.0),) if OPS[op_name][2] else ())
  _check(op_name, heads, ("vmap",))


@pytest.mark.parametrize("op_name", list(OPS))
def test_saves_y_and_rstd_not_x(op_name, capsys):
  """Under a matmul whose weight gradient keeps y anyway, the default keeps x as well (two
  (rows, d) residuals); memory_efficient keeps y alone (one), named OUTPUT_RESIDUAL."""
  op = OPS[op_name][0]
  args = _args(op_name, "float32", shape=(32, 64))
  w = jnp.ones((64, 8))
  counts = {}
  for me in (False, True):
    def block(w, x, *params, me=me):
      return jnp.tanh(op(x, *params, memory_efficient=me) @ w)
    jax.ad_checkpoint.print_saved_residuals(block, w, *args)
    lines = capsys.readouterr().out.splitlines()
    counts[me] = [line for line in lines if line.startswith("f32[32,64]")]
  assert len(counts[False]) == 2 and any("jaxnorm_input" in line for line in counts[False])
  assert len(counts[True]) == 1 and "jaxnorm_output" in counts[True][0]


def test_value_is_the_default_value_and_residual_names():
  args = _args("layer_norm", "float32")
  np.testing.assert_array_equal(jaxnorm.layer_norm(*args, memory_efficient=True),
                                jaxnorm.layer_norm(*args))
  names = []
  policy = lambda prim, *_, **params: names.append(params.get("name")) or False  # noqa: E731
  jax.grad(jax.checkpoint(lambda x: jnp.sum(jaxnorm.rms_norm(x, args[1], memory_efficient=True) ** 3),
                          policy=policy))(args[0])
  assert jaxnorm.OUTPUT_RESIDUAL in names and jaxnorm.INPUT_RESIDUAL not in names


@pytest.mark.parametrize("zero_centered", [False, True])
def test_a_concrete_zero_gamma_raises(zero_centered):
  x = jnp.tile(jnp.arange(8.0), (2, 1))
  scale = jnp.zeros(8).at[5].set(-1.0) if zero_centered else jnp.ones(8).at[5].set(0.0)
  with pytest.raises(ValueError, match=r"memory_efficient=True recovers x_hat = \(y - bias\) / gamma in the backward, "
                                       r"but gamma is 0 at 1 of 8 features \(first at flat index 5\)"):
    jaxnorm.rms_norm(x, scale, zero_centered_scale=zero_centered, memory_efficient=True)


@pytest.mark.parametrize("how", ["grad", "vjp", "jvp", "nnx.grad"])
def test_a_concrete_zero_gamma_raises_when_the_scale_is_differentiated(how):
  """Eager grad/vjp/jvp/nnx.grad: the scale's value is concrete in the JVP rule, which checks it
  (a training step differentiates the scale)."""
  from flax import nnx
  from jaxnorm import nnx as jnn
  x = jnp.tile(jnp.arange(8.0), (2, 1))
  scale = jnp.ones(8).at[2].set(0.0)
  f = functools.partial(jaxnorm.rms_norm, x, memory_efficient=True)
  calls = {"grad": lambda: jax.grad(lambda s: jnp.sum(f(s) ** 2))(scale),
           "vjp": lambda: jax.vjp(f, scale),
           "jvp": lambda: jax.jvp(f, (scale,), (scale,))}
  if how == "nnx.grad":
    layer = jnn.RMSNorm(8, memory_efficient=True, rngs=nnx.Rngs(0))
    layer.scale[...] = scale
    calls[how] = lambda: nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
  with pytest.raises(ValueError, match=r"memory_efficient=True .* gamma is 0 at 1 of 8 features "
                                       r"\(first at flat index 2\)"):
    calls[how]()


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("zero_centered", [False, True])
def test_a_traced_zero_gamma_gives_nan_in_its_column_only(op_name, zero_centered):
  """The documented behaviour where the scale is traced (jit): NaN in the zero feature's dx column
  and dscale entry (the only cotangents that need its x_hat, which y does not carry), every other
  entry the default backward's within the memory-efficient budget (never a silently wrong number)."""
  args = _args(op_name, "float32", shape=(4, 16))
  gamma0 = -1.0 if zero_centered else 0.0
  args = (args[0], args[1].at[3].set(gamma0)) + args[2:]
  dy = jax.random.normal(jax.random.key(0), args[0].shape)
  op = OPS[op_name][0]

  def grads(me):
    f = lambda x, s: op(x, s, *args[2:], memory_efficient=me, zero_centered_scale=zero_centered)  # noqa: E731
    return jax.jit(lambda x, s: jax.vjp(f, x, s)[1](dy))(*args[:2])

  (dx, ds), (dx0, ds0) = grads(True), grads(False)
  keep = np.arange(16) != 3
  assert np.all(np.isnan(dx[:, 3])) and np.isnan(ds[3])
  assert np.all(np.isfinite(dx[:, keep])) and np.all(np.isfinite(ds[keep]))
  np.testing.assert_allclose(dx[:, keep], dx0[:, keep], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ds[keep], ds0[keep], rtol=1e-5, atol=1e-5)


def test_a_traced_zero_gamma_gives_nan_second_order():
  """Second order recomputes the statistics from the recovered x, whose zero-gamma feature is not
  x_hat there: every second-order value would be silently wrong, so all are NaN."""
  x = jax.random.normal(jax.random.key(0), (3, 8)) + 0.5
  scale = jnp.linspace(0.5, 1.5, 8).at[3].set(0.0)
  w = jax.random.normal(jax.random.key(1), (3, 8))
  grad = jax.grad(lambda x, s: jnp.sum(jnp.sin(jaxnorm.rms_norm(x, s, memory_efficient=True)) * w))
  hvp = jax.jit(lambda x, s: jax.jvp(lambda x: grad(x, s), (x,), (jnp.ones_like(x),))[1])(x, scale)
  assert np.all(np.isnan(hvp))


def test_a_traced_zero_gamma_gives_nan_tangent_rows():
  """Forward mode needs x_hat_i in every row mean: the tangent's rows are NaN (not masked)."""
  x, scale = _args("rms_norm", "float32", shape=(2, 8))
  scale = scale.at[1].set(0.0)
  t = jax.jit(lambda x, s: jax.jvp(lambda x: jaxnorm.rms_norm(x, s, memory_efficient=True),
                                   (x,), (jnp.ones_like(x),))[1])(x, scale)
  assert np.all(np.isnan(t))


@pytest.mark.parametrize("impl", ["triton", "pallas"])
def test_the_kernels_refuse_it(impl, gpu_host):
  x, scale = _args("rms_norm", "float32", shape=(8, 64))
  with pytest.raises(ValueError, match=rf"impl='{impl}' cannot run this call: the Pallas kernels implement "
                                       r"rms_norm without its options \(memory_efficient=True\)"):
    jaxnorm.rms_norm(x, scale, memory_efficient=True, impl=impl)
  grad = jax.grad(lambda x, s: jnp.sum(jaxnorm.rms_norm(x, s, memory_efficient=True) ** 2), (0, 1))
  assert TRITON_CALL not in lowered_for(grad, ("cuda",), x, scale)


def test_a_non_bool_is_refused():
  with pytest.raises(TypeError, match="memory_efficient"):
    jaxnorm.layer_norm(jnp.ones((2, 4)), memory_efficient="yes")


def test_layers_and_model_pass_it_to_the_op():
  """The NNX and Linen layers take memory_efficient (same values and gradients as the default);
  with residual= they refuse it; the model's norm_memory_efficient reaches its norms."""
  from flax import nnx
  from jaxnorm import linen as jln
  from jaxnorm import nnx as jnn
  from jaxnorm.models import TransformerConfig, TransformerLM

  x = _args("layer_norm", "float32", shape=(4, 16))[0]
  grads = []
  for me in (False, True):
    layer = jnn.LayerNorm(16, memory_efficient=me, rngs=nnx.Rngs(0))
    grads.append(jax.grad(lambda x: jnp.sum(jnp.sin(layer(x))))(x))
    module = jln.RMSNorm(memory_efficient=me)
    v = module.init(jax.random.key(0), x)
    grads.append(jax.grad(lambda x: jnp.sum(jnp.sin(module.apply(v, x))))(x))
  for a, b in zip(grads[:2], grads[2:]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"the residual add \+ norm \(residual=...\) has no such option"):
    jnn.RMSNorm(16, memory_efficient=True, rngs=nnx.Rngs(0))(x, residual=x)
  with pytest.raises(ValueError, match=r"norm_memory_efficient=True does not apply with fuse_residual_norm=True"):
    TransformerConfig(norm_memory_efficient=True)
  with pytest.raises(ValueError, match=r"does not apply with no LayerNorm/RMSNorm layer \(norm_type='dyt'"):
    TransformerConfig(norm_memory_efficient=True, fuse_residual_norm=False, norm_type="dyt")
  config = TransformerConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=16,
                             fuse_residual_norm=False, norm_memory_efficient=True)
  model = TransformerLM(config, rngs=nnx.Rngs(0))
  norms = [m for _, m in nnx.iter_modules(model) if isinstance(m, jnn.LayerNorm)]
  assert len(norms) == 3 and all(m.memory_efficient for m in norms)


# Precision (issue 51): x_hat = (y - beta) / gamma carries y's rounding error times |beta / gamma|.


def _ln_grads(x, scale, bias, dy, memory_efficient):
  f = lambda x, s: jaxnorm.layer_norm(x, s, bias, memory_efficient=memory_efficient)  # noqa: E731
  return jax.vjp(f, x, scale)[1](dy)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_at_the_ratio_limit_half_the_bits_survive(dtype):
  """At max |beta| / |gamma| = max_ratio(dtype) (one feature's gamma shrunk, bias 1 there),
  dx and dscale differ from the default by at most sqrt(u) of the array's scale, u the unit
  roundoff of y's dtype: the rule behind the warning (docs/perf-notes.md)."""
  from jaxnorm.ops.norm.memory_efficient import max_ratio
  rng = np.random.default_rng(3)
  d = 64
  limit = max_ratio(dtype)
  scale = rng.uniform(0.5, 1.5, d)
  bias = 0.5 * scale * rng.uniform(-1, 1, d)
  scale[0], bias[0] = 1.0 / limit, 1.0
  x, dy = rng.normal(0.5, 1.0, (32, d)), rng.normal(0.0, 1.0, (32, d))
  x, scale, bias, dy = (jnp.asarray(a, dtype) for a in (x, scale, bias, dy))
  base = _ln_grads(x, scale, bias, dy, False)
  kept = _ln_grads(x, scale, bias, dy, True)
  sqrt_u = float(jnp.finfo(dtype).eps / 2) ** 0.5
  for g, g0 in zip(kept, base):
    g, g0 = np.asarray(g, np.float64), np.asarray(g0, np.float64)
    assert np.max(np.abs(g - g0)) <= sqrt_u * np.max(np.abs(g0))


@pytest.mark.parametrize("dtype, ratio, out, warns", [
    ("float32", 8192.0, None, True), ("float32", 4096.0, None, False),
    ("bfloat16", 32.0, None, True), ("bfloat16", 16.0, None, False),
    ("bfloat16", 32.0, "float32", False), ("float16", 64.0, None, True)])
def test_a_concrete_ratio_above_the_limit_warns(dtype, ratio, out, warns):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8)), dtype)
  scale = jnp.ones(8, dtype).at[3].set(1.0 / ratio)
  bias = jnp.ones(8, dtype)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jaxnorm.layer_norm(x, scale, bias, memory_efficient=True, dtype=out)
    jax.jit(lambda s, b: jaxnorm.layer_norm(x, s, b, memory_efficient=True, dtype=out))(
        scale, bias)  # traced: nothing to check
    jaxnorm.rms_norm(x, scale, memory_efficient=True)  # no bias: the ratio is 0
    jaxnorm.layer_norm(x, scale, bias)  # the default keeps x
  ours = [str(w.message) for w in caught if "max |bias_j| / |gamma_j|" in str(w.message)]
  assert len(ours) == int(warns), ours
  if warns:
    assert f"is {ratio:.4g} (at index (3,)" in ours[0] and f"from y stored in {dtype}" in ours[0]


def test_a_zero_centered_scale_counts_gamma():
  x = jnp.tile(jnp.arange(8.0), (2, 1))
  scale = jnp.zeros(8).at[5].set(-1.0 + 1.0 / 8192)  # gamma_5 = 1 / 8192
  with pytest.warns(RuntimeWarning, match=r"is 8192 \(at index \(5,\)"):
    jaxnorm.layer_norm(x, scale, jnp.ones(8), zero_centered_scale=True, memory_efficient=True)
