"""One AD layer: reverse mode *is* the derived custom VJP, under every transform and platform.

* Each public op is one ``jax.custom_jvp``; a ``jax.custom_vjp`` built here from the library's
  own derived forward (``_backends.forward``, ``_backends.add_forward``) and backward
  (``_backends.backward``, ``_backends.add_backward``) gives bitwise the same ``jax.vjp`` results and the same optimized
  program (XLA, and the kernels in interpret mode).
* ``grad(vmap(op))`` with batched parameters runs the derived backward (counted: calls of the
  XLA backward while tracing, and ``pallas_call``s in the gradient program) with the values of
  ``vmap(grad(op))``, for the four ops and their variants.
* ``impl="auto"`` is decided per lowering platform: exported for cuda from this CPU host the
  program carries the Triton kernels; for cpu and tpu the XLA formulas.
* No import cycle in ``jaxnorm/``, counting imports inside functions.
"""

import ast
import dataclasses
import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnorm
from jaxnorm.ops.norm import rules as _ad
from jaxnorm.backends import table as _backends
from jaxnorm.ops.norm import args as _norm_args
from jaxnorm.backends.xla import formulas as _xla
from jaxnorm.backends.xla.backend import XLA
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm import reference
from jaxnorm.models import TransformerConfig, TransformerLM
from _kernels import count_pallas_calls
from _numerics import assert_bitwise, compiled
from _backends import lowered_for

INTERPRET = jaxnorm.PallasConfig(interpret=True)
IMPLS = {"xla": dict(impl="xla"), "pallas": dict(impl="pallas", pallas=INTERPRET)}


def _rand(seed, shape, dtype=jnp.float32, loc=0.0):
  return (loc + jax.random.normal(jax.random.key(seed), shape)).astype(dtype)


# ---------------------------------------------------------------------------------------------
# Reverse mode is exactly the custom VJP of the derived forward and backward.


def _plain_vjp_op(cfg):
  """``jax.custom_vjp(fwd, bwd)`` from the library's derived forward and backward."""

  @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
  def op(cfg, x, scale, bias):
    return _backends.forward(cfg, x, scale, bias, None)[0]

  def fwd(cfg, x, scale, bias):
    y, stats = _backends.forward(cfg, x, scale, bias, None)
    return y, (x, scale, stats)

  def bwd(cfg, res, dy):
    x, scale, stats = res
    dx, dscale, dbias = _backends.backward(cfg, x, scale, None, stats, dy)
    return (dx, *_backends.param_cotangents(cfg, scale, dscale, dbias))

  op.defvjp(fwd, bwd)
  return functools.partial(op, cfg)


def _fused_vjp_op(cfg):
  @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
  def op(cfg, x, r, scale, bias):
    y, h, _ = _backends.add_forward(cfg, x, r, scale, bias, None)
    return y, h

  def fwd(cfg, x, r, scale, bias):
    y, h, stats = _backends.add_forward(cfg, x, r, scale, bias, None)
    return (y, h), (h, scale, stats)

  def bwd(cfg, res, cts):
    h, scale, stats = res
    dy, dh = cts
    return _backends.add_backward(cfg, h, scale, None, stats, dy, dh)

  op.defvjp(fwd, bwd)
  return functools.partial(op, cfg)


def _optimized(f, *args):
  """The optimized program of ``jit(f, keep_unused=True)`` without metadata and names
  (``_numerics.hlo_text``): every argument a parameter, whether or not JAX's dead-code
  elimination found it unused (the custom_jvp's jaxpr keeps a bias the gradient does not read,
  which XLA then drops: the computations are the same)."""
  return compiled(f, *args, keep_unused=True)[1]


