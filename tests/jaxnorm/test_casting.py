"""Casting modes (``casting=``), remat-policy names and backward determinism.

- Forward: every mode against the published formula (``tests/_published.py``) and
  :mod:`jaxnorm.reference` in that order of casts (RMSNorm, plain and fused): bit for bit when
  both are jitted in one program (XLA computes their identical statistics once), within a few
  units in the last place when they are compiled apart or run eagerly (another program may sum
  the squares in another order, which differs between CPUs); LayerNorm's shifted-data
  statistics differ from the reference's two-pass ones by float32 rounding, so it is compared
  at the output dtype's tolerance. The default mode is Flax's ``RMSNorm``: jitted, the same
  optimized program but for the float range's guard (asserted with it patched out), and the
  same outputs bit for bit.
- Backward: ``jax.vjp`` with random cotangents against autodiff of the reference, at the
  dtype's tolerance, on the XLA path and in the Pallas kernels (interpret mode on a CPU).
- The residuals carry ``jaxnorm.INPUT_RESIDUAL``/``STATS_RESIDUAL``: a policy naming them saves
  them, one that does not recomputes them, and gradients do not change but for the float32
  rounding of the recomputation.
- Two runs of the backward give bitwise the same ``dx``, ``dscale``, ``dbias``.
- A pre-norm decoder with ``casting="llama"`` against hand-written Llama RMSNorms: bitwise
  equal bfloat16 logits, both models in one jitted program.

``docs/bitwise.md`` lists every bitwise comparison of the suite and why it holds on any CPU.
"""

import contextlib
import dataclasses
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxnorm
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm import reference
from jaxnorm.models import TransformerConfig, TransformerLM
from _numerics import (assert_bitwise, assert_close, assert_ulp_close, compiled, random,
                       reductions, tol_for, ulp_distance)
from _published import PUBLISHED, hf_llama

CASTINGS = ("float32", "llama", "t5")
DTYPES = ("float32", "bfloat16", "float16")
PALLAS = jaxnorm.PallasConfig(interpret=not jaxnorm.pallas_compiles_on())
EPS = 1e-6
# jaxnorm and a formula compiled as two programs (or run eagerly, op by op) share no statistics:
# each sums the d squares itself, and XLA:CPU may order a float32 sum differently in each (its
# vectorization differs with the instruction set: AVX2 vs AVX-512) or contract a multiply and
# an add differently. That moves the float32 mean square by an ulp or two, rsqrt halves the
# relative change and y adds its own roundings: within 4 float32 ulps (2 seen on an AVX2 AMD
# EPYC). A half-precision output rounds once from float32 values that far apart: at most one
# ulp of it, and "llama"/"t5" round twice (x_hat, then the product): 2 ulps.
APART_ULP = {"float32": 4, "bfloat16": 2, "float16": 2}
# XLA's default --xla_allow_excess_precision=true lets it compute a half-precision jax.numpy
# operation followed by a cast to float32 without rounding it (jaxnorm writes each rounding as
# an explicit pair of casts, which it keeps). The reference's half-precision products rely on
# jax.numpy's rounding, so where it and jaxnorm are compared bit for bit the program is
# compiled without that licence (e.g. "t5" with a float32 x and a bfloat16 scale: the product
# rounds to bfloat16 before the float32 output, as in HF's T5LayerNorm).
EXACT = {"xla_allow_excess_precision": False}


def _one_program(ours, theirs, *args, options=None, shared=True):
  """``(ours(*args), theirs(*args))`` jitted together, after checking that XLA computed their
  statistics once (common-subexpression elimination: the program holds no more reductions than
  ``ours`` alone), so that both outputs come from the same float32 mean square; and
  ``ours(*args)`` jitted alone. ``shared=False`` skips the check, for a program where XLA's
  fusion gives each side its own copy of one statistics fusion (the same instructions, so the
  same roundings)."""
  (a, b), program = compiled(lambda *a: (ours(*a), theirs(*a)), *args, options=options)
  alone, alone_program = compiled(ours, *args, options=options)
  if shared:
    assert reductions(program) == reductions(alone_program), "the statistics are not shared"
  return a, b, alone


