"""Gated RMSNorm (jaxnorm.gated_rms_norm): its derived rules through the public testing kit
against the float64 oracle (both gate orders, groups, dtypes, every transform), the rules
running on the kernels (interpreted) and exported for cuda, the NNX and Linen layers, the
errors, and that reverse mode keeps x, z and rstd, not autodiff's intermediates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm import reference
from jaxnorm.testing import TRANSFORMS, Tolerance, check_rule
from _backends import lowered_for

OP = jaxnorm.OPS["gated_rms_norm"]
TRITON_CALL = "__gpu$xla.gpu.triton"
INTERPRET = jaxnorm.PallasConfig(interpret=True)
# silu's sigmoid (XLA's logistic) is a few ulps from float64, as tanh is for DyT.
TOL = Tolerance(ulps=8.0)


def _args(shape=(3, 2, 16), dtype=jnp.float32, scale=True, seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  x = 2.0 * jax.random.normal(k[0], shape)
  z = 1.5 * jax.random.normal(k[1], shape)
  s = 1.0 + 0.4 * jax.random.normal(k[2], shape[-1:])
  return tuple(a.astype(dtype) for a in (x, z, s if scale else None) if a is not None)


CASES = [  # (dtype, group_size, norm_before_gate, transforms)
    ("float32", None, True, TRANSFORMS),
    ("float32", 4, False, TRANSFORMS),
    ("float32", 8, True, ("vmap", "grad2")),
    ("bfloat16", 4, True, ("vmap",)),
    ("float16", None, False, ("vmap",)),
]


@pytest.mark.parametrize("dtype, group_size, norm_before_gate, transforms", CASES,
                         ids=lambda c: str(c)[:10])
def test_rules_equal_float64_autodiff(dtype, group_size, norm_before_gate, transforms):
  """Values, VJPs, JVPs and the adjoint identity through jaxnorm.testing (16-bit: first order,
  second order checked in float32 as for the other families)."""
  kwargs = dict(group_size=group_size, norm_before_gate=norm_before_gate)
  check_rule(OP.fn, OP.reference, _args(dtype=dtype), kwargs=kwargs, transforms=transforms,
             tolerance=TOL)


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_rules_without_a_scale(norm_before_gate):
  check_rule(lambda x, z: OP.fn(x, z, norm_before_gate=norm_before_gate),
             lambda x, z: OP.reference(x, z, norm_before_gate=norm_before_gate),
             _args(scale=False), transforms=("vmap", "grad2"), tolerance=TOL)


def test_a_batched_scale_keeps_its_own_gradient():
  """vmap over the scale (ensembles): each member's dscale is its own, equal to the oracle's."""
  x, z, s = _args()
  scales = jnp.stack([s, 2.0 * s, -s])
  dy = jax.random.normal(jax.random.key(5), x.shape)

  def grads(fn):
    return jax.vmap(jax.grad(lambda s: jnp.sum(fn(x, z, s, group_size=4) * dy)))(scales)

  np.testing.assert_allclose(grads(OP.fn), grads(OP.reference), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernels_run_the_same_rules(norm_before_gate, dtype):
  """impl="triton" (interpreted): value, VJP, JVP and second order equal the XLA path's."""
  x, z, s = _args((4, 3, 64), dtype)
  kw = dict(group_size=16, norm_before_gate=norm_before_gate)

  def f(impl):
    pallas = INTERPRET if impl == "triton" else None
    return lambda x, z, s: OP.fn(x, z, s, impl=impl, pallas=pallas, **kw)

  tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=2e-2, atol=5e-2)
  dy = jax.random.normal(jax.random.key(3), x.shape).astype(dtype)
  for got, want in [(f("triton")(x, z, s), f("xla")(x, z, s)),
                    (jax.vjp(f("triton"), x, z, s)[1](dy), jax.vjp(f("xla"), x, z, s)[1](dy)),
                    (jax.jvp(f("triton"), (x, z, s), (dy, dy, s))[1],
                     jax.jvp(f("xla"), (x, z, s), (dy, dy, s))[1])]:
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.float32(g), np.float32(w), **tol)
  if dtype == "float32":
    def hvp(fn):
      return jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(fn(x, z, s) * dy))(x) ** 2))(x)
    np.testing.assert_allclose(hvp(f("triton")), hvp(f("xla")), rtol=1e-4, atol=1e-4)


def _cuda_text(f, *args):
  return lowered_for(f, ("cuda",), *args)


def test_auto_lowered_for_cuda_runs_the_kernels_and_xla_does_not(gpu_host):
  x, z, s = _args((16, 128))

  def loss(impl):
    return jax.grad(lambda x, z, s: jnp.sum(OP.fn(x, z, s, group_size=32, impl=impl) ** 2),
                    argnums=(0, 1, 2))

  assert _cuda_text(loss("auto"), x, z, s).count(TRITON_CALL) >= 2  # forward and backward
  assert TRITON_CALL not in _cuda_text(loss("xla"), x, z, s)