def _prepare(center, x, scale, bias, impl, **variant):
  return _norm_args.prepare(x, scale, bias, op=LAYER_NORM if center else RMS_NORM,
                            epsilon=1e-5, axis=-1, mask=None,
                            epsilon_placement=variant.get("epsilon_placement", "inside"),
                            zero_centered_scale=variant.get("zero_centered_scale", False),
                            axis_name=None, axis_index_groups=None, dtype=None,
                            casting=variant.get("casting", "float32"), **IMPLS[impl])


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("center", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_reverse_mode_is_the_custom_vjp(impl, center, dtype):
  x, dy = _rand(0, (16, 96), dtype, loc=3.0), _rand(1, (16, 96), dtype)
  scale, bias = _rand(2, (96,), loc=1.0), (_rand(3, (96,)) if center else None)
  cfg, x2, _, _ = _prepare(center, x, scale, bias, impl, zero_centered_scale=True)
  ours = lambda x, s, b: _ad.apply(cfg, x, s, b, None)  # noqa: E731
  theirs = _plain_vjp_op(cfg)

  def vjp_of(f):
    def run(x, s, b, dy):
      y, pull = jax.vjp(f, x, s, b)
      return y, pull(dy)
    return run

  a, program = compiled(vjp_of(ours), x2, scale, bias, dy)
  e, their_program = compiled(vjp_of(theirs), x2, scale, bias, dy)
  assert program == their_program
  for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(e), strict=True):
    assert_bitwise(u, w)  # the same program: the same bits on any CPU
  loss = lambda f: lambda x, s, b: jnp.sum(f(x, s, b).astype(jnp.float32) * dy)  # noqa: E731
  grads = lambda f: jax.grad(loss(f), argnums=(0, 1, 2))  # noqa: E731
  assert _optimized(grads(ours), x2, scale, bias) == _optimized(grads(theirs), x2, scale, bias)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("center", [True, False], ids=["layer_norm", "rms_norm"])
def test_fused_reverse_mode_is_the_custom_vjp(impl, center):
  x, r = _rand(0, (12, 64), jnp.bfloat16), _rand(1, (12, 64), loc=2.0)
  dy, dh = _rand(2, (12, 64), jnp.bfloat16), _rand(3, (12, 64))
  scale, bias = _rand(4, (64,), loc=1.0), (_rand(5, (64,)) if center else None)
  cfg, x2, r2, _, _ = _norm_args.prepare_add(
      x, r, scale, bias, op=LAYER_NORM if center else RMS_NORM, residual_scale=1.5,
      residual_dtype=None, epsilon=1e-5, axis=-1, mask=None, epsilon_placement="outside", zero_centered_scale=False,
      axis_name=None, axis_index_groups=None, dtype=None, **IMPLS[impl])
  ours = lambda x, r, s, b: _ad.add_norm(cfg, x, r, s, b, None)  # noqa: E731
  theirs = _fused_vjp_op(cfg)

  def run(f):
    def g(x, r, s, b, dy, dh):
      out, pull = jax.vjp(f, x, r, s, b)
      return out, pull((dy, dh))
    return g

  args = (x2, r2, scale, bias, dy, dh)
  (a, program), (e, their_program) = compiled(run(ours), *args), compiled(run(theirs), *args)
  assert program == their_program
  for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(e), strict=True):
    assert_bitwise(u, w)  # the same program: the same bits on any CPU


def test_the_program_comparison_can_fail():
  """The optimized-program check tells two different backward rules apart."""
  x, s, b = _rand(0, (8, 32)), _rand(1, (32,), loc=1.0), _rand(2, (32,))
  cfg, x2, _, _ = _prepare(True, x, s, b, "xla")
  ours = jax.grad(lambda x: jnp.sum(_ad.apply(cfg, x, s, b, None) ** 2))
  autodiff = jax.grad(lambda x: jnp.sum(jaxnorm.reference.layer_norm(x, s, b, epsilon=1e-5) ** 2))
  assert _optimized(ours, x2) != _optimized(autodiff, x2)


# ---------------------------------------------------------------------------------------------
# Batched parameters keep the derived backward.


