"""Per-head parameters (QK-norm): ``x: (..., heads, head_dim)``, ``axis=-1``, ``scale: (heads,
head_dim)``, one weight per head, against autodiff of the independent reference, both backends.

For every op and variant, through the kit (:func:`jaxnorm.testing.check_rule`, within its ulp
budgets): the value, the derived VJP (random cotangents; the scale gradient summed over the
leading axes only), the derived JVP (random tangents, parameters included) and the adjoint
identity; the fused ops' ``y`` and ``h`` are each compared;
a shared ``(head_dim,)`` scale keeps working beside a per-head bias; ``vmap`` over an ensemble
of per-head parameters keeps the derived backward; bad shapes get a clear error.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import jaxnorm
from jaxnorm import reference
from jaxnorm import testing as jt
from _backends import PALLAS, XLA
from _kernels import count_pallas_calls
from _numerics import assert_close, host_mask, host_random

BACKENDS = [XLA, PALLAS]


@st.composite
def cases(draw, backend):
  dtype = draw(st.sampled_from([d for d in ("float32", "bfloat16") if d in backend.dtypes]))
  heads = draw(st.sampled_from([(1,), (3,), (2, 2)]))
  head_dim = draw(st.sampled_from([8, 33, 64]))
  lead = draw(st.sampled_from([(2,), (3, 2)]))
  variant = draw(st.sampled_from([
      dict(), dict(epsilon_placement="outside"), dict(zero_centered_scale=True),
      dict(casting="llama"), dict(casting="t5"),
  ]))
  mask = backend.masks and draw(st.booleans())
  shared_scale = draw(st.booleans())
  return dict(dtype=dtype, shape=lead + heads + (head_dim,), n_heads=len(heads), variant=variant,
              mask=mask, shared_scale=shared_scale, seed=draw(st.integers(0, 2**16)))


def _data(case):
  rng = np.random.default_rng(case["seed"])
  shape, nh = case["shape"], case["n_heads"]
  dt = jnp.dtype(case["dtype"])
  x = host_random(rng, shape, dt, loc=1.5)
  r = host_random(rng, shape, dt)
  pshape = shape[-1:] if case["shared_scale"] else shape[-1 - nh:]
  s = host_random(rng, pshape, dt, loc=1.0, scale=0.5)
  b = host_random(rng, shape[-1 - nh:], dt)
  m = host_mask(rng, shape) if case["mask"] else None
  return x, r, s, b, m


def _ops(case, backend, m):
  """``(rule, reference)`` pairs of ``(x, r, s, b)``: each op with the case's variant and mask;
  the fused ones return ``(y, h)`` with a float32 stream (the reference rounds ``h`` to float32
  straight-through, its derivative the identity)."""
  kw, ref_kw = dict(case["variant"], mask=m), dict(case["variant"], mask=m)
  kw.update(backend.kw)

  def stream(x, r):
    h = x + r
    return h + jax.lax.stop_gradient(h.astype(jnp.float32).astype(h.dtype) - h)

  return [
      (lambda x, r, s, b: jaxnorm.layer_norm(x, s, b, **kw),
       lambda x, r, s, b: reference.layer_norm(x, s, b, **ref_kw)),
      (lambda x, r, s, b: jaxnorm.rms_norm(x, s, **kw),
       lambda x, r, s, b: reference.rms_norm(x, s, **ref_kw)),
      (lambda x, r, s, b: jaxnorm.add_layer_norm(x, r, s, b, residual_dtype=jnp.float32, **kw),
       lambda x, r, s, b: (lambda h: (reference.layer_norm(h, s, b, dtype=x.dtype, **ref_kw),
                                      h))(stream(x, r))),
      (lambda x, r, s, b: jaxnorm.add_rms_norm(x, r, s, residual_dtype=jnp.float32, **kw),
       lambda x, r, s, b: (lambda h: (reference.rms_norm(h, s, dtype=x.dtype, **ref_kw), h))(
           stream(x, r))),
  ]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.impl)
def test_per_head_value_vjp_jvp(backend):
  """Every op, variant and mask through :func:`jaxnorm.testing.check_rule` (value, VJP, JVP,
  adjoint identity under jit); the castings that round ``x_hat`` to the input's dtype on purpose
  are held to that dtype's precision there."""
  def body(case):
    x, r, s, b, m = _data(case)
    tol = (jt.Tolerance(compute_dtype=case["dtype"]) if "casting" in case["variant"]
           else jt.Tolerance())
    for op, ref in _ops(case, backend, m):
      jt.check_rule(op, ref, (x, r, s, b), transforms=(), tolerance=tol)

  backend.given(3, case=cases(backend))(body)


