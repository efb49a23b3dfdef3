"""The fused residual add + norm ops against float64 autodiff of a reference (add, then
:mod:`jaxnorm.reference`), through the public kit (:func:`jaxnorm.testing.check_rule`): values,
random cotangents on *both* outputs ``y`` and ``h`` (or ``y`` alone: a symbolic-zero cotangent
for ``h``), each output and cotangent in its own dtype, element by element within the kit's ulp
budgets.

The value and derivative checks are one battery, :class:`FusedBattery`, run on each backend
(:mod:`_backends`): :class:`TestXla` and :class:`TestPallas` (the kernels, in interpret mode off
a GPU).

* ``test_rule_matches_float64_reference``: hypothesis draws the op, the shape (rank 1 to 3, one
  or two normalized axes), the dtypes of ``x`` and of the residual (a float32 stream under
  16-bit ``x`` among them), scale and bias (each present or not), a mask (where the backend
  takes one), the residual multiplier, epsilon and its placement, a zero-centred scale, whether
  ``h`` is used, ``x``'s rows (the kit's finite adversarial kinds)
  and the residual's location. Each example checks the value, the VJP, the JVP with random tangents on
  every input, the adjoint identity under ``jax.jit``, and one drawn transformation of
  :data:`jaxnorm.testing.TRANSFORMS`.
* ``test_every_variant_and_dtype``: a fixed grid, op x dtype x epsilon placement x zero-centred
  scale (a residual multiplier 1.7 without it), value and VJP under ``jax.jit`` (what it
  checked before the kit); each float32 entry adds one transformation
  (``_backends.GRID_TRANSFORMS``: every one once per battery and backend).
* fixed cases (value and VJP): a float32 stream under bfloat16 activations (and the same with
  ``residual_dtype`` and ``dtype`` float32), a mask without ``jax.jit``, ``h`` unused without
  ``jax.jit`` over two normalized axes without parameters; the kernels' own cases (row blocks,
  the column loop, an unused stream) follow the battery.

The transformations in a model (remat in a scanned stack, ``shard_map``), the kernels' outputs
and the argument errors follow.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

import jaxnorm
import _kernel_api as _pallas
from jaxnorm import reference
from jaxnorm import testing as jt
from jaxnorm.backends.triton.config import MAX_BLOCK_D
from _kernels import program_text
from _backends import FINITE_KINDS, INTERPRET, PALLAS, XLA, Backend, grid_transforms
from _compat import jaxprs_in_params
from _numerics import assert_close, assert_ulp_close, random, tol_for

OPS = {
    "layer_norm": (jaxnorm.add_layer_norm, reference.layer_norm, True),
    "rms_norm": (jaxnorm.add_rms_norm, reference.rms_norm, False),
}
D_LOOP = MAX_BLOCK_D + 8  # two column blocks in the kernels
# The fixed cases check the value and the VJP, as they did before the kit (forward mode is in
# every hypothesis example, and tests/jaxnorm/test_forward_mode.py).
REV = ("rev",)


def _coarse(*dtypes):
  """The tolerance of the least precise dtype among ``dtypes``."""
  return max(tol_for(d) for d in dtypes)


def _check(op_name, *, x, r, scale=None, bias=None, mask=None, alpha=1.0, residual_dtype=None,
           out_dtype=None, kw=None, use_dh=True, transforms=(), modes=jt.MODES,
           h_given=False, backend: Backend = XLA):
  """``check_rule`` of the fused op on ``backend`` against the float64 reference (add, round
  ``h`` to its dtype, normalize), and the outputs' dtypes and shapes. ``use_dh=False``: only
  ``y`` is an output, so the op's backward gets a symbolic-zero cotangent for ``h``.

  The reference rounds as the op does (``alpha r`` and the sum in float32, then ``h`` once to
  its dtype), each rounding straight-through (its value the rounded one, its derivative the
  identity), so the reference's derivatives are those of the function the op computes. A 16-bit
  ``h`` is an intermediate rounded to its dtype (the kit's ``compute_dtype``): jitted, XLA may
  normalize the unrounded float32 sum instead (its default ``xla_allow_excess_precision``; seen
  as 62 float16 ulps of ``y`` at condition 700), eagerly the rounded ``h``.

  ``h_given=True``: the same roundings done on the host, their result passed to both functions
  as a last, fixed argument that the reference's ``h`` takes as its value (straight-through):
  the reference is then one float64 program for every dtype of ``x`` and ``r``, which the kit
  compiles once (the grid's). Not under a batching transform, which would batch ``x`` and ``r``
  but not it.
  """
  op, ref, has_bias = OPS[op_name]
  kw = dict(kw or {}, mask=mask)
  h_dtype = jnp.dtype(residual_dtype or jnp.promote_types(x.dtype, r.dtype))
  params = (scale, bias) if has_bias else (scale,)
  rule = functools.partial(op, residual_scale=alpha, residual_dtype=residual_dtype,
                           dtype=out_dtype, **kw, **backend.kw)
  y, h = jax.eval_shape(rule, x, r, *params)
  assert y.dtype == jnp.dtype(out_dtype or x.dtype) and h.dtype == h_dtype
  assert y.shape == h.shape == x.shape

  a = float(np.float32(alpha))

  def plain(x, r, *p):
    s = r if alpha == 1.0 else _rounded(a * r, jnp.float32)
    h = _rounded(_rounded(x + s, jnp.float32), h_dtype)
    return ref(h, *p, **kw), h

  args = (x, r, *params)
  if h_given:
    assert not {"vmap", "vmap_unbatched", "scan"} & set(transforms), transforms
    x64, r64 = (np.asarray(v).astype(np.float64) for v in (x, r))
    s64 = r64 if alpha == 1.0 else (a * r64).astype(np.float32).astype(np.float64)
    h_q = jnp.asarray((x64 + s64).astype(np.float32).astype(h_dtype))
    rule = (lambda f: lambda *a: f(*a[:-1]))(rule)

    def plain(x, r, *p_h):
      *p, h_q = p_h
      h = x + a * r
      h = h + lax.stop_gradient(h_q.astype(h.dtype) - h)
      return ref(h, *p, **kw), h

    args += (h_q,)
  if not use_dh:
    rule, plain = (lambda f: lambda *a: f(*a)[0])(rule), (lambda f: lambda *a: f(*a)[0])(plain)
  tol = jt.Tolerance(compute_dtype=h_dtype if jnp.finfo(h_dtype).bits < 32 else None)
  jt.check_rule(rule, plain, args, nondiff_argnums=(len(args) - 1,) if h_given else (),
                modes=modes, transforms=transforms, tolerance=tol)


def _rounded(a, dtype):
  """``a`` rounded to ``dtype``, kept in ``a``'s dtype, with the identity as derivative."""
  return a + lax.stop_gradient(a.astype(dtype).astype(a.dtype) - a)


def _normal(rng, shape, dtype, loc=0.0, scale=1.0):
  """``loc + scale * N(0, 1)`` drawn with NumPy, in ``dtype``."""
  return jnp.asarray((loc + scale * rng.standard_normal(shape)).astype(jnp.dtype(dtype)))


def _inputs(op_name, shape, x_dtype="float32", r_dtype=None, *, use_scale=True, use_bias=True,
            axis=-1, loc=1.0, seed=0):
  """``x``, ``r``, ``scale``, ``bias`` for :func:`_check` (the parameters over the normalized
  trailing axes of ``axis``)."""
  rng = np.random.default_rng(seed)
  norm_shape = shape[len(shape) - (len(axis) if isinstance(axis, tuple) else 1):]
  return dict(x=_normal(rng, shape, x_dtype, scale=1.5),
              r=_normal(rng, shape, r_dtype or x_dtype, loc=loc, scale=1.5),
              scale=_normal(rng, norm_shape, x_dtype, 1.0, 0.5) if use_scale else None,
              bias=_normal(rng, norm_shape, x_dtype) if use_bias and OPS[op_name][2] else None)


# --------------------------------------------------------------------------- the battery


@st.composite
def cases(draw, backend: Backend):
  """One fused op, its configuration, its arguments and one of the kit's transformations."""
  op_name = draw(st.sampled_from(list(OPS)))
  rank = draw(st.integers(1, 3))
  n_norm = draw(st.integers(1, min(2, rank)))
  if n_norm == 1:
    norm_shape = [draw(st.sampled_from([d for d in [1, 3, 16, 33, 100, 256] if d <= backend.max_d]))]
  else:
    norm_shape = [draw(st.integers(1, 12)) for _ in range(2)]
  shape = tuple([draw(st.integers(1, 4)) for _ in range(rank - n_norm)] + norm_shape)
  x_dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
  r_dtype = draw(st.sampled_from([x_dtype, "float32"]))
  kw = dict(axis=tuple(range(-n_norm, 0)) if n_norm > 1 else -1,
            epsilon=draw(st.sampled_from([1e-6, 1e-3, 0.1])),
            epsilon_placement=draw(st.sampled_from(["inside", "outside"])),
            zero_centered_scale=draw(st.booleans()))
  transform = draw(st.sampled_from(jt.TRANSFORMS))
  normal = dict(kinds=("normal",))
  return dict(
      op_name=op_name,
      x=draw(jt.arrays(x_dtype, shape, scale=1.5, kinds=FINITE_KINDS)),
      r=draw(jt.arrays(r_dtype, shape, loc=draw(st.sampled_from([0.0, 3.0])), scale=1.5,
                       **normal)),
      scale=draw(st.none() | jt.arrays(x_dtype, norm_shape, loc=1.0, scale=0.5, **normal)),
      bias=draw(st.none() | jt.arrays(x_dtype, norm_shape, **normal)) if OPS[op_name][2] else None,
      # A backend without masks (the kernels) never draws one: test_ops_errors checks it raises.
      mask=draw(st.none() | jt.masks(shape)) if backend.masks else None,
      alpha=draw(st.sampled_from([1.0, 0.5, 2.4])),
      kw=kw,
      use_dh=draw(st.booleans()),
      transforms=(transform,),
  )


class FusedBattery:
  """Values, both cotangents and the tangents against the float64 reference, written once
  against ``self.backend``; one subclass per backend."""

  backend: Backend

  def test_rule_matches_float64_reference(self):
    @self.backend.given(6, case=cases(self.backend))
    def example(case):
      _check(backend=self.backend, **case)

  @pytest.mark.parametrize("op_name", list(OPS))
  @pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
  @pytest.mark.parametrize("placement", ["inside", "outside"])
  @pytest.mark.parametrize("zero_centered", [False, True])
  def test_every_variant_and_dtype(self, op_name, dtype, placement, zero_centered):
    """A fixed grid so that no variant/dtype combination depends on hypothesis' draws (``h``
    given, so that a variant's reference is one program for its three dtypes)."""
    transforms = grid_transforms(op_name, dtype, placement, zero_centered)
    _check(op_name, **_inputs(op_name, (3, 5, 48), dtype), alpha=1.0 if zero_centered else 1.7,
           kw=dict(epsilon=1e-3, epsilon_placement=placement, zero_centered_scale=zero_centered),
           transforms=transforms, modes=REV, backend=self.backend,
           h_given=not {"vmap", "vmap_unbatched", "scan"} & set(transforms))

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_float32_stream_under_bfloat16_activations(self, op_name):
    # x bf16 (a sub-layer output), residual f32 (the stream): h f32, y bf16, dx bf16, dres f32.
    _check(op_name, **_inputs(op_name, (4, 64), "bfloat16", "float32", loc=3.0),
           kw=dict(epsilon=1e-3), modes=REV, backend=self.backend)
    # The same with a bf16 residual stored in float32 from now on, and y requested in float32.
    _check(op_name, **_inputs(op_name, (4, 64), "bfloat16"), residual_dtype="float32",
           out_dtype="float32", alpha=0.5, kw=dict(epsilon=1e-3), modes=REV,
           backend=self.backend)

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_masked_eager(self, op_name):
    self.backend.skip_unless(mask=True)
    mask = np.random.default_rng(1).random((2, 3, 40)) < 0.7
    mask[..., 0] = True
    _check(op_name, **_inputs(op_name, (2, 3, 40)), mask=jnp.asarray(mask),
           kw=dict(epsilon=1e-3, epsilon_placement="outside"), transforms=("eager",), modes=REV,
           backend=self.backend)

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_eager_unused_stream(self, op_name):
    """Op by op, ``h`` unused (a symbolic-zero cotangent for it), over two normalized axes
    without parameters."""
    _check(op_name, **_inputs(op_name, (2, 4, 6), axis=(-2, -1), use_scale=False,
                              use_bias=False),
           kw=dict(axis=(-2, -1), epsilon=1e-3), use_dh=False, transforms=("eager",), modes=REV,
           backend=self.backend)


class TestXla(FusedBattery):
  backend = XLA


class TestPallas(FusedBattery):
  backend = PALLAS


@pytest.mark.parametrize("op_name", list(OPS))
def test_equals_add_then_plain_op(op_name):
  """Same values as ``h = x + alpha r`` followed by the plain op (the same code path).

  XLA only: the kernels' ``h`` is compiled inside the kernel and can differ from the eager
  ``x + 0.75 * r`` by an ulp (4.8e-7 seen in interpret mode); the kernels' decomposition is
  checked by ``test_fused_kernels_match_add_then_plain_kernels``. The XLA path's ``h`` is
  compiled too (one program with the norm), where XLA:CPU may contract ``x + 0.75 r`` into
  one FMA (one rounding) or not (two), depending on the code it generates for the CPU; eagerly
  the product and the sum round apart. The two differ by at most half an ulp of ``0.75 r`` plus
  half an ulp of each result: within 2 ulps of the larger of ``|h|`` and ``|0.75 r|``.
  """
  op, _, has_bias = OPS[op_name]
  plain = jaxnorm.layer_norm if has_bias else jaxnorm.rms_norm
  ks = jax.random.split(jax.random.key(1), 3)
  x, r = random(ks[0], (6, 32), jnp.float32), random(ks[1], (6, 32), jnp.float32, loc=2.0)
  s = random(ks[2], (32,), jnp.float32, loc=1.0)
  y, h = op(x, r, s, residual_scale=0.75)
  assert_ulp_close(h, x + 0.75 * r, 2, of=0.75 * r, what="h")
  np.testing.assert_allclose(np.asarray(y), np.asarray(plain(h, s)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("op_name", list(OPS))
def test_y_alone_is_the_norm_of_the_rounded_h(op_name):
  """Jitted with ``h`` discarded, ``y`` is bitwise the ``y`` returned beside ``h`` and that of the
  plain op on the returned bfloat16 ``h``: the op rounds ``h`` to its dtype before its statistics
  even where ``h`` is no output. (Before issue 56, RMSNorm's one YNNPACK loop on 4096 rows or
  more let XLA keep the sum in float32 when ``h`` was unused: 70,648 of 262,144 outputs of
  this shape differed, on other inputs.)
  The first two are the same rounded ``h`` through the same statistics, so bit for bit on any
  CPU. The plain op's forward alone on this many rows is, since issue 62, the program YNNPACK
  fuses whole (LayerNorm pivoted on the row mean: other roundings of the same statistics), so
  against it ``y`` is within one unit in the last place of bfloat16 (RMSNorm: bitwise still)."""
  op, _, has_bias = OPS[op_name]
  plain = jaxnorm.layer_norm if has_bias else jaxnorm.rms_norm
  ks = jax.random.split(jax.random.key(2), 3)
  x, r = (random(k, (4096, 64), jnp.bfloat16, loc=2.0) for k in ks[:2])
  s = random(ks[2], (64,), jnp.bfloat16, loc=1.0)
  alone = jax.jit(lambda x, r, s: op(x, r, s)[0])(x, r, s)
  y, h = jax.jit(op)(x, r, s)
  np.testing.assert_array_equal(np.asarray(alone, np.float32), np.asarray(y, np.float32))
  want = jax.jit(plain)(h, s)
  if has_bias:
    assert_ulp_close(np.asarray(y), np.asarray(want), 1, what="y against the plain op on h")
  else:
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(want, np.float32))


# --------------------------------------------------------------------------- the Pallas kernels


# (op, shape, x dtype, residual dtype, variant): one row block, rows not a multiple of the row
# block, the column loop, a float32 stream under bfloat16 x (two output cotangents), alpha != 1,
# an unused stream (no dh read), every epsilon placement and zero-centred scale.
PALLAS_CASES = [
    ("layer_norm", (9, 96), "float32", None, dict()),
    ("layer_norm", (5, 7), "bfloat16", "float32",
     dict(alpha=1.5, epsilon_placement="outside", zero_centered_scale=True)),
    ("layer_norm", (3, D_LOOP), "float32", None, dict(use_bias=False, alpha=0.7)),
    ("rms_norm", (37, 300), "float16", None, dict(use_scale=False, use_dh=False)),
    ("rms_norm", (12, D_LOOP), "bfloat16", None, dict(epsilon_placement="outside")),
]


@pytest.mark.parametrize("case", PALLAS_CASES,
                         ids=lambda c: f"{c[0]}-{c[1][0]}x{c[1][1]}-{c[2]}-{c[3]}")
def test_pallas_kernels_match_reference(case):
  op_name, shape, x_dtype, r_dtype, variant = case
  variant = dict(variant)
  inputs = _inputs(op_name, shape, x_dtype, r_dtype, use_scale=variant.pop("use_scale", True),
                   use_bias=variant.pop("use_bias", True))
  use_dh = variant.pop("use_dh", True)
  alpha = variant.pop("alpha", 1.0)
  _check(op_name, **inputs, alpha=alpha, kw=dict(epsilon=1e-3, **variant), use_dh=use_dh,
         modes=REV, backend=PALLAS)


def test_fused_kernels_match_add_then_plain_kernels():
  """The fused kernels against their decomposition: the add in XLA, the norm with the plain
  op's kernels. Same values and cotangents."""
  import dataclasses

  from jaxnorm.ops.norm import rules as _ad
  from jaxnorm.ops.norm import args as _norm_args
  from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
  from jaxnorm.backends.triton.backend import DecomposedAddConfig

  ks = jax.random.split(jax.random.key(3), 6)
  x = random(ks[0], (9, 96), jnp.bfloat16)
  r = random(ks[1], (9, 96), jnp.float32, loc=2.0)
  s, b = random(ks[2], (96,), jnp.float32, loc=1.0), random(ks[3], (96,), jnp.float32)
  dy, dh = random(ks[4], (9, 96), jnp.bfloat16), random(ks[5], (9, 96), jnp.float32)
  for center in (True, False):
    cfg, x2, r2, _, _ = _norm_args.prepare_add(
        x, r, s, b if center else None, op=LAYER_NORM if center else RMS_NORM,
        residual_scale=1.5, residual_dtype=None,
        epsilon=1e-5, axis=-1, mask=None, epsilon_placement="outside", zero_centered_scale=True,
        axis_name=None, axis_index_groups=None, dtype=None, impl="pallas",
        pallas=PALLAS.pallas)
    ((_, pallas),) = cfg.backend_config  # ("triton", its config)
    assert not isinstance(pallas, DecomposedAddConfig)
    outs = []
    unfused = dataclasses.replace(
        cfg, backend_config=(("triton", DecomposedAddConfig.of(pallas)),))
    assert unfused.backend_config[0][1].interpret == pallas.interpret and unfused != cfg
    for c in (cfg, unfused):
      fused = c is cfg
      f = lambda x, r, s, b, c=c: _ad.add_norm(c, x, r, s, b, None)  # noqa: E731
      names = program_text(f, x2, r2, s, b if center else None)
      op = "layer_norm" if center else "rms_norm"
      assert (f"jaxnorm_add_{op}_fwd" in names) == fused
      assert (f"jaxnorm_{op}_fwd" in names) != fused
      out, pull = jax.vjp(f, x2, r2, s, b if center else None)
      outs.append((out, pull((dy, dh))))
    (out_f, g_f), (out_u, g_u) = outs
    for a, e in zip(jax.tree.leaves((out_f, g_f)), jax.tree.leaves((out_u, g_u))):
      assert a.dtype == e.dtype
      assert_close(a, e, tol=_coarse(a.dtype), floor=1.0)


def test_pallas_kernel_outputs_and_statistics():
  x = random(jax.random.key(0), (11, 40), jnp.bfloat16)
  r = random(jax.random.key(1), (11, 40), jnp.float32, loc=3.0)
  y, h, shift, delta, rstd = _pallas.add_layer_norm_fwd(
      x, r, None, None, epsilon=1e-5, residual_scale=2.0, interpret=INTERPRET)
  assert y.dtype == jnp.bfloat16 and h.dtype == jnp.float32
  h64 = np.asarray(x, np.float64) + 2.0 * np.asarray(r, np.float64)
  np.testing.assert_allclose(np.asarray(h), h64, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(shift, np.float64) + np.asarray(delta), h64.mean(1),
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(rstd), 1 / np.sqrt(h64.var(1) + 1e-5), rtol=1e-5)
  dy = random(jax.random.key(2), (11, 40), jnp.bfloat16)

  def kernel_outputs(**kw):
    """Shapes of the outputs of the backward pallas_call (the kernel writes exactly these)."""
    jaxpr = jax.make_jaxpr(lambda h, dy: _pallas.add_rms_norm_bwd(
        h, None, rstd, dy, None, epsilon=1e-5, interpret=INTERPRET, **kw))(h, dy)
    found = []

    def walk(jx):
      for eqn in jx.eqns:
        if eqn.primitive.name == "pallas_call":
          found.append([(tuple(o.aval.shape), o.aval.dtype) for o in eqn.outvars])
        for sub in jaxprs_in_params(eqn.params):
          walk(sub)

    walk(jaxpr.jaxpr)
    (outs,) = found
    return outs

  # Same dtype, alpha = 1: the kernel writes dx once; it serves both input cotangents.
  assert kernel_outputs() == [((11, 40), jnp.float32)]
  dx, dres, _ = _pallas.add_rms_norm_bwd(h, None, rstd, dy, None, epsilon=1e-5,
                                         interpret=INTERPRET)
  np.testing.assert_array_equal(np.asarray(dx), np.asarray(dres))
  # Another dtype for x, or alpha != 1: both, from the same registers.
  assert kernel_outputs(x_dtype=jnp.bfloat16) == [((11, 40), jnp.bfloat16),
                                                   ((11, 40), jnp.float32)]
  assert kernel_outputs(residual_scale=2.0) == [((11, 40), jnp.float32)] * 2


def test_pallas_fused_kernels_lower_to_triton_for_cuda():
  rows, d = 37, 300
  x = jnp.ones((rows, d), jnp.bfloat16)
  r = jnp.ones((rows, d), jnp.float32)
  p, st_ = jnp.ones((d,), jnp.float32), jnp.ones((rows,), jnp.float32)
  kw = dict(epsilon=1e-5, residual_scale=1.5)
  fns = {
      "fwd": lambda x: _pallas.add_layer_norm_fwd(x, r, p, p, **kw),
      "bwd": lambda x: _pallas.add_layer_norm_bwd(r, p, st_, st_, st_, x, r, x_dtype=x.dtype,
                                                  **kw),
  }
  for name, fn in fns.items():
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    calls = text.count("custom_call @__gpu$xla.gpu.triton")
    assert calls == (1 if name == "fwd" else 2), (name, calls)


# --------------------------------------------------------------------------- transformations


def _data(d=12, lead=(3, 4), dtype=jnp.float32, seed=0):
  ks = jax.random.split(jax.random.key(seed), 6)
  return (random(ks[0], lead + (d,), dtype, loc=0.5), random(ks[1], lead + (d,), dtype, loc=1.0),
          random(ks[2], (d,), dtype, loc=1.0, scale=0.3), random(ks[3], (d,), dtype),
          random(ks[4], lead + (d,), dtype), random(ks[5], lead + (d,), dtype))


def _ref_ln(x, r, s, b, alpha=1.0):
  h = x + alpha * r
  return reference.layer_norm(h, s, b), h


def _fused_ln(x, r, s, b, alpha=1.0):
  return jaxnorm.add_layer_norm(x, r, s, b, residual_scale=alpha)


def _loss(f, w, w2):
  return lambda x, r, s, b: (jnp.sum(jnp.sin(f(x, r, s, b)[0]) * w)
                             + jnp.sum(jnp.cos(f(x, r, s, b)[1]) * w2))


def test_vmap_matches_batched():
  x, r, s, b, dy, dh = _data()
  f = lambda x, r, s, b: jax.vjp(_fused_ln, x, r, s, b)[1]((dy[0], dh[0]))  # noqa: E731
  per_example = jax.vmap(f, in_axes=(0, 0, None, None))(x, r, s, b)
  for i in range(x.shape[0]):
    want = jax.vjp(_ref_ln, x[i], r[i], s, b)[1]((dy[0], dh[0]))
    for got, w in zip(per_example, want):
      assert_close(got[i], w, jnp.float32)


def test_grad_of_grad(x64):
  x, r, s, b, w, w2 = _data(d=6, lead=(2,), dtype=jnp.float64)
  for alpha in (1.0, 1.5):
    mine = _loss(lambda *a: _fused_ln(*a, alpha=alpha), w, w2)
    theirs = _loss(lambda *a: _ref_ln(*a, alpha=alpha), w, w2)
    gg = lambda f: jax.grad(  # noqa: E731
        lambda x, r: jnp.sum(jnp.concatenate(
            [g.ravel() for g in jax.grad(f, argnums=(0, 1, 2))(x, r, s, b)]) ** 2),
        argnums=(0, 1))(x, r)
    for a, e in zip(gg(mine), gg(theirs)):
      assert_close(a, e, jnp.float64, what=f"grad-of-grad alpha={alpha}")


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_checkpoint_and_scan(kind):
  """A Pre-LN-like stack: the stream h and the pending sub-layer output are the scan carry."""
  x, r, s, b, w, _ = _data(d=8, lead=(5,))
  stack_s = jnp.stack([s, s * 0.5, s * 2.0])
  if kind == "layer_norm":
    fused, ref = _fused_ln, _ref_ln
  else:
    fused = lambda x, r, s, b: jaxnorm.add_rms_norm(x, r, s)  # noqa: E731
    ref = lambda x, r, s, b: (reference.rms_norm(x + r, s), x + r)  # noqa: E731

  def stack(f, remat):
    def body(carry, si):
      pending, h = carry
      y, h = f(pending, h, si, b)
      return (jnp.tanh(y), h), None
    if remat:
      body = jax.checkpoint(body)
    return lambda x, r, ss: jnp.sum(sum(jax.lax.scan(body, (x, r), ss)[0]) * w)

  for remat in (False, True):
    g = jax.jit(jax.grad(stack(fused, remat), argnums=(0, 1, 2)))(x, r, stack_s)
    g_ref = jax.grad(stack(ref, remat), argnums=(0, 1, 2))(x, r, stack_s)
    for a, e in zip(g, g_ref):
      assert_close(a, e, jnp.float32, what=f"scan remat={remat}")


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (host) devices")
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_shard_map_data_and_model_mesh(kind):
  """Batch split over "data", features over "model" (axis_name), params replicated on "data"."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
  x, r, s, b, dy, dh = _data(d=32, lead=(4, 3))
  if kind == "layer_norm":
    op = lambda x, r, s, b, **k: jaxnorm.add_layer_norm(  # noqa: E731
        x, r, s, b, residual_scale=1.3, epsilon_placement="outside", **k)
  else:
    op = lambda x, r, s, b, **k: jaxnorm.add_rms_norm(x, r, s, zero_centered_scale=True, **k)  # noqa: E731
  row, par = P("data", None, "model"), P("model")

  def sharded(x, r, s, b):
    return jax.shard_map(lambda x, r, s, b: op(x, r, s, b, axis_name="model"), mesh=mesh,
                         in_specs=(row, row, par, par), out_specs=(row, row))(x, r, s, b)

  def vjp(f):
    return jax.jit(lambda *a: (lambda out, pull: (out, pull((dy, dh))))(*jax.vjp(f, *a)))

  (y, h), grads = vjp(sharded)(x, r, s, b)
  (y_ref, h_ref), grads_ref = vjp(op)(x, r, s, b)
  assert_close(y, y_ref, jnp.float32, what="y")
  assert_close(h, h_ref, jnp.float32, what="h")
  for name, g, g_ref in zip(["dx", "dresidual", "dscale", "dbias"], grads, grads_ref):
    assert_close(g, g_ref, jnp.float32, what=name)



# --------------------------------------------------------------------------- errors


def test_bad_arguments_raise_clear_errors():
  x = jnp.ones((4, 16), jnp.float32)
  cases = [
      (dict(residual=jnp.ones((4, 15))), ValueError,
       r"residual must have the shape of x \(4, 16\).*\(4, 15\)"),
      (dict(residual=jnp.ones((16,))), ValueError, r"residual must have the shape of x"),
      (dict(residual=jnp.ones((4, 16), jnp.int32)), TypeError,
       "residual must have a floating dtype.*int32"),
      (dict(residual_dtype=jnp.int32), TypeError, "residual_dtype must be a floating dtype.*int32"),
      (dict(residual_dtype="nonsense"), TypeError, "residual_dtype must be a floating dtype"),
      (dict(residual_scale=jnp.ones(3)), ValueError, r"residual_scale must be a scalar.*\(3,\)"),
      (dict(residual_scale="2"), TypeError, "residual_scale must be a Python float.*str"),
      (dict(residual_scale=True), TypeError, "residual_scale must be a Python float"),
      (dict(residual_scale=float("nan")), ValueError, "residual_scale must be finite"),
  ]
  for op in (jaxnorm.add_layer_norm, jaxnorm.add_rms_norm):
    for kw, exc, match in cases:
      kw = dict(kw)
      r = kw.pop("residual", x)
      with pytest.raises(exc, match=match):
        op(x, r, **kw)
  # The checked kernel API applies the same rule (one validator), forward and backward.
  rstd = jnp.ones((4,), jnp.float32)
  kernel_api = [
      lambda a: _pallas.add_rms_norm_fwd(x, x, None, epsilon=1e-5, residual_scale=a,
                                         interpret=INTERPRET),
      lambda a: _pallas.add_rms_norm_bwd(x, None, rstd, x, None, epsilon=1e-5, residual_scale=a,
                                         interpret=INTERPRET),
  ]
  for kernel in kernel_api:
    for kw, exc, match in cases:
      if "residual_scale" in kw:
        with pytest.raises(exc, match=match):
          kernel(kw["residual_scale"])
  # A traced multiplier cannot be static configuration.
  with pytest.raises(TypeError, match="static Python float"):
    jax.jit(lambda a: jaxnorm.add_rms_norm(x, x, residual_scale=a))(jnp.float32(2.0))
  # A concrete 0-d array is accepted (converted to a float).
  y, _ = jaxnorm.add_rms_norm(x, x, residual_scale=np.float32(2.0))
  assert y.shape == x.shape
  # The plain ops' checks still apply (here: the scale's shape), naming the argument.
  with pytest.raises(ValueError, match="scale must have the normalized shape"):
    jaxnorm.add_layer_norm(x, x, jnp.ones(15))


# --------------------------------------------------------------------------- benchmark rows


def test_bench_fused_rows_on_cpu(tmp_path):
  from experiments.bench import cli as bench

  rc = bench.main(["--shapes", "16x32", "--dtypes", "bfloat16", "--repeats", "2",
                   "--sample-ms", "0.1", "--ops", "add_layer_norm,add_rms_norm",
                   "--out", str(tmp_path)])
  assert rc == 0

  report = json.loads((tmp_path / "bench.json").read_text())
  by = {(r["op"], r["impl"], r["mode"]): r for r in report["results"]}
  assert {impl for _, impl, _ in by} == set(bench.FUSED_IMPLEMENTATIONS)
  for op in bench.FUSED_OPS:
    for mode in bench.MODES:
      for impl in ("jaxnorm-xla", "unfused-xla", "flax-linen"):
        assert by[(op, impl, mode)]["status"] == "ok", (op, impl, mode)
      # Every row of the group is measured against the fused op's must-move bytes.
      want = {"fwd": 4 * 16 * 32 * 2, "bwd": 4 * 16 * 32 * 2}
      want["fwd+bwd"] = want["fwd"] + want["bwd"]
      n_p = 2 if op == "add_layer_norm" else 1
      want = want[mode] + {"fwd": 1, "bwd": 2, "fwd+bwd": 3}[mode] * n_p * 32 * 4
      assert by[(op, "unfused-xla", mode)]["bytes"] == want
      if jax.default_backend() == "cpu":
        assert by[(op, "jaxnorm-pallas", mode)]["status"] == "n/a"
  rows = {(r["op"], r["impl"], r["mode"]): r for r in report["fused"]}
  if jax.default_backend() == "cpu":
    assert set(rows) == {(op, "jaxnorm-xla", m) for op in bench.FUSED_OPS for m in bench.MODES}
  assert all(r["fused_over_unfused"] > 0 and r["fused_over_flax"] > 0 for r in rows.values())
  assert "fused / unfused" in (tmp_path / "bench.md").read_text()