def _ops(variant):
  """The four public ops as ``f(x, r, s, b, **kw) -> array`` with ``variant``'s keywords."""
  ln = lambda x, r, s, b, **kw: jaxnorm.layer_norm(x, s, b, **variant, **kw)  # noqa: E731
  rms = lambda x, r, s, b, **kw: jaxnorm.rms_norm(x, s, **variant, **kw)  # noqa: E731

  def add_ln(x, r, s, b, **kw):
    y, h = jaxnorm.add_layer_norm(x, r, s, b, residual_scale=0.5, **variant, **kw)
    return y.astype(jnp.float32) + 0.3 * h.astype(jnp.float32)

  def add_rms(x, r, s, b, **kw):
    y, h = jaxnorm.add_rms_norm(x, r, s, **variant, **kw)
    return y.astype(jnp.float32) + 0.3 * h.astype(jnp.float32)

  return {"layer_norm": ln, "rms_norm": rms, "add_layer_norm": add_ln, "add_rms_norm": add_rms}


VARIANTS = [
    dict(),
    dict(zero_centered_scale=True, epsilon_placement="outside"),
    dict(casting="llama"),
    dict(casting="t5"),
]


def _batched_data(dtype, B=3, R=5, d=48):
  x = _rand(0, (B, R, d), dtype, loc=1.0)
  r = _rand(1, (B, R, d), dtype)
  s = _rand(2, (B, d), loc=1.0).astype(dtype)
  b = _rand(3, (B, d)).astype(dtype)
  ct = _rand(4, (B, R, d))
  return x, r, s, b, ct


def _grad_vmap(op, in_axes, **kw):
  def loss(x, r, s, b, ct):
    return jnp.sum(jax.vmap(lambda *a: op(*a, **kw).astype(jnp.float32), in_axes=in_axes)(
        x, r, s, b) * ct)
  return jax.grad(loss, argnums=(0, 1, 2, 3))


def _vmap_grad(op, in_axes, **kw):
  def loss(x, r, s, b, ct):
    return jnp.sum(op(x, r, s, b, **kw).astype(jnp.float32) * ct)
  return jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)), in_axes=(*in_axes, 0),
                  out_axes=(0, 0, 0, 0))


def _count_backward_calls(monkeypatch):
  calls = []
  original = _xla.backward

  def counting(*args, **kwargs):
    calls.append(1)
    return original(*args, **kwargs)

  # The XLA backend's table holds the formula itself: the entries are what the dispatch runs.
  for name in ("layer_norm", "rms_norm"):
    monkeypatch.setitem(XLA._table, (name, "backward"), counting)
  return calls


# Every variant on the plain LayerNorm, the plain and one casting variant on the other ops (the
# batching rule does not depend on the variant; the variants' rules are tested unbatched).
XLA_BATCH_CASES = ([("layer_norm", v) for v in VARIANTS]
                   + [(n, v) for n in ("rms_norm", "add_layer_norm", "add_rms_norm") for v in VARIANTS[::2]])


@pytest.mark.parametrize("name,variant", XLA_BATCH_CASES,
                         ids=lambda c: c if isinstance(c, str) else ("-".join(map(str, c.values())) or "plain"))
def test_batched_parameters_run_the_derived_backward_xla(name, variant, monkeypatch):
  dtype = jnp.bfloat16 if variant.get("casting") else jnp.float32
  x, r, s, b, ct = _batched_data(dtype)
  op = _ops(variant)[name]
  for in_axes in [(0, 0, 0, 0), (0, 0, 0, None), (None, None, 0, 0)]:
    calls = _count_backward_calls(monkeypatch)
    b_in = b if in_axes[3] is not None else b[0]
    x_in, r_in = (x, r) if in_axes[0] is not None else (x[0], r[0])
    got = jax.jit(_grad_vmap(op, in_axes, impl="xla"))(x_in, r_in, s, b_in, ct)
    assert len(calls) == 1, (in_axes, "the gradient must run the derived XLA backward once")
    monkeypatch.undo()
    if in_axes[0] is None:  # x shared by the batch: its gradient sums the per-example ones
      want = _vmap_grad(op, (0, 0, 0, 0), impl="xla")(
          jnp.broadcast_to(x_in, x.shape), jnp.broadcast_to(r_in, r.shape), s, b_in, ct)
      want = (want[0].sum(0), want[1].sum(0), want[2], want[3])
    else:
      want = _vmap_grad(op, in_axes, impl="xla")(x_in, r_in, s, b_in, ct)
      if in_axes[3] is None:
        want = (*want[:3], want[3].sum(0))
    for g, w in zip(got, want):
      w = np.asarray(w, np.float32)
      # bfloat16: one rounding (2^-8 relative) of the largest entry; summing per-example
      # gradients over the batch rounds in another order than the batched program.
      atol = 1e-2 * float(np.abs(w).max()) if dtype == jnp.bfloat16 else 1e-5
      np.testing.assert_allclose(np.asarray(g, np.float32), w,
                                 rtol=2e-2 if dtype == jnp.bfloat16 else 1e-5, atol=atol)


