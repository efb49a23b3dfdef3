"""The fused Pallas kernels: in interpret mode on a CPU (CI), compiled on a GPU.

Outputs, statistics and gradients are compared with ``jax.vjp`` of :mod:`jaxnorm.reference`
(random cotangents) and with the core ops' XLA path, at feature sizes that are 1, not powers
of two, and larger than one block, with row counts that are not multiples of the row block
and more row tiles than backward programs, for float32/bfloat16/float16 and every variant.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
import _kernel_api as _pallas
from jaxnorm import reference
from jaxnorm.backends.triton.common import backward_config
from jaxnorm.backends.triton.config import GPU_BACKENDS, MAX_BLOCK_D, TARGET_TILE, block_config, supported

from _numerics import assert_allclose, assert_ulp_close

D_LOOP = MAX_BLOCK_D + 8  # two column blocks: the column loop.

# Interpret mode wherever the kernels cannot be compiled (CI's CPU); real kernels on a GPU, so
# the same file is the GPU correctness run.
INTERPRET = jax.default_backend() not in GPU_BACKENDS
PALLAS = jaxnorm.PallasConfig(interpret=INTERPRET)


def _inputs(rows, d, dtype, seed=0, offset=3.0):
  kx, ks, kb, kd = jax.random.split(jax.random.key(seed), 4)
  x = (offset + 2.0 * jax.random.normal(kx, (rows, d), jnp.float32)).astype(dtype)
  scale = 1.0 + 0.5 * jax.random.normal(ks, (d,), jnp.float32)
  bias = 0.5 * jax.random.normal(kb, (d,), jnp.float32)
  dy = jax.random.normal(kd, (rows, d), jnp.float32).astype(dtype)
  return x, scale, bias, dy


def _close(got, want, dtype, what):
  # Float32 statistics in every case, so the low-precision rows only see the final rounding of
  # y and dx (and the float32 parameter gradients a little of it): the tolerance of x's dtype.
  assert_allclose(got, want, dtype, what=what)


def _reference_vjp(op, x, scale, bias, dy, **kw):
  """``y`` and the cotangents of the autodiff reference, under one ``jax.jit``."""
  fn = getattr(reference, op)
  args = (x, scale, bias) if op == "layer_norm" else (x, scale)
  present = tuple(a is not None for a in args)

  def f(*arrays):  # absent parameters are passed to the reference as None
    it = iter(arrays)
    return fn(*[next(it) if p else None for p in present], **kw)

  @jax.jit
  def run(arrays, dy):
    y, vjp = jax.vjp(f, *arrays)
    return y, vjp(dy)

  y, grads = run([a for a in args if a is not None], dy)
  grads = iter(grads)
  return y, tuple(next(grads) if p else None for p in present)


def _kernels(op, x, scale, bias, dy, *, epsilon=1e-5, epsilon_placement="inside",
             zero_centered_scale=False, out_dtype=None):
  kw = dict(epsilon=epsilon, epsilon_placement=epsilon_placement,
            zero_centered_scale=zero_centered_scale, interpret=INTERPRET)
  if op == "layer_norm":
    y, shift, delta, rstd = _pallas.layer_norm_fwd(x, scale, bias, out_dtype=out_dtype, **kw)
    grads = _pallas.layer_norm_bwd(x, scale, shift, delta, rstd, dy, has_bias=bias is not None,
                                   **kw)
    return y, grads, (shift, delta, rstd)
  y, rstd = _pallas.rms_norm_fwd(x, scale, out_dtype=out_dtype, **kw)
  return y, _pallas.rms_norm_bwd(x, scale, rstd, dy, **kw), (rstd,)


def _check_against_reference(op, rows, d, dtype, *, with_scale=True, with_bias=True, **kw):
  x, scale, bias, dy = _inputs(rows, d, dtype)
  scale = scale if with_scale else None
  bias = bias if (with_bias and op == "layer_norm") else None
  if kw.get("out_dtype") is not None:
    dy = dy.astype(kw["out_dtype"])  # the cotangent has the dtype of y
  y, grads, _ = _kernels(op, x, scale, bias, dy, **kw)
  ref_kw = {k: v for k, v in kw.items() if k != "out_dtype"}
  ref_kw.setdefault("epsilon", 1e-5)
  y_ref, grads_ref = _reference_vjp(op, x, scale, bias, dy, dtype=kw.get("out_dtype"), **ref_kw)
  assert y.shape == (rows, d) and y.dtype == y_ref.dtype
  _close(y, y_ref, kw.get("out_dtype") or dtype, "y")
  names = ("dx", "dscale", "dbias")
  for name, got, want in zip(names, grads, grads_ref):
    if want is None:
      assert got is None, f"{name} should be None when its parameter is absent"
      continue
    assert got.shape == want.shape, name
    if name != "dbias":  # dbias comes back in float32; the caller casts it.
      assert got.dtype == want.dtype, name
    _close(got, want, dtype, name)


# (op, rows, d, dtype, variant): every shape and every variant appears for both ops. Shapes:
# 5x7 (fewer rows than one row tile, d not a power of two), 150x300 (19 row tiles for 8
# backward programs: several steps, the last one masked), 20xD_LOOP and 12xD_LOOP (two column
# blocks: the column loop, with several row tiles per backward program), 3xD_LOOP (the
# column loop), 16x1 (x_hat = 0), 37x300 and 9x96.
CASES = [
    ("layer_norm", 5, 7, jnp.float32, {}),
    ("layer_norm", 150, 300, jnp.float32, dict(epsilon_placement="outside")),
    ("layer_norm", 20, D_LOOP, jnp.float32, dict(zero_centered_scale=True, with_bias=False)),
    ("layer_norm", 16, 1, jnp.float32, {}),
    ("layer_norm", 37, 300, jnp.float32,
     dict(with_scale=False, with_bias=False, out_dtype=jnp.bfloat16)),
    ("layer_norm", 9, 96, jnp.float32,
     dict(epsilon_placement="outside", zero_centered_scale=True, epsilon=1e-2)),
    ("layer_norm", 9, 96, jnp.bfloat16, {}),
    ("layer_norm", 3, D_LOOP, jnp.float16, dict(epsilon_placement="outside")),
    ("rms_norm", 5, 7, jnp.float32, dict(epsilon_placement="outside")),
    ("rms_norm", 150, 300, jnp.float32, dict(zero_centered_scale=True)),
    ("rms_norm", 16, 1, jnp.float32, dict(epsilon_placement="outside", epsilon=1e-2)),
    ("rms_norm", 37, 300, jnp.float32, dict(with_scale=False, out_dtype=jnp.bfloat16)),
    ("rms_norm", 9, 96, jnp.float16, dict(zero_centered_scale=True)),
    ("rms_norm", 12, D_LOOP, jnp.bfloat16, dict(epsilon_placement="outside")),
]


def _case_id(case):
  op, rows, d, dtype, variant = case
  extra = ",".join(f"{k}={getattr(v, '__name__', v)}" for k, v in variant.items())
  return f"{op}-{rows}x{d}-{jnp.dtype(dtype).name}" + (f"-{extra}" if extra else "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_kernels_match_reference(case):
  op, rows, d, dtype, variant = case
  _check_against_reference(op, rows, d, dtype, **variant)


def test_statistics_mean_what_the_contract_says():
  x, scale, bias, _ = _inputs(11, 300, jnp.float32)
  _, shift, delta, rstd = _pallas.layer_norm_fwd(x, scale, bias, epsilon=1e-5,
                                                 epsilon_placement="inside",
                                                 zero_centered_scale=False, out_dtype=None,
                                                 interpret=INTERPRET)
  x64 = np.asarray(x, np.float64)
  mean = x64.mean(axis=1)
  var = x64.var(axis=1)
  assert shift.dtype == delta.dtype == rstd.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(shift), x64[:, 0].astype(np.float32))  # a copy
  np.testing.assert_allclose(np.asarray(shift, np.float64) + np.asarray(delta), mean, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(rstd), 1 / np.sqrt(var + 1e-5), rtol=1e-5)
  _, rstd_rms = _pallas.rms_norm_fwd(x, None, epsilon=1e-5, interpret=INTERPRET)
  np.testing.assert_allclose(np.asarray(rstd_rms), 1 / np.sqrt((x64**2).mean(1) + 1e-5),
                             rtol=1e-5)


def test_large_mean_small_spread_is_accurate():
  # mean/std = 1e4: a one-pass E[x^2] - E[x]^2 loses every digit in float32. (Same shape and
  # configuration as the test above: the compiled kernel is reused.)
  x = 1e4 + jax.random.normal(jax.random.key(1), (11, 300), jnp.float32)
  ones, zeros = jnp.ones((300,), jnp.float32), jnp.zeros((300,), jnp.float32)
  y, *_ = _pallas.layer_norm_fwd(x, ones, zeros, epsilon=1e-5, epsilon_placement="inside",
                                 zero_centered_scale=False, out_dtype=None, interpret=INTERPRET)
  x64 = np.asarray(x, np.float64)
  want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(np.asarray(y), want, atol=2e-3)


def _core_vjp(op, impl, x, scale, bias, dy, **kw):
  """``(y, *cotangents)`` of the core op ``jaxnorm.<op>(..., impl=impl)`` under one jit."""
  fn = getattr(jaxnorm, op)
  params = (scale, bias) if op == "layer_norm" else (scale,)
  pallas = None if impl == "xla" else PALLAS  # impl="xla" takes no backend config

  @jax.jit
  def run(x, params, dy):
    y, vjp = jax.vjp(lambda x, *p: fn(x, *p, impl=impl, pallas=pallas, **kw), x, *params)
    return (y, *vjp(dy))

  return run(x, params, dy)


def test_constant_rows_match_xla_path():
  # Zero-variance rows with "outside": the variance-path term is zeroed (autodiff of the
  # reference gives NaN there). Compare with the core op's XLA path.
  placement = "outside"
  x, scale, bias, dy = _inputs(6, 24, jnp.float32)
  x = x.at[::2].set(1.5)
  for op in ("layer_norm", "rms_norm"):
    kw = dict(epsilon=1e-3, epsilon_placement=placement)
    y, grads, _ = _kernels(op, x, scale, bias if op == "layer_norm" else None, dy, **kw)
    want = _core_vjp(op, "xla", x, scale, bias, dy, **kw)
    for got, want in zip((y, *grads), want):
      assert np.all(np.isfinite(np.asarray(got)))
      _close(got, want, jnp.float32, f"{op} {placement}")


def _core_inputs(param_shape):
  kx, ks, kb, kd = jax.random.split(jax.random.key(2), 4)
  x = 3.0 + jax.random.normal(kx, (2, 5, 6, 50), jnp.float32)
  scale = jax.random.normal(ks, param_shape, jnp.float32)
  bias = jax.random.normal(kb, param_shape, jnp.float32)
  dy = jax.random.normal(kd, x.shape, jnp.float32)
  return x, scale, bias, dy


@pytest.mark.parametrize("op,param_shape", [("layer_norm", (6, 50)), ("rms_norm", (300,))])
def test_core_op_pallas_matches_xla(op, param_shape):
  # The core op with impl="pallas" (interpret mode requested through PallasConfig) on a
  # 4-D input with two trailing normalized axes, against impl="xla"; parameters of shape (d,)
  # or of the normalized shape.
  x, scale, bias, dy = _core_inputs(param_shape)
  kw = dict(axis=(-2, -1), epsilon=1e-5, zero_centered_scale=True)
  want = _core_vjp(op, "xla", x, scale, bias, dy, **kw)
  got = _core_vjp(op, "pallas", x, scale, bias, dy, **kw)
  for g, w in zip(got, want):
    assert g.shape == w.shape and g.dtype == w.dtype
    _close(g, w, jnp.float32, op)


@pytest.mark.parametrize("rows,d", [(37, 300), (3, D_LOOP)])
def test_kernels_lower_to_triton_for_cuda(rows, d):
  # Cross-lowering for CUDA on this CPU-only machine: builds the Triton IR of every kernel
  # (power-of-two tensor shapes, supported primitives) and checks that pallas_call picked the
  # Triton backend with the heuristic's warps and grid. Only ptxas compilation is left out (the
  # same file compiles and runs the kernels when JAX is on a GPU).
  x = jnp.ones((rows, d), jnp.bfloat16)
  p = jnp.ones((d,), jnp.float32)
  st = jnp.ones((rows,), jnp.float32)
  kw = dict(epsilon=1e-5, epsilon_placement="outside", zero_centered_scale=True)
  fns = {
      "ln_fwd": lambda x: _pallas.layer_norm_fwd(x, p, p, **kw),
      "ln_bwd": lambda x: _pallas.layer_norm_bwd(x, p, st, st, st, x, has_bias=True, **kw),
      "rms_fwd": lambda x: _pallas.rms_norm_fwd(x, p, **kw),
      "rms_bwd": lambda x: _pallas.rms_norm_bwd(x, None, st, x, **kw),
  }
  cfg = block_config(rows, d, "bfloat16")
  for name, fn in fns.items():
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    calls = text.count("custom_call @__gpu$xla.gpu.triton")
    # backward: the dx kernel, then the partial-sum reduction when there is a parameter
    # (rms_bwd is called without a scale: no reduction).
    assert calls == (2 if name == "ln_bwd" else 1), (name, calls)
    warps = cfg.num_warps if name.endswith("fwd") else backward_config(cfg).num_warps
    assert f"num_warps = {warps} : i32" in text, name
    grid = -(-rows // cfg.block_rows) if name.endswith("fwd") else cfg.bwd_programs
    assert f"grid_x = {grid} : i32" in text, name


def test_supported():
  assert supported((8, 128), jnp.float32) == (True, "")
  assert supported((8, 128), jnp.bfloat16, backend="gpu") == (True, "")
  for shape, dtype, backend, words in [
      ((8, 128), jnp.float64, None, "float64"),
      ((2, 8, 128), jnp.float32, None, "2-D"),
      ((0, 128), jnp.float32, None, "empty"),
      ((8, 128), jnp.float32, "cpu", "'cpu'"),
  ]:
    ok, reason = supported(shape, jnp.dtype(dtype), backend=backend)
    assert not ok and words in reason, reason


def test_bad_arguments_raise_clear_errors():
  x, scale, bias, dy = _inputs(4, 16, jnp.float32)
  kw = dict(epsilon=1e-5, interpret=INTERPRET)
  with pytest.raises(ValueError, match=r"x must be 2-D .*\(2, 2, 16\)"):
    _pallas.layer_norm_fwd(x.reshape(2, 2, 16), scale, bias, **kw)
  with pytest.raises(ValueError, match=r"scale must have the normalized shape \(16,\).*got "
                                       r"shape \(15,\)"):
    _pallas.rms_norm_fwd(x, scale[:15], **kw)
  with pytest.raises(ValueError, match=r"scale and bias of the kernel functions must have shape "
                                       r"\(16,\).*\[\(4, 16\), None\]"):
    _pallas.rms_norm_fwd(x, jnp.ones((4, 16)), **kw)
  with pytest.raises(TypeError, match="out_dtype must be a floating dtype or None, got int32"):
    _pallas.rms_norm_fwd(x, None, out_dtype=jnp.int32, **kw)
  with pytest.raises(TypeError, match="interpret must be a bool, got 1"):
    _pallas.rms_norm_fwd(x, None, epsilon=1e-5, interpret=1)
  with pytest.raises(ValueError, match=r"residual must have the shape of x \(4, 16\)"):
    _pallas.add_rms_norm_fwd(x, x[:3], None, **kw)
  with pytest.raises(ValueError, match=r"dh must have the shape of h \(4, 16\)"):
    _pallas.add_rms_norm_bwd(x, None, jnp.ones(4), dy, dy[:3], **kw)
  with pytest.raises(ValueError, match=r"scale must have the normalized shape \(16,\) of h"):
    _pallas.add_rms_norm_bwd(x, scale[:15], jnp.ones(4), dy, None, **kw)
  with pytest.raises(ValueError, match=r"x of shape \(0, 16\) and dtype float32 is not "
                                       r"supported by the Pallas kernels: the input is empty"):
    _pallas.rms_norm_fwd(x[:0], None, **kw)
  with pytest.raises(TypeError, match="x must have a floating dtype"):
    _pallas.rms_norm_fwd(x.astype(jnp.int32), None, **kw)
  with pytest.raises(ValueError, match="epsilon_placement must be one of"):
    _pallas.rms_norm_fwd(x, None, epsilon_placement="middle", **kw)
  with pytest.raises(ValueError, match=r"dy must have the shape of x"):
    _pallas.rms_norm_bwd(x, None, jnp.ones((4,)), dy[:3], **kw)
  with pytest.raises(ValueError, match=r"rstd must have shape \(4,\)"):
    _pallas.layer_norm_bwd(x, None, jnp.ones(4), jnp.ones(4), jnp.ones(5), dy, **kw)
  with pytest.raises(ValueError, match="epsilon must be finite"):
    _pallas.layer_norm_fwd(x, None, None, epsilon=-1.0, interpret=INTERPRET)


def test_kernel_api_checks_through_the_ops_prepare():
  """The kernel functions and the ops describe a call once (``_norm_args.prepare``): each bad value
  gets the same message from both."""
  x, scale, bias, _ = _inputs(4, 16, jnp.float32)
  cases = [dict(epsilon=float("nan")), dict(epsilon=1e-5, epsilon_placement="middle"),
           dict(epsilon=1e-5, zero_centered_scale=1)]
  for kw in cases:
    msgs = []
    for call in (lambda: _pallas.layer_norm_fwd(x, scale, bias, interpret=INTERPRET, **kw),
                 lambda: jaxnorm.layer_norm(x, scale, bias, impl="pallas",
                                            pallas=jaxnorm.PallasConfig(interpret=INTERPRET),
                                            **kw)):
      with pytest.raises((ValueError, TypeError)) as err:
        call()
      msgs.append(str(err.value))
    assert msgs[0] == msgs[1], msgs
  for bad in (scale[:15], scale.astype(jnp.int32)):
    msgs = []
    for call in (lambda: _pallas.rms_norm_fwd(x, bad, epsilon=1e-5, interpret=INTERPRET),
                 lambda: jaxnorm.rms_norm(x, bad, impl="pallas",
                                          pallas=jaxnorm.PallasConfig(interpret=INTERPRET))):
      with pytest.raises((ValueError, TypeError)) as err:
        call()
      msgs.append(str(err.value))
    assert msgs[0] == msgs[1], msgs


@pytest.mark.parametrize("d", [1, 7, 96, 300, 1024, 8192, 8193, 50000])
@pytest.mark.parametrize("rows", [1, 37, 100000])
def test_block_config_heuristic(rows, d):
  cfg = block_config(rows, d, "bfloat16", "H100", 132)
  pow2 = lambda n: n >= 1 and n & (n - 1) == 0  # noqa: E731
  assert pow2(cfg.block_d) and pow2(cfg.block_rows) and pow2(cfg.reduce_block_d)
  assert cfg.block_d <= MAX_BLOCK_D
  assert cfg.num_col_blocks * cfg.block_d >= d > (cfg.num_col_blocks - 1) * cfg.block_d
  assert cfg.block_rows <= max(1, TARGET_TILE // cfg.block_d)
  assert 1 <= cfg.num_warps <= 8
  assert 1 <= cfg.bwd_programs <= min(2 * 132, -(-rows // cfg.block_rows))
  assert block_config(rows, d, "bfloat16", "H100", 132) is cfg  # cached


def test_bench_command_on_cpu(tmp_path):
  from experiments.bench import cli as bench

  rc = bench.main(["--shapes", "16x32", "--dtypes", "float32", "--repeats", "2",
                   "--sample-ms", "0.1", "--ops", "layer_norm,rms_norm",
                   "--impls", "jaxnorm-xla,jaxnorm-pallas,jax-pallas-ops",
                   "--out", str(tmp_path)])
  assert rc == 0
  report = json.loads((tmp_path / "bench.json").read_text())
  assert {"device", "versions", "date", "copy", "results", "ln_over_rms", "memory"} <= set(report)
  by = {(r["op"], r["impl"], r["mode"]): r for r in report["results"]}
  assert len(by) == 2 * 3 * 3
  for op in ("layer_norm", "rms_norm"):
    for mode in ("fwd", "bwd", "fwd+bwd"):
      assert by[(op, "jaxnorm-xla", mode)]["status"] == "ok"
      assert by[(op, "jaxnorm-xla", mode)]["median_s"] > 0
      if jax.default_backend() == "cpu":
        assert by[(op, "jaxnorm-pallas", mode)]["status"] == "n/a"
        assert "GPU" in by[(op, "jaxnorm-pallas", mode)]["reason"]
        assert by[(op, "jax-pallas-ops", mode)]["status"] == "n/a"
  assert {r["mode"] for r in report["ln_over_rms"] if r["impl"] == "jaxnorm-xla"} == {
      "fwd", "bwd", "fwd+bwd"}
  assert report["memory"]
  if jax.default_backend() == "cpu":
    assert all(m["impl"] == "jaxnorm-xla" for m in report["memory"])
  assert "| layer_norm | jaxnorm-xla |" in (tmp_path / "bench.md").read_text()


def test_bench_tables_interpret_the_kernels():
  """With ``interpret=True`` every jaxnorm entry of the bench's tables runs (its kernels
  interpreted) and agrees with XLA: the plain ops' and the fused ops' (the fused table's Pallas
  entry once ran the compiled kernels and refused a CPU)."""
  from experiments.bench import impls

  x = jnp.arange(8 * 64, dtype=jnp.float32).reshape(8, 64) / 64
  r, s, b = jnp.full((8, 64), 0.5), jnp.linspace(0.5, 1.5, 64), jnp.linspace(-1, 1, 64)
  plain, fused = impls.implementations(interpret=True), impls.fused_implementations(interpret=True)
  for op in ("layer_norm", "rms_norm"):
    want = plain["jaxnorm-xla"](op)(x, s, b)
    np.testing.assert_allclose(plain["jaxnorm-pallas"](op)(x, s, b), want, rtol=1e-5, atol=1e-5)
    want_y, want_h = fused["jaxnorm-xla"]("add_" + op)(x, r, s, b)
    for impl in ("jaxnorm-pallas", "unfused-pallas"):
      y, h = fused[impl]("add_" + op)(x, r, s, b)
      np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
      np.testing.assert_array_equal(h, want_h)


def test_kernels_run_under_x64(x64):
  """With ``jax_enable_x64`` on, float32 calls still run the kernels (every index int32), and
  give the values they give without it: forward, gradient, plain and fused, with the column
  loop (two column blocks)."""
  x, scale, bias, dy = _inputs(5, D_LOOP, jnp.float32)

  def run():
    def loss(x, s, b):
      y1 = jaxnorm.layer_norm(x, s, b, impl="pallas", pallas=PALLAS)
      y2, h = jaxnorm.add_rms_norm(x, 0.5 * x, s, impl="pallas", pallas=PALLAS)
      return jnp.sum(y1 * dy) + jnp.sum(y2 * dy) + jnp.sum(h)
    return jax.value_and_grad(loss, argnums=(0, 1, 2))(x, scale, bias)

  got = run()
  with jax.enable_x64(False):
    want = run()
  # The same float32 operations, but not one program: with x64 the index arithmetic around
  # them is int64, and XLA may fuse, and so order the float32 sums of the gradients, otherwise
  # (bit for bit on this Xeon by default; up to 2 ulps of the largest entry with XLA:CPU's
  # older emitters, --xla_cpu_use_fusion_emitters=false). A few roundings of terms no larger
  # than the largest entry: within 4 ulps of it.
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.dtype == w.dtype == jnp.float32
    assert_ulp_close(g, w, 4, of="max", what="x64 vs x32")