def _impl(impl):
  """``impl=`` and, for the kernels, ``pallas=`` (interpret mode where they do not compile)."""
  return dict(impl=impl, pallas=PALLAS) if impl == "pallas" else dict(impl=impl)


def _inputs(seed, shape, x_dtype, s_dtype, *, bias=False, loc=1.0):
  ks = jax.random.split(jax.random.key(seed), 4)
  d = shape[-1]
  x = random(ks[0], shape, x_dtype, scale=2.0)
  s = random(ks[1], (d,), s_dtype, loc=loc, scale=0.4)
  b = random(ks[2], (d,), s_dtype, scale=0.5) if bias else None
  return x, s, b, ks[3]


# ---------------------------------------------------------------------------- forward: bitwise


@pytest.mark.parametrize("name", sorted(PUBLISHED))
@pytest.mark.parametrize("x_dtype,s_dtype", [("float32", "same"), ("bfloat16", "same"),
                                             ("float16", "same"), ("bfloat16", "float32")])
def test_forward_is_the_published_formula(name, x_dtype, s_dtype):
  fn, casting, zc = PUBLISHED[name]
  s_dtype = x_dtype if s_dtype == "same" else s_dtype
  x, s, _, _ = _inputs(0, (6, 40), x_dtype, s_dtype, loc=0.0 if zc else 1.0)
  want = jax.jit(fn, static_argnums=2)(x, s, EPS)
  op = lambda x, s: jaxnorm.rms_norm(x, s, epsilon=EPS, casting=casting,  # noqa: E731
                                     zero_centered_scale=zc, dtype=want.dtype)
  published = lambda x, s: fn(x, s, EPS)  # noqa: E731
  apart = APART_ULP[want.dtype.name]
  if casting == "float32":
    # The float32 mode forms x (r gamma) (Flax's order, test_float32_mode_is_flax_bitwise), the
    # published formula (x r) gamma: each rounds twice, so they are two units in the last place
    # of the output's dtype apart, plus the statistics' own difference when not shared.
    ours, theirs, alone = _one_program(op, published, x, s)
    assert_ulp_close(ours, theirs, 2, what=f"{name} (one program)")
    for got, ref in ((alone, want), (op(x, s), fn(x, s, EPS))):
      assert_ulp_close(got, ref, 2 + apart, what=name)
    return
  # Like with like: in one jitted program XLA computes the identical statistics once and each
  # output rounds where its formula does (the same operations, bit for bit on any CPU).
  # Compiled apart (and eagerly, where a mean over 40 compiled alone may round differently from
  # one inside a bigger program), each sums the squares in its own order.
  ours, theirs, alone = _one_program(op, published, x, s)
  assert_bitwise(ours, theirs, f"{name} x={x_dtype} scale={s_dtype} (one program)")
  assert_ulp_close(alone, want, apart, what=f"{name} x={x_dtype} (jit apart)")
  assert_ulp_close(op(x, s), fn(x, s, EPS), apart, what=f"{name} x={x_dtype} (eager)")


@pytest.mark.parametrize("x_dtype,p_dtype", [("float32", "float32"), ("bfloat16", "bfloat16"),
                                             ("float16", "float16"), ("bfloat16", "float32")])
