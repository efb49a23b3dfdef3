"""Forward mode: ``jax.jvp``, ``jax.jacfwd``, ``jax.linearize`` through the ops and the layers.

The tangents are checked against ``jax.jvp`` of :mod:`jaxnorm.reference` (float64 where it
applies) with random tangents on every input, and reverse mode against the same reference:
the ops are ``custom_jvp`` functions whose tangent map transposes to the hand-derived
backward, and ``jax.grad`` must still run that backward (checked with a call counter).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import example, given, settings, strategies as st
from jax.sharding import Mesh, PartitionSpec as P

import jaxnorm
from jaxnorm.backends.xla import formulas as _xla
from jaxnorm.backends.xla.backend import XLA
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm.backends.triton import backward as _pallas_backward
from jaxnorm import reference
from jaxnorm import testing as jt
from _kernels import count_pallas_calls
from jaxnorm.models import TransformerConfig, TransformerLM
from _numerics import assert_close

INTERPRET = jaxnorm.PallasConfig(interpret=True)
VARIANTS = {
    "default": {},
    "outside": dict(epsilon_placement="outside", epsilon=0.1),
    "zero_centered": dict(zero_centered_scale=True),
    "mask": "mask",
}


def _data(dtype=jnp.float64, lead=(3, 4), d=8, seed=0):
  """Random ``x, r, s, b, (tx, tr, ts, tb), mask``, drawn with NumPy: eager ``jax.random`` ops
  would compile once per shape and dtype, seconds of CPU time over this file."""
  rng = np.random.default_rng(seed)
  n = lambda shape, loc=0.0: jnp.asarray((loc + rng.standard_normal(shape)).astype(dtype))  # noqa: E731
  x, r = n(lead + (d,), 0.5), n(lead + (d,))
  s, b = n((d,), 1.0), n((d,))
  tangents = (n(lead + (d,)), n(lead + (d,)), n((d,)), n((d,)))
  mask = rng.random(lead + (d,)) < 0.6
  mask[..., 0] = True
  return x, r, s, b, tangents, jnp.asarray(mask)


def _kw(variant, mask):
  kw = VARIANTS[variant]
  return dict(mask=mask) if kw == "mask" else dict(kw)


def _ops(name, kw):
  """``(ours, reference)`` as functions of ``(x, s, b)``."""
  if name == "layer_norm":
    return (lambda x, s, b: jaxnorm.layer_norm(x, s, b, **kw),
            lambda x, s, b: reference.layer_norm(x, s, b, **kw))
  return (lambda x, s, b: jaxnorm.rms_norm(x, s, **kw) + 0 * b.sum(),
          lambda x, s, b: reference.rms_norm(x, s, **kw) + 0 * b.sum())


def _fused_ops(name, kw, alpha=0.7):
  ours = getattr(jaxnorm, "add_" + name)
  ref = getattr(reference, name)
  if name == "layer_norm":
    f = lambda x, r, s, b: ours(x, r, s, b, residual_scale=alpha, **kw)  # noqa: E731
    g = lambda x, r, s, b: (lambda h: (ref(h, s, b, **kw), h))(x + alpha * r)  # noqa: E731
  else:
    f = lambda x, r, s, b: ours(x, r, s, residual_scale=alpha, **kw)  # noqa: E731
    g = lambda x, r, s, b: (lambda h: (ref(h, s, **kw), h))(x + alpha * r)  # noqa: E731
  return f, g


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_jvp_matches_reference(name, variant, x64):
  """jaxnorm.testing's check: value, JVP (random tangents on x, scale and bias), VJP and the
  adjoint identity between them, under jit, against autodiff of the reference in float64."""
  x, _, s, b, _, mask = _data()
  f, g = _ops(name, _kw(variant, mask))
  jt.check_rule(f, g, (x, s, b), transforms=())


@pytest.mark.parametrize("variant", ["default", "mask"])
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_fused_jvp_matches_reference(name, variant, x64):
  x, r, s, b, (tx, tr, ts, tb), mask = _data()
  f, g = _fused_ops(name, _kw(variant, mask))
  out, tout = jax.jit(lambda *a: jax.jvp(f, a[:4], a[4:]))(x, r, s, b, tx, tr, ts, tb)
  out_ref, tout_ref = jax.jvp(g, (x, r, s, b), (tx, tr, ts, tb))
  for what, a, e in zip(["y", "h", "ty", "th"], out + tout, out_ref + tout_ref):
    assert_close(a, e, what=what)
  # A tangent on the residual only (x's is a symbolic zero), and grad through the same op.
  _, (ty, th) = jax.jvp(lambda r: f(x, r, s, b), (r,), (tr,))
  _, (ty_ref, th_ref) = jax.jvp(lambda r: g(x, r, s, b), (r,), (tr,))
  assert_close(ty, ty_ref, what="ty (residual only)")
  assert_close(th, th_ref, what="th (residual only)")
  loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)[0]) * tx + fn(*a)[1] * tr)  # noqa: E731
  for a, e in zip(jax.grad(loss(f), (0, 1, 2, 3))(x, r, s, b),
                  jax.grad(loss(g), (0, 1, 2, 3))(x, r, s, b)):
    assert_close(a, e, what="grad")


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_jacfwd_equals_jacrev_and_explicit_jacobian(name, x64):
  x, _, s, b, _, mask = _data(lead=(2,), d=6)
  for kw in ({}, dict(mask=mask, epsilon_placement="outside", epsilon=0.1)):
    f, _ = _ops(name, kw)
    jf = jax.jacfwd(f, argnums=(0, 1, 2))(x, s, b)
    jr = jax.jacrev(f, argnums=(0, 1, 2))(x, s, b)
    for a, e in zip(jf, jr):
      assert_close(a, e, what="jacfwd vs jacrev")
    explicit = getattr(jaxnorm, name + "_jacobian")(x, s, **kw)  # (rows, d, d)
    per_row = jnp.stack([jf[0][i, :, i, :] for i in range(x.shape[0])])
    assert_close(per_row, explicit, what="jacfwd vs explicit")


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_linearize_and_its_transpose(name, x64):
  x, _, s, b, (tx, dy, ts, tb), mask = _data()
  f, g = _ops(name, dict(mask=mask))
  _, lin = jax.linearize(f, x, s, b)
  assert_close(lin(tx, ts, tb), jax.jvp(g, (x, s, b), (tx, ts, tb))[1], what="linearize")
  cts = jax.linear_transpose(lin, x, s, b)(dy)
  for a, e in zip(cts, jax.vjp(g, x, s, b)[1](dy)):
    assert_close(a, e, what="linear_transpose")


def test_grad_runs_the_derived_backward(monkeypatch):
  """``jax.grad`` transposes the tangent map into the derived backward, not autodiff of it."""
  calls = []
  backward = _xla.backward

  def counted(*a, **k):
    calls.append(1)
    return backward(*a, **k)

  # The XLA backend's table holds the formula itself: its entries are what the dispatch runs.
  for name in ("layer_norm", "rms_norm"):
    monkeypatch.setitem(XLA._table, (name, "backward"), counted)
  x, r, s, b, (tx, _, _, _), _ = _data(jnp.float32)
  # impl="xla": with "auto" the GPU branch's kernel call is typed from the XLA backward too.
  loss = lambda x, s, b: jnp.sum(jnp.sin(jaxnorm.layer_norm(x, s, b, impl="xla")) * tx)  # noqa: E731
  # The backward runs at trace time, so tracing (no compilation) is enough to count it.
  grad_jaxpr = str(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(x, s, b))
  assert len(calls) == 1
  assert "jaxnorm_norm_tangent" not in grad_jaxpr  # transposed away
  jax.make_jaxpr(jax.grad(lambda x: jnp.sum(jaxnorm.add_rms_norm(x, r, s, impl="xla")[0] * tx)))(x)
  assert len(calls) == 2
  jvp_jaxpr = str(jax.make_jaxpr(lambda x: jax.jvp(lambda x: loss(x, s, b), (x,), (tx,)))(x))
  assert len(calls) == 2  # forward mode: none
  assert "jaxnorm_norm_tangent" in jvp_jaxpr


def _model_loss(position, seed=0):
  cfg = TransformerConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=1, d_ff=16, max_len=4,
                          norm_position=position, norm_impl="jaxnorm")
  graphdef, params = nnx.split(TransformerLM(cfg, rngs=nnx.Rngs(seed)))
  tokens = jnp.asarray(np.random.default_rng(seed).integers(0, 16, (1, 4)))

  def loss(p):
    logits = nnx.merge(graphdef, p)(tokens)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0] * jnp.cos(logits[..., 1]))
  return loss, params


@pytest.mark.slow
@pytest.mark.parametrize("position", ["pre", "post"])
def test_hessian_vector_product_both_ways(position):
  loss, params = _model_loss(position)
  rng = np.random.default_rng(1)
  v = jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape).astype(a.dtype)), params)
  # Eagerly (op by op): the compiled ops are shared by both positions and both ways, which
  # costs less CPU time than compiling whole programs. Forward over reverse is the linearized
  # gradient applied to v; reverse over reverse its transpose (what jax.vjp of the gradient
  # runs), equal for a symmetric Hessian. One linearization serves both.
  _, hvp = jax.linearize(jax.grad(loss), params)
  fwd_over_rev = hvp(v)
  (rev_over_rev,) = jax.linear_transpose(hvp, params)(v)
  for a, e in zip(jax.tree.leaves(fwd_over_rev), jax.tree.leaves(rev_over_rev)):
    assert_close(a, e, jnp.float32, tol=1e-4, floor=1e-3, what=f"HVP {position}")


def test_transforms_compose():
  """vmap of jvp, jvp of vmap (per-example scale too), scan, checkpoint, all under jit."""
  x, _, s, b, (tx, _, ts, tb), mask = _data(jnp.float32)
  f, g = _ops("layer_norm", dict(mask=mask[0]))
  jvp = lambda fn: lambda *a: jax.jvp(fn, a[:3], a[3:])[1]  # noqa: E731
  s2, ts2 = jnp.stack([s] * 3) * jnp.arange(1.0, 4.0)[:, None], jnp.stack([ts] * 3)
  per = lambda fn: jax.vmap(fn, (0, 0, None))  # noqa: E731  (a batched scale)

  def layers(fn, remat):
    body = jax.checkpoint(fn) if remat else fn
    return lambda x, s, b: jax.lax.scan(lambda h, _: (body(h, s, b), None), x, None, 2)[0]

  def checks(fn, *args):  # {what: value} of every composition, for ours and the reference
    out = {"vmap of jvp": jax.vmap(jvp(fn), (0, None, None, 0, None, None))(*args),
           "jvp of vmap": jvp(jax.vmap(fn, (0, None, None)))(*args),
           "batched scale": jvp(per(fn))(x, s2, b, tx, ts2, tb)}
    for remat in (False, True):
      out[f"scan remat={remat}"] = jvp(layers(fn, remat))(*args)
      out[f"grad scan remat={remat}"] = jax.grad(
          lambda x, remat=remat: jnp.sum(layers(fn, remat)(x, s, b) * tx))(x)
    return out

  args = (x, s, b, tx, ts, tb)
  got = jax.jit(functools.partial(checks, f))(*args)  # one program: one compilation
  want = checks(g, *args)
  for what in want:
    assert_close(got[what], want[what], what=what)


def _any_op(name, **kw):
  """One of the ops as a function of ``(x, r, s, b)`` returning ``y``."""
  if name == "add_layer_norm":
    return lambda x, r, s, b: jaxnorm.add_layer_norm(x, r, s, b, **kw)[0]
  if name == "layer_norm":
    return lambda x, r, s, b: jaxnorm.layer_norm(x, s, b, **kw)
  return lambda x, r, s, b: jaxnorm.rms_norm(x, s, **kw)


@pytest.mark.parametrize("name", ["layer_norm", "add_layer_norm", "rms_norm"])
def test_shard_map_axis_name(name):
  mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
  x, r, s, b, (tx, tr, ts, tb), mask = _data(jnp.float32, lead=(4,), d=16)
  row, par = P(None, "model"), P("model")
  sharded = jax.shard_map(
      lambda x, r, s, b, m: _any_op(name, mask=m, axis_name="model")(x, r, s, b),
      mesh=mesh, in_specs=(row, row, par, par, row), out_specs=row)
  ours = lambda x, r, s, b: sharded(x, r, s, b, mask)  # noqa: E731
  op = _any_op(name, mask=mask)
  got = jax.jit(lambda *a: jax.jvp(ours, a[:4], a[4:]))(x, r, s, b, tx, tr, ts, tb)
  want = jax.jvp(op, (x, r, s, b), (tx, tr, ts, tb))
  assert_close(got[0], want[0], what="y")
  assert_close(got[1], want[1], what="tangent")
  grad = lambda fn: jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a)) * tx), (0, 1, 2, 3))  # noqa: E731
  for a, e in zip(jax.jit(grad(ours))(x, r, s, b), grad(op)(x, r, s, b)):
    assert_close(a, e, what="grad")


# bfloat16: inputs, tangents and outputs in bfloat16, statistics in float32; compared with the
# reference's jvp at the same (upcast) inputs with the bfloat16 tolerance of _numerics.TOL
# (3e-2 norm-wise: the output's and the tangents' rounding).
# Two drawn examples and one fixed bfloat16 one (odd d, two leading axes, a mask): the
# float32 variants are also covered by test_jvp_matches_reference in float64.
@settings(max_examples=2)
@example(name="rms_norm", lead=(2, 3), d=17, dtype=jnp.bfloat16, variant="mask", seed=1)
@given(name=st.sampled_from(["layer_norm", "rms_norm"]),
       lead=st.sampled_from([(1,), (3,), (2, 3)]), d=st.sampled_from([1, 3, 8, 17]),
       dtype=st.sampled_from([jnp.float32, jnp.bfloat16]), variant=st.sampled_from(list(VARIANTS)),
       seed=st.integers(0, 2**16))
def test_jvp_property(name, lead, d, dtype, variant, seed):
  x, _, s, b, (tx, _, ts, tb), mask = _data(dtype, lead=lead, d=d, seed=seed)
  f, g = _ops(name, _kw(variant, mask))
  up = lambda *a: [u.astype(jnp.float32) for u in a]  # noqa: E731
  _, ty = jax.jvp(f, (x, s, b), (tx, ts, tb))
  _, ty_ref = jax.jvp(g, up(x, s, b), up(tx, ts, tb))
  assert ty.dtype == dtype
  scale = float(jnp.max(jnp.abs(s.astype(jnp.float32)))) * 10.0
  assert_close(ty, ty_ref, dtype, floor=scale, what="tangent")


def test_nnx_and_linen_layers():
  x, _, _, _, (tx, _, _, _), _ = _data(jnp.float32)
  for ours, theirs in ((jnn.LayerNorm, nnx.LayerNorm), (jnn.RMSNorm, nnx.RMSNorm)):
    a, c = ours(8, rngs=nnx.Rngs(0)), theirs(8, rngs=nnx.Rngs(0))
    jvp_a = nnx.jit(lambda m, x, t: jax.jvp(lambda x: m(x), (x,), (t,)))(a, x, tx)
    jvp_c = jax.jvp(lambda x: c(x), (x,), (tx,))
    for u, w in zip(jvp_a, jvp_c):
      assert_close(u, w, what=f"nnx {ours.__name__}")
    # Forward mode with respect to the parameters, through nnx.split / merge.
    graphdef, state = nnx.split(a)
    j = jax.jacfwd(lambda st: nnx.merge(graphdef, st)(x))(state)
    graphdef_c, state_c = nnx.split(c)
    j_c = jax.jacfwd(lambda st: nnx.merge(graphdef_c, st)(x))(state_c)
    for u, w in zip(jax.tree.leaves(j), jax.tree.leaves(j_c)):
      assert_close(u, w, what=f"nnx jacfwd {ours.__name__}")
  for ours, theirs in ((jln.LayerNorm, nn.LayerNorm), (jln.RMSNorm, nn.RMSNorm)):
    v = theirs().init(jax.random.key(0), x)
    vt = jax.tree.map(lambda p: jnp.full_like(p, 0.3), v)
    got = jax.jvp(lambda v, x: ours().apply(v, x), (v, x), (vt, tx))
    want = jax.jvp(lambda v, x: theirs().apply(v, x), (v, x), (vt, tx))
    for u, w in zip(got, want):
      assert_close(u, w, what=f"linen {ours.__name__}")


@pytest.mark.parametrize("name", ["layer_norm", "add_rms_norm"])
def test_pallas_interpret(name, monkeypatch):
  """impl="pallas" (interpret mode): forward kernel for the primal, XLA tangent, and the
  backward kernel (not XLA's backward) when the tangent map is transposed."""
  called = []
  kernel = "norm_backward" if name == "layer_norm" else "add_norm_backward"
  for mod, fn_name in ((_pallas_backward, kernel), (_xla, "backward")):
    real = getattr(mod, fn_name)
    monkeypatch.setattr(mod, fn_name, functools.partial(
        lambda real, n, *a, **k: (called.append(n), real(*a, **k))[1], real, fn_name))
  x, r, s, b, (tx, tr, ts, tb), _ = _data(jnp.float32, lead=(4,), d=16)
  if name == "layer_norm":
    f = lambda x, r, s, b, **k: jaxnorm.layer_norm(x, s, b, **k)  # noqa: E731
  else:
    f = lambda x, r, s, b, **k: jaxnorm.add_rms_norm(x, r, s, **k)[0]  # noqa: E731
  args, tans = (x, r, s, b), (tx, tr, ts, tb)
  got = jax.jvp(lambda *a: f(*a, impl="pallas", pallas=INTERPRET), args, tans)
  want = jax.jvp(lambda *a: f(*a, impl="xla"), args, tans)
  for u, w in zip(got, want):
    assert_close(u, w, what="pallas jvp")
  jac = lambda impl, **k: jax.jacfwd(lambda x: f(x, r[:2], s, b, impl=impl, **k))(x[:2])  # noqa: E731  (vmap)
  assert_close(jac("pallas", pallas=INTERPRET), jac("xla"), what="pallas jacfwd")
  called.clear()
  grad = lambda impl, **k: jax.grad(  # noqa: E731
      lambda *a: jnp.sum(jnp.sin(f(*a, impl=impl, **k)) * tx), (0, 1, 2))
  g_pallas = grad("pallas", pallas=INTERPRET)(*args)
  # The backward kernel runs once; the XLA backward is only traced abstractly, to type the
  # kernel call (jaxnorm.backends.triton.kernel_call), and the program holds the forward and both backward
  # kernels, nothing else of the norm's.
  assert called.count(kernel) == 1, called
  assert count_pallas_calls(grad("pallas", pallas=INTERPRET), *args) == 3
  for u, w in zip(g_pallas, grad("xla")(*args)):
    assert_close(u, w, what="pallas grad")


def test_flax_forward_mode_transforms_with_the_layer_swapped():
  """Flax's own forward-mode examples (``nnx.jvp``'s and ``nn.jvp``'s docstrings), with the
  module they differentiate replaced by a norm layer from Flax and from jaxnorm: same values."""
  x, _, _, _, (tx, _, _, _), _ = _data(jnp.float32)

  def nnx_example(lib, cls):
    m = getattr(lib, cls)(8, rngs=nnx.Rngs(0))
    f = lambda m, x: jnp.sum(jnp.sin(m(x)))  # noqa: E731
    if hasattr(nnx, "jvp"):  # Flax >= 0.12.5
      m_tangent = jax.tree.map(lambda p: jnp.full_like(p, 0.5), m)
      return nnx.jvp(f, (m, x), (m_tangent, tx), graph=False)
    # Older Flax has no nnx.jvp: the same computation spelled with split/merge and jax.jvp.
    graphdef, state = nnx.split(m)
    state_tangent = jax.tree.map(lambda p: jnp.full_like(p, 0.5), state)
    return jax.jvp(lambda s, x: f(nnx.merge(graphdef, s), x), (state, x), (state_tangent, tx))

  def linen_example(lib, cls):
    class Foo(nn.Module):
      @nn.compact
      def __call__(self, x):
        norm = getattr(lib, cls)()
        vars_t = jax.tree.map(lambda p: jnp.full_like(p, 0.5), norm.variables.get("params", {}))
        return nn.jvp(lambda mdl, x: mdl(x), norm, (x,), (tx,),
                      variable_tangents={"params": vars_t})

    v = Foo().init(jax.random.key(0), x)
    return Foo().apply(v, x)

  for cls in ("LayerNorm", "RMSNorm"):
    for u, w in zip(jax.tree.leaves(nnx_example(jnn, cls)), jax.tree.leaves(nnx_example(nnx, cls))):
      # (a sum of x.size sines: it may cancel to ~0, so the floor is its natural magnitude)
      assert_close(u, w, jnp.float32, floor=float(x.size), what=f"nnx.jvp {cls}")
    for u, w in zip(jax.tree.leaves(linen_example(jln, cls)),
                    jax.tree.leaves(linen_example(nn, cls))):
      assert_close(u, w, jnp.float32, what=f"nn.jvp {cls}")