def test_reverse_mode_keeps_x_z_and_rstd():
  """The saved residuals are the inputs and one float32 per group and row (jaxnorm's names)."""
  x, z, s = _args((8, 32))
  f = jax.checkpoint(lambda x, z: OP.fn(x, z, s, group_size=8),
                     policy=jax.checkpoint_policies.save_only_these_names(
                         jaxnorm.INPUT_RESIDUAL, jaxnorm.STATS_RESIDUAL))
  _, vjp = jax.vjp(f, x, z)
  shapes = sorted(tuple(leaf.shape) for leaf in jax.tree.leaves(vjp)
                  if hasattr(leaf, "shape") and leaf.ndim)
  assert (8, 4) in shapes  # rstd: 8 rows x 4 groups
  np.testing.assert_allclose(vjp(jnp.ones((8, 32)))[0],
                             jax.vjp(lambda x: reference.gated_rms_norm(x, z, s, group_size=8),
                                     x)[1](jnp.ones((8, 32)))[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_layers_equal_the_op(norm_before_gate):
  x, z, _ = _args((2, 3, 16))
  kw = dict(group_size=4, norm_before_gate=norm_before_gate)
  layer = jnn.GatedRMSNorm(16, scale_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(0), **kw)
  want = jaxnorm.gated_rms_norm(x, z, layer.scale[...], **kw)
  np.testing.assert_array_equal(layer(x, z), want)
  module = jln.GatedRMSNorm(**kw)
  variables = module.init(jax.random.key(0), x, z)
  assert jax.tree.map(jnp.shape, variables) == {"params": {"scale": (16,)}}
  np.testing.assert_array_equal(module.apply(variables, x, z),
                                jaxnorm.gated_rms_norm(x, z, jnp.ones(16), **kw))
  # A training step differentiates the layer's parameter through the derived rule.
  grads = nnx.grad(lambda m: jnp.sum(m(x, z) ** 2))(layer)
  want_grad = jax.grad(lambda s: jnp.sum(reference.gated_rms_norm(x, z, s, **kw) ** 2))(
      layer.scale[...])
  np.testing.assert_allclose(grads.scale[...], want_grad, rtol=1e-5, atol=1e-6)


def test_layer_dtype_follows_the_inputs_as_flax_norms():
  x, z, _ = _args((2, 16), jnp.bfloat16)
  layer = jnn.GatedRMSNorm(16, rngs=nnx.Rngs(0))
  assert layer(x, z).dtype == jnp.float32  # float32 scale promotes, as flax.nnx.RMSNorm
  assert jnn.GatedRMSNorm(16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))(x, z).dtype == x.dtype
  assert jnn.GatedRMSNorm(16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))(x, z).dtype == jnp.bfloat16


@pytest.mark.parametrize("call, error, match", [
    (lambda x: jaxnorm.gated_rms_norm(x, x[:, :8]), ValueError, "z .*shape"),
    (lambda x: jaxnorm.gated_rms_norm(x, x, jnp.ones(8)), ValueError, "scale must have shape"),
    (lambda x: jaxnorm.gated_rms_norm(x, x, group_size=5), ValueError, "group_size must divide"),
    (lambda x: jaxnorm.gated_rms_norm(x, x, group_size=0), ValueError, "group_size"),
    (lambda x: jaxnorm.gated_rms_norm(x, x, norm_before_gate=1), TypeError, "norm_before_gate"),
    (lambda x: jaxnorm.gated_rms_norm(x, x.astype(jnp.int32)), TypeError, "z"),
    (lambda x: jaxnorm.gated_rms_norm(x.astype(jnp.float8_e4m3fn), x), TypeError, "x must be"),
    (lambda x: jaxnorm.gated_rms_norm(x, x, impl="cuda"), ValueError, "impl"),
    (lambda x: jnn.GatedRMSNorm(16, group_size=3, rngs=nnx.Rngs(0)), ValueError, "group_size"),
    (lambda x: jnn.GatedRMSNorm(8, rngs=nnx.Rngs(0))(x, x), ValueError, "8 features"),
])
def test_bad_input_raises_naming_the_argument(call, error, match):
  with pytest.raises(error, match=match):
    call(jnp.ones((2, 16)))


def test_float64_on_auto_runs_the_xla_formulas():
  """The kernels refuse float64 (impl="triton" says why); impl="auto" runs the XLA path."""
  with jax.enable_x64(True):
    x, z, s = (a.astype(jnp.float64) for a in _args((2, 16)))
    with pytest.raises(ValueError, match="impl='triton' cannot run this call.*float64"):
      jaxnorm.gated_rms_norm(x, z, s, impl="triton", pallas=INTERPRET)
    np.testing.assert_allclose(jaxnorm.gated_rms_norm(x, z, s, group_size=4),
                               reference.gated_rms_norm(x, z, s, group_size=4), rtol=1e-12)


@pytest.mark.parametrize("shape", [(2, 0), (0, 8), (8,)], ids=["no-features", "no-rows", "1-d"])
def test_empty_and_one_row_shapes(shape):
  """No features or no rows give empty results and gradients, as rms_norm; a 1-D x is one row."""
  x = jnp.linspace(-1.0, 1.0, int(np.prod(shape))).reshape(shape)
  s = jnp.ones(shape[-1:])
  np.testing.assert_allclose(OP.fn(x, x, s), OP.reference(x, x, s), rtol=1e-6, atol=1e-7)
  got = jax.grad(lambda x, s: jnp.sum(OP.fn(x, x, s) ** 2), argnums=(0, 1))(x, s)
  want = jax.grad(lambda x, s: jnp.sum(OP.reference(x, x, s) ** 2), argnums=(0, 1))(x, s)
  for g, w in zip(got, want):
    assert g.shape == w.shape
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
