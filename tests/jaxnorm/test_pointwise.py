"""DyT and Derf (the pointwise op family): derived rules against float64 autodiff of the
reference, through the public kit; shapes of the parameters; layers; models; errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm import reference
from jaxnorm.models import TransformerConfig, TransformerLM
from jaxnorm.testing import TRANSFORMS, Tolerance, check_rule

POINTWISE = [op for op in jaxnorm.OPS.values() if op.family == "pointwise"]
# XLA's float32 tanh and erf are not correctly rounded: measured on XLA:CPU over 2e6 points
# of [-6, 6], at most 4.5 (tanh) and 5.0 (erf) ulps from float64 (docs/derivations.md,
# "Pointwise ops"). A float32 result may carry that plus its own rounding.
TOL = Tolerance(ulps=6.0)
# Second order in bfloat16/float16 passes through first-order cotangents rounded to the 16-bit
# dtype (by contract); like the norms' (tests/jaxnorm/test_testing_kit.py), it is checked in float32.


def _params(op, d, key, *, per="scalar", dtype=jnp.float32):
  """Parameters of ``op`` for rows of width ``d``: alpha/shift scalar or per channel."""
  k = jax.random.split(key, 4)
  shapes = {"scalar": (), "channel": (d,), "head": (2, d)}
  out = {"alpha": 0.5 + 0.3 * jax.random.normal(k[0], shapes[per]),
         "shift": 0.2 * jax.random.normal(k[1], shapes[per]),
         "scale": 1.0 + 0.5 * jax.random.normal(k[2], (d,)),
         "bias": 0.1 * jax.random.normal(k[3], (d,))}
  return tuple(out[name].astype(dtype) for name in op.params)


def _op_of(cls):
  """The entry of jaxnorm.OPS whose layer ``cls`` is."""
  (op,) = [op for op in POINTWISE if op.layer == cls.__name__]
  return op


# Every transform once per op (scalar parameters); per-head parameters under the transforms that
# treat their leading axis (vmap batched and unbatched) and second order.
CASES = [("float32", "scalar", TRANSFORMS), ("float32", "head", ("vmap", "vmap_unbatched", "grad2")),
         ("bfloat16", "channel", ("vmap",)), ("float16", "channel", ("vmap",))]


@pytest.mark.parametrize("op", POINTWISE, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype, per, transforms", CASES, ids=lambda c: str(c)[:12])
def test_rules_equal_float64_autodiff(op, dtype, per, transforms):
  """Values, VJPs, JVPs and the adjoint identity; in float32 under every transform of the kit
  (16-bit: first order, see FIRST_ORDER)."""
  x = 2.0 * jax.random.normal(jax.random.key(1), (3, 2, 8))
  args = (x.astype(dtype),) + _params(op, 8, jax.random.key(2), per=per, dtype=dtype)
  check_rule(op.fn, op.reference, args, transforms=transforms, tolerance=TOL)


# |alpha x| up to about 15: beyond it second order underflows float32, and beyond about 19
# the float64 oracle's own 1 - tanh^2 is exactly 0 while the true sech^2 is not (the tails are
# checked against cosh in test_tanh_slope_has_no_cancellation_in_the_tails, and for every op to
# |u| = 1e4 and the dtypes' limits in tests/jaxnorm/test_pointwise_tails.py).
@settings(max_examples=3, deadline=None, derandomize=True)
@given(shape=st.sampled_from([(5,), (4, 7), (2, 3, 16)]),
       spread=st.sampled_from([0.1, 1.0, 4.0]), seed=st.integers(0, 2**16))
def test_rules_over_input_scales(shape, spread, seed):
  """Saturated (large |alpha x|) and linear (small) regimes, both ops, float32."""
  x = spread * jax.random.normal(jax.random.key(seed), shape)
  for op in POINTWISE:
    check_rule(op.fn, op.reference, (x,) + _params(op, shape[-1], jax.random.key(seed + 1)),
               transforms=("grad2",), tolerance=TOL)


def test_reverse_mode_runs_the_derived_backward():
  """jax.grad's program holds no tanh derivative from autodiff (1 - tanh^2 of a saved tanh):
  the derived backward recomputes sech^2 from exp."""
  x = jax.random.normal(jax.random.key(0), (4, 8))
  jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(jaxnorm.dyt(x, jnp.array(0.5)))))(x))
  assert "exp" in jaxpr


def test_tanh_slope_has_no_cancellation_in_the_tails():
  """At |alpha x| = 12, sech^2 is 1.5e-10: the derived rule keeps it, 1 - tanh^2 gives 0."""
  x = jnp.array([12.0, -12.0, 20.0])
  g = jax.grad(lambda x: jnp.sum(jaxnorm.dyt(x, jnp.array(1.0))))(x)
  exact = 1.0 / np.cosh(np.array([12.0, -12.0, 20.0])) ** 2
  np.testing.assert_allclose(np.asarray(g), exact, rtol=1e-5)


@pytest.mark.parametrize("op", POINTWISE, ids=lambda o: o.name)
def test_jacobian_diagonal(op):
  x = jax.random.normal(jax.random.key(0), (3, 6))
  params = _params(op, 6, jax.random.key(1))
  diag = op.jacobian(x, *params[:-1])  # no bias
  full = jax.jacfwd(lambda x: op.reference(x, *params))(x).reshape(18, 18)
  np.testing.assert_allclose(np.asarray(diag).reshape(-1), np.diag(np.asarray(full)),
                             rtol=1e-5, atol=1e-7)


def test_batched_parameters_keep_the_primitive():
  """grad(vmap(op)) with one alpha per ensemble member equals autodiff of the reference."""
  x = jax.random.normal(jax.random.key(0), (4, 6))
  alphas = jnp.array([0.3, 0.5, 1.1])
  scales = jax.random.normal(jax.random.key(1), (3, 6))

  def loss(f, a, s):
    return jnp.sum(jnp.sin(f(x, a, s)))

  got = jax.vmap(jax.grad(functools.partial(loss, jaxnorm.dyt), argnums=(0, 1)))(alphas, scales)
  want = jax.vmap(jax.grad(functools.partial(loss, reference.dyt), argnums=(0, 1)))(alphas,
                                                                                   scales)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
  jaxpr = str(jax.make_jaxpr(jax.vmap(jax.jvp, in_axes=(None, None, 0)),
                             static_argnums=0)(lambda a: jaxnorm.dyt(x, a), (alphas[0],),
                                               (alphas,)))
  assert "jaxnorm_pointwise_tangent" in jaxpr


def test_shard_map_and_export():
  """Rows split over a mesh axis, scalar parameters replicated: their cotangents are summed
  over the axis (psum) inside shard_map; the exported gradient program runs the same."""
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  x = jax.device_put(jax.random.normal(jax.random.key(0), (4, 8)), NamedSharding(mesh, P("data")))
  a, s = jnp.array(0.7), jnp.array(0.1)

  def grads(x, a, s):
    return jax.grad(lambda a, s: jnp.sum(jaxnorm.derf(x, a, s)), argnums=(0, 1))(a, s)

  got = jax.jit(jax.shard_map(grads, mesh=mesh, in_specs=(P("data"), P(), P()),
                              out_specs=(P(), P())))(x, a, s)
  want = jax.grad(lambda a, s: jnp.sum(reference.derf(x, a, s)), argnums=(0, 1))(a, s)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)
  exported = jax.export.export(jax.jit(jax.grad(lambda x: jnp.sum(jaxnorm.dyt(x, a)))))(x)
  np.testing.assert_allclose(np.asarray(exported.call(x)),
                             np.asarray(jax.grad(lambda x: jnp.sum(reference.dyt(x, a)))(x)),
                             rtol=1e-6)


def test_remat_and_scan():
  x = jax.random.normal(jax.random.key(0), (5, 4, 8))
  a = jnp.array(0.6)

  def body(f, c, xs):
    return c + jnp.sum(jax.checkpoint(f)(xs, a)), None

  def run(f, a_):
    return jax.lax.scan(functools.partial(body, lambda xs, _: f(xs, a_)), 0.0, x)[0]

  np.testing.assert_allclose(float(jax.grad(functools.partial(run, jaxnorm.dyt))(a)),
                             float(jax.grad(functools.partial(run, reference.dyt))(a)),
                             rtol=1e-5)


@pytest.mark.parametrize("bad, error, words", [
    (dict(x=jnp.arange(4)), TypeError, "x must have a floating dtype"),
    (dict(alpha=jnp.ones((3,))), ValueError, "alpha must broadcast"),
    (dict(scale=jnp.ones((2, 4, 8))), ValueError, "scale must broadcast"),
    (dict(alpha=1.0), TypeError, "alpha must be a JAX or NumPy array"),
])
def test_errors_name_the_argument(bad, error, words):
  kw = dict(x=jnp.ones((2, 8)), alpha=jnp.array(0.5), scale=jnp.ones(8))
  kw.update(bad)
  with pytest.raises(error, match=words):
    jaxnorm.dyt(kw["x"], kw["alpha"], kw["scale"])


def test_derf_needs_a_shift():
  with pytest.raises(TypeError, match="shift must be a floating array"):
    jaxnorm.derf(jnp.ones(3), jnp.array(0.5), None)


@pytest.mark.parametrize("cls", [getattr(jnn, op.layer) for op in POINTWISE], ids=str)
def test_nnx_layers(cls):
  layer = cls(6, alpha_init_value=0.8, rngs=nnx.Rngs(0))
  assert float(layer.alpha[...]) == pytest.approx(0.8)
  x = jax.random.normal(jax.random.key(0), (3, 6))
  shift = None if layer.shift is None else layer.shift[...]
  params = (layer.alpha[...],) + ((shift,) if shift is not None else ()) + (
      layer.scale[...], layer.bias[...])
  np.testing.assert_allclose(np.asarray(layer(x)),
                             np.asarray(_op_of(cls).reference(x, *params)),
                             rtol=1e-6)
  y, h = layer(x, residual=2 * x, residual_scale=0.5)
  np.testing.assert_allclose(np.asarray(h), np.asarray(2 * x), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(y), np.asarray(layer(2 * x)), rtol=1e-6)
  with pytest.raises(ValueError, match="num_features=6"):
    layer(jnp.ones((2, 5)))
  with pytest.raises(TypeError, match="alpha_init_value"):
    cls(6, alpha_init_value="big", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("cls", [getattr(jln, op.layer) for op in POINTWISE], ids=str)
def test_linen_layers_match_nnx(cls):
  x = jax.random.normal(jax.random.key(0), (2, 3, 4))
  variables = cls(feature_axes=(-2, -1)).init(jax.random.key(1), x)
  assert set(variables["params"]) == set(_op_of(cls).params)
  assert variables["params"]["scale"].shape == (3, 4)
  nnx_cls = getattr(jnn, cls.__name__)
  layer = nnx_cls(12, feature_axes=(-2, -1), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(cls(feature_axes=(-2, -1)).apply(variables, x)),
                             np.asarray(layer(x)), rtol=1e-6)


@pytest.mark.parametrize("norm_type", [op.name for op in POINTWISE])
@pytest.mark.parametrize("position", ["pre", "post", "sandwich", "deepnorm"])
def test_models_take_them_in_every_position(norm_type, position):
  cfg = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, norm_type=norm_type,
                          norm_position=position, qk_norm=norm_type, pointwise_alpha=(1.0, 0.2))
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  tokens = jnp.arange(16).reshape(2, 8)
  logits = model(tokens)
  assert logits.shape == (2, 8, 256) and bool(jnp.all(jnp.isfinite(logits)))
  unrolled = TransformerLM(TransformerConfig(**{**cfg.__dict__, "scan_layers": False}),
                           rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(unrolled(tokens)), np.asarray(logits), atol=2e-5)


def test_model_config_rejects_flax_pointwise_and_bad_alpha():
  with pytest.raises(ValueError, match="norm_impl='flax' has no"):
    TransformerConfig(norm_type="dyt", norm_impl="flax")
  with pytest.raises(TypeError, match="pointwise_alpha"):
    TransformerConfig(norm_type="dyt", pointwise_alpha=0.5)


def test_bench_pointwise_writes_its_table(tmp_path):
  from experiments.bench import pointwise as bench

  assert bench.main(["--shapes", "8x16", "--dtypes", "float32", "--ops", "dyt", "--repeats", "3",
                     "--sample-ms", "0.2", "--out", str(tmp_path), "--tag", "t"]) == 0
  (json_file,) = tmp_path.glob("pointwise-t-*.json")
  (row,) = __import__("json").loads(json_file.read_text())["rows"]
  assert set(row["over_copy"]) >= {"jaxnorm fwd", "jaxnorm bwd", "autodiff add+op"}
  with pytest.raises(SystemExit):
    bench.main(["--ops", "layer_norm"])