@pytest.mark.parametrize("variant", VARIANTS[:3], ids=["plain", "zc-outside", "llama"])
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_batched_parameters_run_the_backward_kernels(name, variant):
  """In interpret mode the gradient program holds the forward and both backward kernels (3
  ``pallas_call``s), as the unbatched gradient does, and equals ``vmap(grad)`` bitwise."""
  x, r, s, b, ct = _batched_data(jnp.float32)
  op = _ops(variant)[name]
  kw = IMPLS["pallas"]
  g = _grad_vmap(op, (0, 0, 0, 0), **kw)
  assert count_pallas_calls(g, x, r, s, b, ct) == 3
  unbatched = jax.grad(lambda x, r, s, b: jnp.sum(op(x, r, s, b, **kw) * ct[0]),
                       argnums=(0, 1, 2, 3))
  assert count_pallas_calls(unbatched, x[0], r[0], s[0], b[0]) == 3
  got, program = compiled(g, x, r, s, b, ct)
  want, their_program = compiled(_vmap_grad(op, (0, 0, 0, 0), **kw), x, r, s, b, ct)
  assert program == their_program  # grad of vmap and vmap of grad: one program
  for u, w in zip(got, want):
    assert_bitwise(u, w)  # the same program: the same bits on any CPU


def test_batched_mask_and_jacfwd_in_the_scale():
  """A batched mask with batched parameters, and ``jacfwd`` in the scale (a batched scale
  tangent), agree with autodiff of the reference."""
  x, _, s, b, ct = _batched_data(jnp.float32)
  mask = jax.random.bernoulli(jax.random.key(9), 0.7, x.shape).at[..., 0].set(True)
  f = lambda x, s, b, m: jaxnorm.layer_norm(x, s, b, mask=m)  # noqa: E731
  fr = lambda x, s, b, m: jaxnorm.reference.layer_norm(x, s, b, mask=m)  # noqa: E731
  loss = lambda f: lambda x, s, b: jnp.sum(jax.vmap(f)(x, s, b, mask) * ct)  # noqa: E731
  for g, w in zip(jax.grad(loss(f), argnums=(0, 1, 2))(x, s, b),
                  jax.grad(loss(fr), argnums=(0, 1, 2))(x, s, b)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  j = jax.jacfwd(lambda s: jaxnorm.rms_norm(x[0], s))(s[0])
  jr = jax.jacfwd(lambda s: jaxnorm.reference.rms_norm(x[0], s))(s[0])
  np.testing.assert_allclose(j, jr, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# impl="auto" per lowering platform.

TRITON = "__gpu$xla.gpu.triton"


def _export(f, platform, *args):
  """The program lowered for ``platform`` (a jit's lowering: an export of impl="auto" takes the
  XLA path everywhere, tests/jaxnorm/test_export.py)."""
  return lowered_for(f, (platform,), *args)


def _op_step(x, r, s, b):
  def loss(x, r, s, b):
    y1 = jaxnorm.layer_norm(x, s, b)
    y2 = jaxnorm.rms_norm(x, s)
    y3, h = jaxnorm.add_rms_norm(x, r, s)
    return jnp.sum(y1 * y2) + jnp.sum(y3) + jnp.sum(h)
  return jax.grad(loss, argnums=(0, 1, 2, 3))(x, r, s, b)


@pytest.mark.parametrize("platform,kernels", [("cuda", True), ("cpu", False), ("tpu", False)])
def test_auto_is_decided_per_lowering_platform(platform, kernels, gpu_host):
  x, r = _rand(0, (64, 256)), _rand(1, (64, 256))
  s, b = _rand(2, (256,), loc=1.0), _rand(3, (256,))
  text = _export(_op_step, platform, x, r, s, b)
  assert (TRITON in text) == kernels
  if kernels:  # the forward, dx and dscale/dbias kernels of each op
    assert text.count(TRITON) >= 6


def test_auto_on_a_cpu_host_is_xla_when_traced():
  """On a host whose default backend no kernel backend runs on, "auto" is XLA when the call is
  traced (no per-platform switch to trace): lowered for cuda from here, no kernels."""
  x, r = _rand(0, (64, 256)), _rand(1, (64, 256))
  s, b = _rand(2, (256,), loc=1.0), _rand(3, (256,))
  assert TRITON not in _export(_op_step, "cuda", x, r, s, b)
  assert "platform_index" not in jax.jit(_op_step).lower(x, r, s, b).as_text()


def _train_step_fn():
  cfg = TransformerConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128, max_len=16,
                          norm_impl="jaxnorm", norm_type="rms_norm")
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  opt = optax.adamw(1e-3)

  def step(params, opt_state, tokens):
    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return step, params, opt.init(params)


@pytest.mark.parametrize("platform,kernels", [("cuda", True), ("cpu", False), ("tpu", False)])
def test_model_train_step_lowers_per_platform(platform, kernels, gpu_host):
  step, params, opt_state = _train_step_fn()
  tokens = jnp.zeros((2, 17), jnp.int32)
  text = _export(step, platform, params, opt_state, tokens)
  assert (TRITON in text) == kernels


def test_explicit_pallas_is_checked_where_it_is_lowered():
  """impl="pallas" asks the platform the program is lowered for, not the tracing host's
  backend: from this CPU host a gradient lowers for a GPU with its kernels, and lowering it for
  a CPU (jit, eager or an export) raises the op's own error, while interpret mode runs here."""
  x, s, b = _rand(0, (16, 128)), _rand(1, (128,), loc=1.0), _rand(2, (128,))

  def grad(pallas=None):
    return jax.grad(lambda x, s: jnp.sum(jaxnorm.layer_norm(x, s, b, impl="pallas",
                                                            pallas=pallas) ** 2),
                    argnums=(0, 1))

  assert _export(grad(), "cuda", x, s).count(TRITON) == 3
  for run in (lambda: _export(grad(), "cpu", x, s), lambda: jax.jit(grad())(x, s),
              lambda: grad()(x, s), lambda: jaxnorm.rms_norm(x, s, impl="pallas")):
    # Lowered elsewhere, the config no longer says which spelling the call used: both are named.
    with pytest.raises(ValueError, match=r"impl='triton' \(alias 'pallas'\) cannot run this call: the "
                                         "Pallas kernels need a GPU .* the backend is 'cpu'"):
      run()
  with jax.disable_jit():  # op by op: the same choice, made for the default backend
    with pytest.raises(ValueError, match=r"impl='triton' \(alias 'pallas'\) cannot run this call"):
      grad()(x, s)
    got_eager = grad(jaxnorm.PallasConfig(interpret=True))(x, s)
  got = grad(jaxnorm.PallasConfig(interpret=True))(x, s)
  for g, w in zip(got_eager, got):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  want = jax.grad(lambda x, s: jnp.sum(jaxnorm.layer_norm(x, s, b, impl="xla") ** 2),
                  argnums=(0, 1))(x, s)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_auto_lowers_for_several_platforms_at_once_and_exports_without_kernels(gpu_host):
  """Lowered for cpu and cuda at once, JAX lowers every branch of the platform switch for each
  platform, so impl="auto"'s kernel branch lowers to the XLA path for cpu (it never runs there)
  and to the kernels for cuda. An export for both takes the XLA path on both (the kernels'
  custom call is not export-stable); run here, it gives the XLA path's gradients."""
  x, r = _rand(0, (64, 256)), _rand(1, (64, 256))
  s, b = _rand(2, (256,), loc=1.0), _rand(3, (256,))
  assert lowered_for(_op_step, ("cpu", "cuda"), x, r, s, b).count(TRITON) >= 6
  exp = jax.export.export(jax.jit(_op_step), platforms=["cpu", "cuda"])(x, r, s, b)
  assert TRITON not in exp.mlir_module()
  want = jax.jit(_op_step)(x, r, s, b)
  for g, w in zip(exp.call(x, r, s, b), want):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_auto_on_this_cpu_runs_xla():
  """On a CPU, impl="auto" compiles to exactly the XLA program (the GPU branch is dropped at
  lowering), forward, JVP and gradient: the per-platform choice costs nothing at run time."""
  x, s, b = _rand(0, (8, 64)), _rand(1, (64,), loc=1.0), _rand(2, (64,))
  for f in (lambda impl: lambda x: jaxnorm.layer_norm(x, s, b, impl=impl),
            lambda impl: jax.grad(lambda x: jnp.sum(jaxnorm.layer_norm(x, s, b, impl=impl) ** 2)),
            lambda impl: lambda x: jax.jvp(lambda x: jaxnorm.rms_norm(x, s, impl=impl), (x,),
                                           (x,))[1]):
    (got, program), (want, xla_program) = compiled(f("auto"), x), compiled(f("xla"), x)
    assert program == xla_program
    assert_bitwise(got, want)  # the same program: the same bits on any CPU
  cfg = _prepare(True, x, s, b, "xla")[0]
  assert dataclasses.replace(cfg, impl=_backends.PER_PLATFORM).impl == "per_platform"


# ---------------------------------------------------------------------------------------------
# No import cycle, counting imports inside functions.


def _imports(path: pathlib.Path, package: pathlib.Path) -> set[str]:
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxnorm"):
      base = node.module
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.add(sub if (package / (sub.replace(".", "/")[8:] + ".py")).exists() else base)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name.startswith("jaxnorm"))
  return found