def test_per_head_ensemble_under_vmap_keeps_the_backward_kernels():
  """``grad(vmap)`` over an ensemble of per-head scales: 3 kernels, the values of vmap(grad)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(host_random(rng, (3, 5, 4, 32), jnp.float32, loc=1.0))
  s = jnp.asarray(host_random(rng, (3, 4, 32), jnp.float32, loc=1.0))
  ct = jnp.asarray(host_random(rng, x.shape, jnp.float32))
  kw = PALLAS.kw

  def loss(x, s):
    return jnp.sum(jax.vmap(lambda x, s: jaxnorm.rms_norm(x, s, **kw))(x, s) * ct)

  assert count_pallas_calls(jax.grad(loss, (0, 1)), x, s) == 3
  got = jax.grad(loss, (0, 1))(x, s)
  want = jax.vmap(jax.grad(lambda x, s, c: jnp.sum(jaxnorm.rms_norm(x, s, **kw) * c), (0, 1)))(
      x, s, ct)
  for g, w in zip(got, want):
    assert_close(g, w, jnp.float32)


@pytest.mark.parametrize("shape", [(5, 32), (4, 2, 32), (3, 4, 32, 1)])
def test_bad_parameter_shapes_are_refused(shape):
  x = jnp.ones((2, 3, 4, 32))
  with pytest.raises(ValueError, match=r"scale must have the normalized shape \(32,\) of x .*"
                                       r"per head.*got shape " + re.escape(str(shape))):
    jaxnorm.rms_norm(x, jnp.ones(shape))


def test_per_head_jacobian():
  rng = np.random.default_rng(3)
  x = jnp.asarray(host_random(rng, (2, 3, 16), jnp.float32, loc=1.0))
  s = jnp.asarray(host_random(rng, (3, 16), jnp.float32, loc=1.0))
  jac = jaxnorm.rms_norm_jacobian(x, s)
  want = jax.vmap(jax.vmap(jax.jacrev(lambda row, s: reference.rms_norm(row, s)),
                           in_axes=(0, 0)), in_axes=(0, None))(x, s)
  assert_close(jac, want, jnp.float32)


@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
def test_layers_pass_per_head_parameters_into_the_op(cls, gpu_host):
  """Flax's per-head spelling (feature_axes=(-2, -1), reduction_axes=-1): the NNX and Linen
  layers give Flax's values and gradients, and the op takes the parameters: with impl="auto"
  the gradient program's GPU branch holds the forward and both backward kernels (traced here on
  the CPU, never compiled), where an affine map applied after the op would leave the scale's
  gradient to autodiff."""
  from flax import linen as nn
  from flax import nnx

  from jaxnorm import linen as jln
  from jaxnorm import nnx as jnn

  rng = np.random.default_rng(5)
  x = jnp.asarray(host_random(rng, (2, 5, 4, 16), jnp.float32, loc=0.5))
  dy = jnp.asarray(host_random(rng, x.shape, jnp.float32))
  axes = dict(feature_axes=(-2, -1), reduction_axes=-1)

  def nnx_loss(cls_obj, **kw):
    layer = cls_obj(64, **axes, **kw, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    state = jax.tree.map(lambda p: p + jnp.asarray(host_random(rng, p.shape, p.dtype)), state)
    return (lambda st, x: jnp.sum(nnx.merge(graphdef, st)(x) * dy)), state

  ours, state = nnx_loss(getattr(jnn, cls))
  flax_f, _ = nnx_loss(getattr(nnx, cls))
  g, gf = jax.grad(ours, (0, 1))(state, x), jax.grad(flax_f, (0, 1))(state, x)
  for a, e in zip(jax.tree.leaves(g), jax.tree.leaves(gf)):
    assert_close(a, e, jnp.float32, floor=1.0)
  np.testing.assert_allclose(ours(state, x), flax_f(state, x), rtol=1e-5)
  assert count_pallas_calls(jax.grad(ours, (0, 1)), state, x) == 3

  lin, lin_flax = getattr(jln, cls)(**axes), getattr(nn, cls)(**axes)
  variables = lin_flax.init(jax.random.key(0), x)
  variables = jax.tree.map(lambda p: p + jnp.asarray(host_random(rng, p.shape, p.dtype)),
                           variables)
  assert_close(lin.apply(variables, x), lin_flax.apply(variables, x), jnp.float32, floor=1.0)
  gl = jax.grad(lambda v: jnp.sum(lin.apply(v, x) * dy))(variables)
  glf = jax.grad(lambda v: jnp.sum(lin_flax.apply(v, x) * dy))(variables)
  for a, e in zip(jax.tree.leaves(gl), jax.tree.leaves(glf)):
    assert_close(a, e, jnp.float32, floor=1.0)


@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
def test_layers_per_head_over_several_reduction_axes(cls):
  """Heads before two reduction axes (feature_axes=(-3, -2, -1), reduction_axes=(-2, -1)): the
  parameters go into the op as (heads, *normalized_shape), values and gradients as Flax's."""
  from flax import nnx

  from jaxnorm import nnx as jnn

  rng = np.random.default_rng(9)
  x = jnp.asarray(host_random(rng, (2, 3, 4, 5), jnp.float32, loc=0.5))
  dy = jnp.asarray(host_random(rng, x.shape, jnp.float32))
  axes = dict(reduction_axes=(-2, -1), feature_axes=(-3, -2, -1))
  ours, theirs = (getattr(m, cls)(60, **axes, rngs=nnx.Rngs(0)) for m in (jnn, nnx))
  graphdef, state = nnx.split(ours)
  state = jax.tree.map(lambda p: p + jnp.asarray(host_random(rng, p.shape, p.dtype)), state)
  f_graphdef, _ = nnx.split(theirs)
  loss = lambda g: lambda st, x: jnp.sum(nnx.merge(g, st)(x) * dy)  # noqa: E731
  for a, e in zip(jax.tree.leaves(jax.grad(loss(graphdef), (0, 1))(state, x)),
                  jax.tree.leaves(jax.grad(loss(f_graphdef), (0, 1))(state, x))):
    assert_close(a, e, jnp.float32, floor=1.0)
  assert_close(loss(graphdef)(state, x), loss(f_graphdef)(state, x), jnp.float32, floor=1.0)


def test_list_axis_name_is_hashable_under_jit_and_grad():
  """A list ``axis_name`` works like a tuple under differentiation (the config is static)."""
  from jax.sharding import Mesh, PartitionSpec as P
  if len(jax.devices()) < 2:
    pytest.skip("needs 2 (host) devices")
  mesh = Mesh(np.array(jax.devices()[:2]), ("i",))
  x = jnp.asarray(host_random(np.random.default_rng(1), (4, 16), jnp.float32))
  f = jax.shard_map(lambda x: jaxnorm.layer_norm(x, axis_name=["i"]), mesh=mesh,
                    in_specs=P(None, "i"), out_specs=P(None, "i"))
  g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) ** 3)))(x)
  want = jax.grad(lambda x: jnp.sum(reference.layer_norm(x) ** 3))(x)
  assert_close(g, want, jnp.float32, floor=1.0)