def test_float32_mode_is_flax_bitwise(x_dtype, p_dtype, monkeypatch):
  """The default ("float32") RMSNorm, op and Linen layer, jitted, is the program Flax's
  ``RMSNorm`` compiles to (the same statistics and the same order,
  ``x * (rsqrt(ms + eps) * scale)``) plus the float range's guard, a select that returns ``r``
  unchanged wherever it is positive (``jaxnorm._math.past_range_guard``): without the guard, the
  same optimized XLA program (asserted); with it, the same outputs bit for bit (asserted).
  Eagerly (op by op) and with a mask the programs differ: within 4 float32 ulps, or one ulp of a
  half-precision output."""
  from flax import linen as nn
  from jaxnorm import _math
  x, s, _, _ = _inputs(3, (6, 40), x_dtype, p_dtype)
  mask = (jax.random.uniform(jax.random.key(5), x.shape) < 0.7).at[:, 0].set(True)

  def flax(x, s, mask=None):
    return nn.RMSNorm(epsilon=EPS).apply({"params": {"scale": s}}, x, mask=mask)

  def layer(x, s, mask=None):
    return jln.RMSNorm(epsilon=EPS).apply({"params": {"scale": s}}, x, mask=mask)

  def ours(x, s, mask=None):
    return jaxnorm.rms_norm(x, s, epsilon=EPS, mask=mask, dtype=jax.eval_shape(flax, x, s).dtype)

  want, program = compiled(flax, x, s)
  with monkeypatch.context() as m:
    m.setattr(_math, "past_range_guard", lambda r: r)
    for name, f in (("rms_norm", ours), ("jaxnorm.linen.RMSNorm", layer)):
      _, unguarded = compiled(lambda x, s, f=f: f(x, s), x, s)  # a new function: traced anew
      assert unguarded == program, f"{name} without the guard: not Flax's program"
  for name, f in (("rms_norm", ours), ("jaxnorm.linen.RMSNorm", layer)):
    got, _ = compiled(f, x, s)
    assert_bitwise(got, want, f"{name} x={x_dtype} scale={p_dtype}")
    # Eager and masked: other programs (APART_ULP in float32); a half-precision output rounds
    # once from float32 values a few float32 ulps apart, so at most one ulp of it.
    apart = 4 if want.dtype == jnp.float32 else 1
    assert_ulp_close(f(x, s), flax(x, s), apart, what=f"{name} eager")
    assert_ulp_close(jax.jit(f)(x, s, mask), jax.jit(flax)(x, s, mask), apart, what=f"{name} mask")


@settings(max_examples=4)
@given(st.data())
def test_rms_forward_matches_reference_bitwise(data):
  casting = data.draw(st.sampled_from(CASTINGS), "casting")
  x_dtype = data.draw(st.sampled_from(DTYPES), "x_dtype")
  s_dtype = data.draw(st.sampled_from(DTYPES), "s_dtype")
  lead = data.draw(st.lists(st.integers(1, 5), min_size=0, max_size=2), "lead")
  d = data.draw(st.integers(1, 48), "d")
  zc = data.draw(st.booleans(), "zero_centered_scale")
  fused = data.draw(st.booleans(), "fused")
  x, s, _, key = _inputs(1, (*lead, d), x_dtype, s_dtype)
  kw = dict(epsilon=EPS, casting=casting, zero_centered_scale=zc)
  # One program (the statistics computed once), compiled with the reference's roundings kept
  # (EXACT): the same roundings in the same places, bit for bit on any CPU.
  if fused:
    r = random(key, x.shape, x_dtype)
    y, want, _ = _one_program(lambda x, r, s: jaxnorm.add_rms_norm(x, r, s, **kw)[0],
                              lambda x, r, s: reference.rms_norm(
                                  jaxnorm.add_rms_norm(x, r, s, **kw)[1], s, **kw),
                              x, r, s, options=EXACT)
    assert_bitwise(y, want, "add_rms_norm")
  else:
    y, want, _ = _one_program(lambda x, s: jaxnorm.rms_norm(x, s, **kw),
                              lambda x, s: reference.rms_norm(x, s, **kw), x, s, options=EXACT)
    assert_bitwise(y, want, "rms_norm")


@pytest.mark.parametrize("casting,dtype", [("llama", "bfloat16"), ("t5", "float16")])
def test_layer_norm_forward_matches_reference(casting, dtype):
  x, s, b, _ = _inputs(2, (8, 24), dtype, dtype, bias=True)
  y = jaxnorm.layer_norm(x, s, b, casting=casting)
  want = reference.layer_norm(x, s, b, casting=casting)
  assert y.dtype == want.dtype
  # One rounding of a float32 statistic may flip the last bit of u or of y: 2 ulps at most.
  ulp = float(jnp.finfo(dtype).eps)
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(want, np.float32),
                             rtol=2 * ulp, atol=2 * ulp)