def test_no_import_cycle():
  package = pathlib.Path(jaxnorm.__file__).parent
  graph = {}
  for path in package.rglob("*.py"):
    rel = path.relative_to(package.parent).with_suffix("")
    name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    graph[name] = {m for m in _imports(path, package) if m != name}
  # A package's __init__ re-exports its modules: an edge from a module to an enclosing
  # package's __init__ is the only back edge allowed (``from jaxnorm import _xla`` is read as
  # the module ``jaxnorm.backends.xla.formulas``, not as the package).
  state = {}

  def visit(node, stack):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if nxt == "jaxnorm" or node.startswith(nxt + "."):
        continue
      if state.get(nxt) == "open":
        raise AssertionError(f"import cycle: {' -> '.join(stack + [node, nxt])}")
      if nxt not in state:
        visit(nxt, stack + [node])
    state[node] = "done"

  for node in sorted(graph):
    if node not in state:
      visit(node, [])
  assert "jaxnorm.ops.norm.rules" in graph and "jaxnorm.backends.table" in graph["jaxnorm.ops.norm.rules"]
  assert "jaxnorm.ops.norm.rules" not in graph["jaxnorm.backends.table"]


# ---------------------------------------------------------------------------------------------
# JAX internals: one fenced module, loud on a JAX it does not know.


def test_jax_internals_live_in_one_module():
  package = pathlib.Path(jaxnorm.__file__).parent
  internal = re.compile(r"jax\.(interpreters|_src|extend|core)\b")
  offenders = [p.name for p in package.rglob("*.py")
               if p.name != "_jax_compat.py" and internal.search(p.read_text())]
  assert offenders == []


def test_unknown_aval_layout_raises(monkeypatch):
  from jaxnorm import _jax_compat

  class Bare:  # an abstract value with neither known field
    def __init__(self, *args):
      pass

  monkeypatch.setattr(_jax_compat, "shaped_array", lambda shape, dtype: Bare())
  with pytest.raises(RuntimeError, match="does not know how JAX .* records the mesh axes"):
    _jax_compat._probe_varying_field()


def test_unknown_lowering_context_raises(monkeypatch):
  from jaxnorm import _jax_compat

  class Bare:  # a lowering context that does not say which platforms it lowers for
    pass

  _jax_compat._probe_lowering_platforms()  # this JAX: known
  monkeypatch.setattr(_jax_compat._mlir, "LoweringRuleContext", Bare)
  with pytest.raises(RuntimeError, match="does not know how JAX .* tells a lowering rule"):
    _jax_compat._probe_lowering_platforms()


def test_tangent_varies_over_the_union_of_its_operands_axes():
  """Inside shard_map: x varies over "a", the scale tangent over "b"; the tangent over both."""
  if len(jax.devices()) < 4:
    pytest.skip("needs 4 (host) devices")
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
  x, s, ts = _rand(0, (4, 16)), _rand(1, (2, 16), loc=1.0), _rand(2, (2, 16))

  def body(x, s, ts):  # x: (2, 16) varying over a; s and ts: (1, 16) varying over b
    _, t = jax.jvp(lambda s: jaxnorm.rms_norm(x, s[0]), (s,), (ts,))
    return t

  f = jax.shard_map(body, mesh=mesh, in_specs=(P("a"), P("b"), P("b")),
                    out_specs=P("a", None))
  with pytest.raises(ValueError, match="vary|varying|vma|axes"):  # it varies over "b" too
    jax.jit(f)(x, s, ts)
  g = jax.shard_map(body, mesh=mesh, in_specs=(P("a"), P("b"), P("b")), out_specs=P("a", "b"))
  out = jax.jit(g)(x, s, ts)
  want = jnp.concatenate([
      jnp.concatenate([jax.jvp(lambda s: jaxnorm.reference.rms_norm(xa, s), (s[j],), (ts[j],))[1]
                       for j in range(2)], axis=1)
      for xa in (x[:2], x[2:])], axis=0)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def _split_and_whole(name, shared_scale):
  """``name`` with its features split over a named vmap axis (axis_name="i": 4 slices of 8),
  and the same op on the whole feature axis (32) of jaxnorm.reference, for ``(x, s, b, r)``
  given as ``(4, rows, 8)`` slices (``s``, ``b``: ``(4, 8)``, or ``(8,)`` when shared)."""
  ref = {"layer_norm": lambda x, s, b, r: reference.layer_norm(x, s, b),
         "rms_norm": lambda x, s, b, r: reference.rms_norm(x, s),
         "add_layer_norm": lambda x, s, b, r: reference.layer_norm(x + 0.5 * r, s, b),
         "add_rms_norm": lambda x, s, b, r: reference.rms_norm(x + 0.5 * r, s)}[name]
  ops = {"layer_norm": lambda x, s, b, r: jaxnorm.layer_norm(x, s, b, axis_name="i"),
         "rms_norm": lambda x, s, b, r: jaxnorm.rms_norm(x, s, axis_name="i"),
         "add_layer_norm": lambda x, s, b, r: jaxnorm.add_layer_norm(
             x, r, s, b, residual_scale=0.5, axis_name="i")[0],
         "add_rms_norm": lambda x, s, b, r: jaxnorm.add_rms_norm(
             x, r, s, residual_scale=0.5, axis_name="i")[0]}
  p_axis = None if shared_scale else 0
  split = jax.vmap(ops[name], in_axes=(0, p_axis, p_axis, 0), axis_name="i")

  def whole(x, s, b, r):
    rows = x.shape[1]
    flat = lambda a: jnp.moveaxis(a, 0, 1).reshape(rows, -1)  # noqa: E731
    par = (lambda p: jnp.tile(p, 4)) if shared_scale else (lambda p: p.reshape(-1))
    y = ref(flat(x), par(s), par(b), flat(r))
    return jnp.moveaxis(y.reshape(rows, 4, -1), 1, 0)

  return split, whole, ops[name]