def test_modes_differ_in_half_precision():
  # The modes are not aliases: in bfloat16 each rounds differently somewhere.
  x, s, _, _ = _inputs(3, (16, 64), "bfloat16", "bfloat16")
  ys = {c: np.asarray(jaxnorm.rms_norm(x, s, casting=c), np.float32) for c in CASTINGS}
  assert np.any(ys["float32"] != ys["llama"])
  x32 = x.astype(jnp.float32)  # t5 differs from llama when x and scale dtypes differ
  assert np.any(np.asarray(jaxnorm.rms_norm(x32, s, casting="llama", dtype=jnp.bfloat16))
                != np.asarray(jaxnorm.rms_norm(x32, s, casting="t5", dtype=jnp.bfloat16)))


# ---------------------------------------------------------------------------- backward


def _vjp_pair(kind, casting, *, x_dtype, s_dtype, fused, zc, impl, seed, shape=(5, 24)):
  """(ours, autodiff) gradients for one configuration, with random cotangents."""
  center = kind == "layer_norm"
  x, s, b, key = _inputs(seed, shape, x_dtype, s_dtype, bias=center, loc=0.0 if zc else 1.0)
  kr, ky, kh = jax.random.split(key, 3)
  r = random(kr, shape, x_dtype)
  kw = dict(epsilon=1e-5, casting=casting, zero_centered_scale=zc)
  ref = reference.layer_norm if center else reference.rms_norm
  params = (s, b) if center else (s,)
  dy = random(ky, shape, x_dtype)

  if fused:
    op = jaxnorm.add_layer_norm if center else jaxnorm.add_rms_norm
    dh = random(kh, shape, x_dtype)

    def ref_f(x, r, *p):  # the add rounded straight-through, as the op stores h
      h = x.astype(jnp.float32) + r.astype(jnp.float32)
      h = h + jax.lax.stop_gradient(h.astype(x_dtype).astype(jnp.float32) - h)
      return ref(h.astype(x_dtype), *p, **kw), h.astype(x_dtype)

    ours = jax.jit(lambda *a: jax.vjp(lambda x, r, *p: op(x, r, *p, **_impl(impl), **kw), *a)[1](
        (dy, dh)))(x, r, *params)
    want = jax.jit(lambda *a: jax.vjp(ref_f, *a)[1]((dy, dh)))(x, r, *params)
  else:
    op = jaxnorm.layer_norm if center else jaxnorm.rms_norm
    ours = jax.jit(lambda *a: jax.vjp(lambda x, *p: op(x, *p, **_impl(impl), **kw), *a)[1](dy))(
        x, *params)
    want = jax.jit(lambda *a: jax.vjp(lambda x, *p: ref(x, *p, **kw), *a)[1](dy))(x, *params)
  return ours, want


@settings(max_examples=4)
@given(st.data())
def test_gradients_match_autodiff_of_the_published_order(data):
  kind = data.draw(st.sampled_from(["rms_norm", "layer_norm"]), "kind")
  casting = data.draw(st.sampled_from(CASTINGS), "casting")
  x_dtype = data.draw(st.sampled_from(DTYPES), "x_dtype")
  s_dtype = data.draw(st.sampled_from([x_dtype, "float32"]), "s_dtype")
  fused = data.draw(st.booleans(), "fused")
  zc = data.draw(st.booleans(), "zero_centered_scale")
  d = data.draw(st.integers(2, 40), "d")
  rows = data.draw(st.integers(1, 6), "rows")
  ours, want = _vjp_pair(kind, casting, x_dtype=x_dtype, s_dtype=s_dtype, fused=fused, zc=zc,
                         impl="xla", seed=d, shape=(rows, d))
  for name, a, e in zip(["dx", "dr"] if fused else ["dx"], ours, want):
    assert a.dtype == e.dtype, name
    assert_close(a, e, x_dtype, what=name)
  for name, a, e in zip(["dscale", "dbias"], ours[1 + fused:], want[1 + fused:]):
    # autodiff sums the bfloat16 products in bfloat16; ours in float32: compare at the
    # coarser of the two dtypes.
    assert a.dtype == e.dtype, name
    assert_close(a, e, max((x_dtype, s_dtype), key=tol_for), what=name)