# Every op once; the parameter shared by the slices on LayerNorm and the fused RMSNorm (CI time).
SPLIT_CASES = [("layer_norm", False), ("layer_norm", True), ("rms_norm", False),
               ("add_layer_norm", False), ("add_rms_norm", True)]


@pytest.mark.parametrize("name,shared_scale", SPLIT_CASES,
                         ids=[f"{n}-{'shared' if sh else 'per-slice'}" for n, sh in SPLIT_CASES])
def test_features_split_over_a_vmap_axis(name, shared_scale, monkeypatch):
  """axis_name naming a jax.vmap axis (the features split over it, as over a mesh axis in
  shard_map): value, grad(vmap), vmap(grad), JVP and a Hessian-vector product equal the whole
  feature axis's (autodiff of the reference), and the gradient runs the derived backward."""
  x, r, ct = _rand(0, (4, 5, 8), loc=1.0), _rand(1, (4, 5, 8)), _rand(4, (4, 5, 8))
  pshape = (8,) if shared_scale else (4, 8)
  s, b = _rand(2, pshape, loc=1.0), _rand(3, pshape)
  split, whole, op = _split_and_whole(name, shared_scale)
  tol = dict(rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(split(x, s, b, r), whole(x, s, b, r), **tol)

  def loss(f):
    return lambda x, s, b, r: jnp.sum(f(x, s, b, r) * ct)

  calls = _count_backward_calls(monkeypatch)
  got = jax.jit(jax.grad(loss(split), argnums=(0, 1, 2, 3)))(x, s, b, r)
  assert len(calls) == 1, "the gradient must run the derived XLA backward once"
  monkeypatch.undo()
  want = jax.grad(loss(whole), argnums=(0, 1, 2, 3))(x, s, b, r)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, **tol)
  if not shared_scale:  # vmap(grad): the transpose meets the user's vmap axis directly
    per = jax.vmap(jax.grad(lambda x, s, b, r, c: jnp.sum(op(x, s, b, r) * c)),
                   axis_name="i")(x, s, b, r, ct)
    np.testing.assert_allclose(per, want[0], **tol)
  t = jax.jvp(lambda x: split(x, s, b, r), (x,), (ct,))[1]
  np.testing.assert_allclose(t, jax.jvp(lambda x: whole(x, s, b, r), (x,), (ct,))[1], **tol)
  if name == "layer_norm":  # second order (the primitive's own JVP over a named group)
    hvp = lambda f: jax.jvp(jax.grad(lambda x: jnp.sum(f(x, s, b, r) ** 3)), (x,), (ct,))[1]  # noqa: E731
    np.testing.assert_allclose(hvp(split), hvp(whole), rtol=1e-3, atol=1e-4)


def test_split_axis_with_x_not_mapped_is_the_tiled_row():
  """axis_name naming a vmap axis that x is not mapped over (only the scale is): by JAX's
  semantics every slice holds the same x, so the whole row is x tiled 4 times; values and
  gradients are those of that row."""
  x, s, ct = _rand(0, (5, 8), loc=1.0), _rand(1, (4, 8), loc=1.0), _rand(2, (4, 5, 8))
  split = jax.vmap(lambda x, s: jaxnorm.layer_norm(x, s, axis_name="i"), in_axes=(None, 0),
                   axis_name="i")

  def whole(x, s):
    y = reference.layer_norm(jnp.tile(x, 4), s.reshape(-1))
    return jnp.moveaxis(y.reshape(5, 4, 8), 1, 0)

  np.testing.assert_allclose(split(x, s), whole(x, s), rtol=1e-5, atol=1e-5)
  got = jax.grad(lambda x, s: jnp.sum(split(x, s) * ct), argnums=(0, 1))(x, s)
  want = jax.grad(lambda x, s: jnp.sum(whole(x, s) * ct), argnums=(0, 1))(x, s)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  # No operand of the norm mapped at all (the vmap maps only the cotangent): the same row.
  s0 = s[0]
  both = jax.vmap(lambda x, c: jnp.sum(jaxnorm.layer_norm(x, s0, axis_name="i") * c),
                  in_axes=(None, 0), axis_name="i")
  got = jax.grad(lambda x: jnp.sum(both(x, ct)))(x)
  want = jax.grad(lambda x: jnp.sum(reference.layer_norm(jnp.tile(x, 4), jnp.tile(s0, 4))
                                    * jnp.moveaxis(ct, 0, 1).reshape(5, 32)))(x)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