def _outputs(kind, fused, casting, impl, x, r, params, dy):
  """``[y, dx, (dr,) dscale, (dbias)]`` of one configuration, jitted."""
  op = {("layer_norm", False): jaxnorm.layer_norm, ("layer_norm", True): jaxnorm.add_layer_norm,
        ("rms_norm", False): jaxnorm.rms_norm, ("rms_norm", True): jaxnorm.add_rms_norm}[
            (kind, fused)]

  def f(x, r, *p):
    def g(x, r, *p):
      return op(x, r, *p, casting=casting, **_impl(impl))[0] if fused else op(
          x, *p, casting=casting, **_impl(impl))
    y, vjp = jax.vjp(g, x, r, *p) if fused else jax.vjp(lambda x, *p: g(x, None, *p), x, *p)
    return [y, *vjp(dy)]

  return jax.jit(f)(x, r, *params)


def _n_diff(a, b):
  return int(np.sum(ulp_distance(a, b) != 0))


@pytest.mark.parametrize("kind,fused,dtype,casting", [("rms_norm", False, "bfloat16", "llama"),
                                                      ("rms_norm", True, "float16", "t5"),
                                                      ("layer_norm", True, "bfloat16", "llama")])
def test_pallas_kernels_follow_the_casts(kind, fused, dtype, casting):
  # The kernels round where the XLA path does: they agree with it (up to a rare last-bit flip
  # from their differently ordered float32 sums) far more closely than the XLA path's mode
  # agrees with the float32 mode, for y, dx and dscale.
  x, s, b, key = _inputs(4, (6, 40), dtype, dtype, bias=kind == "layer_norm")
  ky, kr = jax.random.split(key)
  dy, r = random(ky, x.shape, dtype), random(kr, x.shape, dtype)
  params = (s, b) if kind == "layer_norm" else (s,)
  kern = _outputs(kind, fused, casting, "pallas", x, r, params, dy)
  xla = _outputs(kind, fused, casting, "xla", x, r, params, dy)
  base = _outputs(kind, fused, "float32", "xla", x, r, params, dy)
  for name, k, a, f in zip(["y", "dx", "dr" if fused else "dscale"], kern, xla, base):
    assert k.dtype == a.dtype, name
    mode_effect = _n_diff(a, f)
    assert mode_effect > 0, f"{name}: the mode changed nothing; the test could not fail"
    assert _n_diff(k, a) <= mode_effect // 8, (name, _n_diff(k, a), mode_effect)
  for k, a in zip(kern, xla):
    assert_close(k, a, dtype)


# ---------------------------------------------------------------------------- remat names


def _block(casting):
  def f(x, r, s, w):
    y, h = jaxnorm.add_rms_norm(jnp.sin(x), r, s, casting=casting)  # h built inside
    z = jaxnorm.layer_norm(jnp.cos(x) * w, s, casting=casting)  # the plain op's x too
    return jnp.tanh(y * w) + h + z

  return f


def _saved(f, *args):
  """The lines of ``jax.ad_checkpoint.print_saved_residuals``: one per saved residual."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(f, *args)
  return out.getvalue().strip().splitlines()


@pytest.mark.parametrize("casting", ["llama"])
def test_checkpoint_names_let_a_policy_keep_or_drop_the_residuals(casting):
  ks = jax.random.split(jax.random.key(6), 5)
  x, r, w = (random(k, (4, 16), "float32") for k in ks[:3])
  s = random(ks[3], (16,), "float32", loc=1.0)
  dy = random(ks[4], (4, 16), "float32")
  names = (jaxnorm.INPUT_RESIDUAL, jaxnorm.STATS_RESIDUAL)
  assert names == ("jaxnorm_input", "jaxnorm_stats")  # documented, stable
  pol = jax.checkpoint_policies
  keep = jax.checkpoint(_block(casting), policy=pol.save_only_these_names(*names))
  drop = jax.checkpoint(_block(casting), policy=pol.save_any_names_but_these(*names))
  kept = _saved(keep, x, r, s, w)
  # h of the fused op and x of the plain one; rstd, and LayerNorm's pivot, offset and rstd.
  assert sum(jaxnorm.INPUT_RESIDUAL in d for d in kept) == 2, kept
  assert sum(jaxnorm.STATS_RESIDUAL in d for d in kept) == 4, kept
  dropped = _saved(drop, x, r, s, w)
  assert not any(n in d for n in names for d in dropped), dropped
  assert len(dropped) < len(kept)
  grads = [jax.vjp(f, x, r, s, w)[1](dy) for f in (_block(casting), keep, drop)]
  # Not bit for bit: a policy changes the program (what is saved, what is recomputed, and so
  # what XLA fuses with what: the order of the float32 sums of the backward, the FMAs it forms),
  # and differently per CPU (6 of 64 dx entries differ on an AVX2 AMD EPYC, 20 at LLVM -O3 on
  # an AVX-512 Xeon). Each entry is a sum of a few float32 terms no larger than the largest
  # entry: a few roundings of those, within 4 ulps of the largest |entry| (2 seen).
  for g in grads[1:]:
    for a, e in zip(g, grads[0]):
      assert_ulp_close(a, e, 4, of="max", what="gradient under a remat policy")


# ---------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("impl,kind", [("xla", "rms_norm"), ("xla", "layer_norm"),
                                       ("pallas", "layer_norm")])
def test_backward_is_deterministic(impl, kind):
  shape = (24, 64) if impl == "pallas" else (256, 384)
  dtype = "bfloat16"
  center = kind == "layer_norm"
  x, s, b, key = _inputs(7, shape, dtype, "float32", bias=center)
  ky, kr = jax.random.split(key)
  dy, r = random(ky, shape, dtype), random(kr, shape, dtype)
  op = jaxnorm.add_layer_norm if center else jaxnorm.add_rms_norm
  params = (s, b) if center else (s,)

  def grads(x, r, *p):
    def f(x, r, *p):
      return op(x, r, *p, casting="llama", **_impl(impl))[0]
    return jax.vjp(f, x, r, *p)[1](dy)

  run = jax.jit(grads)
  runs = [run(x, r, *params), run(x, r, *params)]
  if impl == "xla":  # also a second compilation (the kernels' is slow in interpret mode)
    # A compile option that changes no arithmetic (the HLO is kept beside the executable) gives
    # the program another key, so this is compiled again rather than loaded from the persistent
    # compilation cache or found in memory; jax.clear_caches() would have emptied every other
    # cache of the process too, for the rest of the session.
    again = run.lower(x, r, *params).compile({"xla_embed_ir_in_executable": True})
    runs.append(again(x, r, *params))
  for other in runs[1:]:
    for a, e in zip(other, runs[0]):
      assert_bitwise(a, e, f"{impl} {kind} backward")  # one program, run twice: exact


# ---------------------------------------------------------------------------- layers and model


def test_invalid_casting_is_rejected_at_the_boundary():
  x = jnp.ones((2, 8))
  calls = [
      lambda: jaxnorm.rms_norm(x, casting="bf16"),
      lambda: jaxnorm.layer_norm(x, casting="bf16"),
      lambda: jaxnorm.add_rms_norm(x, x, casting="bf16"),
      lambda: jaxnorm.add_layer_norm(x, x, casting="bf16"),
      lambda: jnn.RMSNorm(8, casting="bf16", rngs=nnx.Rngs(0)),
      lambda: jnn.LayerNorm(8, casting="bf16", rngs=nnx.Rngs(0)),
      lambda: jln.RMSNorm(casting="bf16").init(jax.random.key(0), x),
      lambda: TransformerConfig(casting="bf16"),
  ]
  for call in calls:
    with pytest.raises(ValueError, match=r"casting must be one of .*'llama'.* got 'bf16'"):
      call()


@pytest.mark.parametrize("api", ["nnx", "linen"])
def test_layers_take_casting(api):
  x, s, _, _ = _inputs(8, (3, 4, 32), "bfloat16", "bfloat16")
  kw = dict(epsilon=EPS, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, casting="llama")
  if api == "nnx":
    def layer(x, s):
      module = jnn.RMSNorm(32, rngs=nnx.Rngs(0), **kw)
      module.scale[...] = s
      return module(x)
  else:
    def layer(x, s):
      return jln.RMSNorm(**kw).apply({"params": {"scale": s}}, x)
  # In one program (the statistics shared): bit for bit; the eager layer within APART_ULP.
  y, want, _ = _one_program(layer, lambda x, s: hf_llama(x, s, EPS), x, s)
  assert_bitwise(y, want, f"{api} RMSNorm(casting='llama')")
  assert_ulp_close(layer(x, s), hf_llama(x, s, EPS), APART_ULP["bfloat16"], what=f"{api} eager")


class _HandLlamaRMSNorm(nnx.Module):
  """A hand-written Llama RMSNorm (HF ``LlamaRMSNorm``) as a Flax layer of this ``dtype``.

  Flax layers compute with their parameters cast to ``dtype`` (``nnx.Linear`` does, and so does
  ``jaxnorm.nnx.RMSNorm``): a bfloat16 model's weight is bfloat16, as in a HF model loaded in
  bfloat16.
  """

  def __init__(self, scale, epsilon, dtype):
    self.scale, self.epsilon, self.dtype = scale, epsilon, dtype

  def __call__(self, x):
    return hf_llama(x.astype(self.dtype), self.scale[...].astype(self.dtype), self.epsilon)


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused-exact"])
def test_llama_decoder_logits_are_bitwise_those_of_a_hand_written_llama_norm(fused):
  # The hand-written model adds its residuals unfused (the hand-written norm has no fused add).
  # With jaxnorm's adds unfused too, it is the same model but for the norm. Fused, jaxnorm's op
  # rounds h to bfloat16 explicitly, while XLA may keep an unfused bfloat16 add in float32
  # (excess precision): the same logits only with --xla_allow_excess_precision=false (EXACT).
  cfg = TransformerConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=32, max_len=8,
                          norm_type="rms_norm", norm_position="pre", dtype="bfloat16",
                          epsilon=EPS, positions="rotary", casting="llama",
                          fuse_residual_norm=fused)
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  # The blocks' parameters are stacked on a leading layer axis: one Block holds every layer.
  norms = lambda m: [(m.blocks, "attn_norm"), (m.blocks, "mlp_norm"), (m, "final_norm")]  # noqa
  for i, (owner, name) in enumerate(norms(model)):  # scales away from one, or modes coincide
    scale = getattr(owner, name).scale
    scale[...] = random(jax.random.key(i), scale.shape, scale.dtype, loc=1.0, scale=0.3)
  hand = TransformerLM(dataclasses.replace(cfg, fuse_residual_norm=False), rngs=nnx.Rngs(0))
  nnx.update(hand, nnx.state(model))
  for owner, name in norms(hand):
    setattr(owner, name, _HandLlamaRMSNorm(getattr(owner, name).scale, EPS, jnp.bfloat16))
  tokens = jax.random.randint(jax.random.key(9), (2, 8), 0, cfg.vocab_size)
  # Both models in one jitted program on the same parameters: XLA computes what they share once
  # (the embedding) and each norm's statistics in two copies of the same fusion (the mean
  # square, then rsqrt: after it jaxnorm's side adds the float range's select, which leaves r
  # as it is, so the fusion pass gives each side its own copy), hence every later layer the same:
  # bit for bit on any CPU when each norm rounds where the hand-written one does. (Compiled
  # apart, each program may sum the squares in its own order: see APART_ULP.)
  graphdef, state = nnx.split(model)
  hand_graphdef = nnx.graphdef(hand)
  logits, hand_logits, _ = _one_program(lambda st, t: nnx.merge(graphdef, st)(t),
                                        lambda st, t: nnx.merge(hand_graphdef, st)(t), state,
                                        tokens, options=EXACT if fused else None, shared=False)
  assert_bitwise(logits, hand_logits, "logits")
  # (That the mode matters at all: test_modes_differ_in_half_precision; in this model "float32"
  # gives other logits, see docs/modules.md "In a model".)
