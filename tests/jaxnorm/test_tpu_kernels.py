"""The Pallas TPU (Mosaic) backend (``jaxnorm/backends/tpu/``, issue 66), checked from a CPU.

The backend is reached with ``impl="tpu"`` and ``backend_config=TpuConfig(interpret=True)``
off a TPU: the kernels run in Pallas TPU interpret mode (``pltpu.InterpretParams``, the TPU's
memory and grid simulated on the host); on a TPU the same tests run the compiled kernels
(``ON_TPU``). Small shapes, with feature widths that are not multiples of 128,
row counts that are not multiples of the row block, both ways of handling an unaligned width
(a full-width block, or ``pad_features``), float32 and bfloat16:

* every role against the float64 oracle (:mod:`jaxnorm.reference`; the residual add + norm
  against the XLA path), value and all cotangents;
* the kit (:func:`jaxnorm.testing.check_rule`): value, VJP, JVP and the adjoint identity, with
  second order, ``vmap``, ``checkpoint`` and per-head parameters;
* non-finite rows stay in their row, and a row past the float range is NaN, as on XLA;
* ``jax.export(..., platforms=["tpu"])`` of each op and of its gradient carries the kernels'
  ``tpu_custom_call``s (the Mosaic lowering ran; Mosaic's compiler did not: ``docs/tpu.md``);
* what the backend refuses, by name; its availability probe against a blocked module;
* the ``auto``-on-TPU switch (:data:`jaxnorm.backends.tpu.AUTO_ON_TPU`), off by default, and
  the measuring script in interpret mode.
"""

import functools
import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import reference
from jaxnorm import testing as jt
from jaxnorm.backends import table
from jaxnorm.backends.tpu import TPU, TpuConfig
from jaxnorm.backends.tpu import compat as tpu_compat
from jaxnorm.backends.tpu import config as tpu_config
from jaxnorm.models import TransformerConfig, TransformerLM

from _numerics import assert_allclose

# Interpret mode off a TPU (CI's CPU); the compiled kernels on a TPU, so the same file is the
# TPU correctness run (as tests/jaxnorm/test_pallas.py is the GPU one).
ON_TPU = jax.default_backend() == "tpu"


def _cfg(**kw):
  return TpuConfig(interpret=not ON_TPU, **kw)


INTERP = _cfg()


@pytest.fixture(scope="module", autouse=True)
def _tpu_registered():
  """The public registration, undone after this file (a no-op: the table holds the backend
  itself since issue 66 goal 3)."""
  own = TPU.name not in table.BACKENDS
  if own:
    table.register_backend(TPU)
  yield
  if own:
    table.unregister_backend(TPU.name)


def _data(rows, d, dtype, seed=0, res_dtype=None):
  k = jax.random.split(jax.random.key(seed), 6)
  x = (3.0 + 2.0 * jax.random.normal(k[0], (rows, d))).astype(dtype)
  r = jax.random.normal(k[1], (rows, d)).astype(res_dtype or dtype)
  s = (1.0 + 0.5 * jax.random.normal(k[2], (d,))).astype(dtype)
  b = (0.5 * jax.random.normal(k[3], (d,))).astype(dtype)
  dy = jax.random.normal(k[4], (rows, d)).astype(dtype)
  dh = jax.random.normal(k[5], (rows, d)).astype(dtype)
  return x, r, s, b, dy, dh


def _plain(op, x, s, b, **kw):
  return (jaxnorm.layer_norm(x, s, b, **kw) if op == "layer_norm"
          else jaxnorm.rms_norm(x, s, **kw))


def _oracle_vjp(op, x, s, b, dy, kw):
  """``(y, (dx, ds, db))`` of the float64 oracle (None where a parameter is absent)."""
  with jax.enable_x64(True):
    f64 = [None if a is None else jnp.asarray(np.asarray(a, np.float64)) for a in (x, s, b)]
    fn = reference.layer_norm if op == "layer_norm" else reference.rms_norm
    args = [a for a in f64 if a is not None]
    where = [a is not None for a in f64]

    def f(*arrays):
      it = iter(arrays)
      vals = [next(it) if w else None for w in where]
      return fn(vals[0], vals[1], vals[2], **kw) if op == "layer_norm" else fn(
          vals[0], vals[1], **kw)

    y, vjp = jax.vjp(f, *args)
    cts = iter(vjp(jnp.asarray(np.asarray(dy, np.float64))))
    return np.asarray(y), tuple(np.asarray(next(cts)) if w else None for w in where)


# (op, rows, d, dtype, kw, config): widths 1, 7, 300 (not multiples of 128), 128, 256; rows not
# multiples of the row block (37 in blocks of 8: five blocks, the last ragged); padded widths.
PLAIN = [
    ("layer_norm", 37, 300, "float32", {}, _cfg(block_rows=8)),
    ("layer_norm", 37, 300, "float32", dict(epsilon_placement="outside"),
     _cfg(block_rows=8, pad_features=True)),
    ("layer_norm", 20, 128, "bfloat16", dict(zero_centered_scale=True, epsilon=1e-3),
     _cfg(block_rows=16)),
    ("layer_norm", 16, 1, "float32", {}, INTERP),
    ("layer_norm", 9, 7, "float32", dict(scale=False), _cfg(pad_features=True)),
    ("rms_norm", 37, 300, "bfloat16", dict(epsilon_placement="outside", epsilon=1e-2),
     _cfg(block_rows=16)),
    ("rms_norm", 5, 7, "float32", dict(zero_centered_scale=True), _cfg(
                                                                           pad_features=True)),
    ("rms_norm", 24, 256, "float32", dict(scale=False), _cfg(block_rows=8)),
]


def _case_id(case):
  op, rows, d, dtype, kw, cfg = case
  extra = ",".join(f"{k}={v}" for k, v in kw.items())
  return f"{op}-{rows}x{d}-{dtype}-br{cfg.block_rows}{'-pad' if cfg.pad_features else ''}-{extra}"


@pytest.mark.parametrize("case", PLAIN, ids=_case_id)
def test_plain_op_matches_the_float64_oracle(case):
  op, rows, d, dtype, kw, cfg = case
  kw = dict(kw)
  x, _, s, b, dy, _ = _data(rows, d, jnp.dtype(dtype))
  s = s if kw.pop("scale", True) else None
  b = b if op == "layer_norm" else None
  params = [a for a in (s, b) if a is not None]

  def f(x, *p):
    it = iter(p)
    ss = next(it) if s is not None else None
    bb = next(it) if b is not None else None
    return _plain(op, x, ss, bb, impl="tpu", backend_config=cfg, **kw)

  y, vjp = jax.jit(lambda x, *p: jax.vjp(f, x, *p))(x, *params)
  grads = vjp(dy)
  y_ref, grads_ref = _oracle_vjp(op, x, s, b, dy, kw)
  assert y.shape == (rows, d) and y.dtype == x.dtype
  assert_allclose(y, y_ref, x.dtype, what="y")
  want = [g for g in grads_ref if g is not None]
  for name, got, ref in zip(("dx", "dparam0", "dparam1"), grads, want):
    assert got.dtype == x.dtype, name
    assert_allclose(got, ref, x.dtype, what=name)


# The residual add + norm (fused kernels) against the XLA path: alpha != 1 and a residual of
# another dtype (two cotangents written), the cotangent of h present.
ADD = [
    ("add_layer_norm", 37, 300, "float32", None, dict(residual_scale=0.5),
     _cfg(block_rows=8)),
    ("add_rms_norm", 21, 256, "bfloat16", "float32", {}, _cfg(block_rows=16)),
    ("add_rms_norm", 12, 100, "float32", None, dict(epsilon_placement="outside"),
     _cfg(pad_features=True)),
]


@pytest.mark.parametrize("case", ADD, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}-{c[3]}-{c[4]}")
def test_fused_add_matches_xla(case):
  op, rows, d, dtype, res_dtype, kw, cfg = case
  x, r, s, b, dy, dh = _data(rows, d, jnp.dtype(dtype), seed=1,
                             res_dtype=None if res_dtype is None else jnp.dtype(res_dtype))
  fn = getattr(jaxnorm, op)
  params = (s, b) if op == "add_layer_norm" else (s,)

  def run(impl, **cfg_kw):
    def f(x, r, *p):
      return fn(x, r, *p, impl=impl, **kw, **cfg_kw)
    def both(*a):
      (y, h), vjp = jax.vjp(f, *a)
      return (y, h), vjp((dy.astype(y.dtype), dh.astype(h.dtype)))
    return jax.jit(both)(x, r, *params)

  got, want = run("tpu", backend_config=cfg), run("xla")
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.shape == w.shape and g.dtype == w.dtype
    assert_allclose(g, w, jnp.dtype(dtype), what=op)


def _kit(op, x, params, kw, transforms=()):
  rule = functools.partial(getattr(jaxnorm, op), impl="tpu", backend_config=INTERP, **kw)
  plain = functools.partial(getattr(reference, op), **kw)
  tol = jt.Tolerance(compute_dtype=x.dtype) if kw.get("casting", "float32") != "float32" else (
      jt.Tolerance())
  jt.check_rule(rule, plain, (x, *params), transforms=transforms, tolerance=tol)


def _normal(shape, dtype, loc, scale, seed):
  rng = np.random.default_rng(seed)
  return jnp.asarray((loc + scale * rng.standard_normal(shape)).astype(jnp.dtype(dtype)))


@pytest.mark.parametrize("op,dtype,kw,transforms", [
    ("layer_norm", "float32", dict(epsilon=1e-3, epsilon_placement="outside"), ("grad2",)),
    ("rms_norm", "float32", dict(epsilon=1e-3, zero_centered_scale=True), ("vmap",)),
    ("layer_norm", "bfloat16", dict(epsilon=1e-5, casting="llama"), ("checkpoint",)),
    ("rms_norm", "bfloat16", dict(epsilon=1e-5, casting="t5"), ()),
])
def test_kit_value_vjp_jvp(op, dtype, kw, transforms):
  """The kit's value, VJP, JVP and adjoint checks (and one transformation) against float64
  autodiff of the oracle: second order goes through the derived rules around the kernels."""
  x = _normal((3, 5, 48), dtype, 1.0, 2.0, 0)
  params = [_normal((48,), dtype, 1.0, 0.5, 1)]
  if op == "layer_norm":
    params.append(_normal((48,), dtype, 0.0, 1.0, 2))
  _kit(op, x, params, kw, transforms)


def test_kit_per_head_parameters():
  """``x: (..., heads, d)`` with ``(heads, d)`` parameters: the heads are one more grid axis
  (RMSNorm's per-head path is the same code: ``backend.over_heads``)."""
  x = _normal((2, 3, 4, 40), "float32", 1.5, 1.0, 3)
  _kit("layer_norm", x, [_normal((4, 40), "float32", 1.0, 0.5, 4),
                         _normal((4, 40), "float32", 0.0, 1.0, 5)], dict(epsilon=1e-5))


@pytest.mark.parametrize("shape,kw,cfg", [
    ((37, 96), dict(group_size=32, norm_before_gate=False), _cfg(
                                                                        block_rows=24)),
    ((3, 5, 100), dict(group_size=50, casting="llama"), _cfg(
                                                                  pad_features=True)),
], ids=["3-groups-gate-first-ragged", "2-groups-llama-padded"])
def test_gated_rms_norm_kit(shape, kw, cfg):
  """Gated RMSNorm's kernels (each group a row of the grouped view; 37 rows of 3 groups in
  blocks of 24: the last ragged), value, VJP, JVP and adjoint against the float64 oracle, with
  ``vmap`` (one launch per member in the backward) in the second case."""
  x = _normal(shape, "float32", 0.5, 1.0, 7)
  z = _normal(shape, "float32", 0.0, 1.5, 8)
  s = _normal(shape[-1:], "float32", 1.0, 0.3, 9)
  kw = dict(kw, epsilon=1e-5)
  rule = functools.partial(jaxnorm.gated_rms_norm, impl="tpu", backend_config=cfg, **kw)
  plain = functools.partial(reference.gated_rms_norm, **kw)
  jt.check_rule(rule, plain, (x, z, s), transforms=("vmap",) if len(shape) == 3 else ())


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_non_finite_and_past_range_rows_stay_in_their_row(op):
  """A NaN row, an inf row and a row past float32's range (its statistic overflows: NaN, not
  finite zeros) give what XLA gives there, and every other row is untouched."""
  x, _, s, b, dy, _ = _data(19, 300, jnp.float32, seed=2)
  x = x.at[3].set(jnp.nan).at[8, 5].set(jnp.inf).at[12].multiply(1e30)
  b = b if op == "layer_norm" else None
  cfg = _cfg(block_rows=8)

  def run(impl, **kw):  # traced: a concrete row past the range is an error before any backend
    @jax.jit
    def both(x, s):
      y, vjp = jax.vjp(lambda x, s: _plain(op, x, s, b, impl=impl, **kw), x, s)
      return y, vjp(dy)[0]
    return both(x, s)

  (y, dx), (y_x, dx_x) = run("tpu", backend_config=cfg), run("xla")
  for got, want in ((y, y_x), (dx, dx_x)):
    bad = np.zeros(19, bool)
    bad[[3, 8, 12]] = True
    assert np.isnan(np.asarray(got)[bad]).all(axis=1).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isfinite(np.asarray(got)[~bad]).all()
    assert_allclose(np.asarray(got)[~bad], np.asarray(want)[~bad], jnp.float32)


def _tpu_text(fn, *args):
  return jax.export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()


def test_gated_casting_mode_in_bfloat16_matches_xla():
  """``casting="llama"`` on bfloat16 inputs (the plan rounds ``u_hat`` and the product to
  bfloat16 in the kernels): value and VJP within bfloat16's tolerance of the XLA path."""
  x, z, s, _, dy, _ = _data(12, 64, jnp.bfloat16, seed=4)
  kw = dict(group_size=16, norm_before_gate=True, casting="llama")

  def run(impl, **cfg):
    f = lambda x, z, s: jaxnorm.gated_rms_norm(x, z, s, impl=impl, **kw, **cfg)  # noqa: E731
    y, vjp = jax.vjp(f, x, z, s)
    return (y, *vjp(dy))

  for got, want in zip(run("tpu", backend_config=INTERP), run("xla")):
    assert got.dtype == want.dtype
    assert_allclose(got, want, jnp.bfloat16)


def test_gated_export_for_tpu_carries_the_kernels():
  x, z, s, _, _, _ = _data(40, 256, jnp.bfloat16)
  f = lambda x, z, s: jaxnorm.gated_rms_norm(  # noqa: E731
      x, z, s, group_size=128, impl="tpu", backend_config=TpuConfig())
  assert _tpu_text(f, x, z, s).count("tpu_custom_call") == 1
  loss = lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2)  # noqa: E731
  grad = _tpu_text(jax.grad(loss, argnums=(0, 1, 2)), x, z, s)
  assert grad.count("tpu_custom_call") == 2 and "jaxnorm_tpu_gated_rms_norm_bwd" in grad


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_export_for_tpu_carries_the_kernels(op):
  """``jax.export(platforms=["tpu"])`` from this CPU runs the Mosaic lowering of each kernel:
  the op's forward is one ``tpu_custom_call``, its gradient the forward and the backward."""
  x, r, s, b, _, _ = _data(40, 300, jnp.bfloat16)
  fn = getattr(jaxnorm, op)
  args = (x, r) if op.startswith("add_") else (x,)
  params = (s, b) if op.endswith("layer_norm") else (s,)
  cfg = TpuConfig()

  def y(*a):
    out = fn(*a, impl="tpu", backend_config=cfg)
    return out[0] if isinstance(out, tuple) else out

  forward = _tpu_text(y, *args, *params)
  assert forward.count("tpu_custom_call") == 1
  assert f"jaxnorm_tpu_{op}_fwd" in forward
  loss = lambda *a: jnp.sum(y(*a).astype(jnp.float32) ** 2)  # noqa: E731
  grad = _tpu_text(jax.grad(loss, argnums=tuple(range(len(args) + len(params)))), *args, *params)
  assert grad.count("tpu_custom_call") == 2
  assert f"jaxnorm_tpu_{op}_bwd" in grad


@pytest.mark.skipif(ON_TPU, reason="a TPU compiles the kernels")
def test_off_a_tpu_without_interpret_mode_is_an_error():
  x = jnp.ones((8, 128))
  with pytest.raises(ValueError, match=r"^impl='tpu' cannot run this call: the TPU kernels "
                                       r"compile for a TPU only, and the program is lowered for "
                                       r"'cpu'"):
    jaxnorm.rms_norm(x, impl="tpu", backend_config=TpuConfig())


def test_refusals_by_name():
  x = jnp.ones((8, 128))
  z, s = jnp.ones((8, 128)), jnp.ones(128)
  cases = [
      (lambda: jaxnorm.gated_rms_norm(x, z, s, impl="tpu", backend_config=INTERP,
                                      casting="t5", dtype=jnp.float16),
       "the TPU kernels take float32 or bfloat16 y (dtype=), got float16"),
      (lambda: jaxnorm.gated_rms_norm(x, z, s, group_size=4, impl="tpu",
                                      backend_config=_cfg(block_rows=16)),
       None),
      (lambda: jaxnorm.rms_norm(x, s, impl="tpu", backend_config=INTERP, memory_efficient=True),
       "the TPU kernels implement rms_norm without its options (memory_efficient=True)"),
      (lambda: jaxnorm.layer_norm(x, s, impl="tpu", backend_config=INTERP,
                                  use_fast_variance=True),
       "the TPU kernels implement layer_norm without its options (use_fast_variance=True)"),
      (lambda: jaxnorm.rms_norm(x.astype(jnp.float16), impl="tpu", backend_config=INTERP),
       "the TPU kernels take float32 or bfloat16 x, got float16"),
      (lambda: jaxnorm.rms_norm(x, impl="tpu", backend_config=INTERP, mask=x > 0),
       "the TPU kernels do not take a mask"),
      (lambda: jaxnorm.rms_norm(jnp.ones((2, tpu_config.MAX_D + 1)), impl="tpu",
                                backend_config=INTERP),
       f"the TPU kernels hold a whole row in one VMEM block, up to {tpu_config.MAX_D} features, "
       f"got {tpu_config.MAX_D + 1}"),
      (lambda: jaxnorm.rms_norm(x, s.astype(jnp.float16), impl="tpu", backend_config=INTERP,
                                casting="t5"),
       "the TPU kernels take float32 or bfloat16 casting= rounding, got float16"),
      (lambda: jaxnorm.add_rms_norm(x, x.astype(jnp.float16), impl="tpu",
                                    backend_config=INTERP),
       "the TPU kernels take float32 or bfloat16 residual, got float16"),
  ]
  for call, words in cases:
    if words is None:  # not a refusal: a config error of the gated view's block
      with pytest.raises(ValueError, match=r"^TpuConfig.block_rows must be a multiple of 32 for "
                                           r"gated RMSNorm in 32 groups, got 16"):
        call()
      continue
    with pytest.raises(ValueError, match="^" + re.escape(f"impl='tpu' cannot run this call: {words}")):
      call()
  # An op without entries in the backend's table is refused by name.
  from jaxnorm.backends.tpu.backend import TpuBackend
  bare = TpuBackend()
  assert bare.refusal((8, 128), jnp.float32, None, None, jaxnorm.OPS["rms_norm"].decl) == (
      "the TPU kernels do not implement rms_norm")
  with pytest.raises(TypeError, match=r"^backend_config= is a PallasConfig, which does not "
                                      r"configure the 'tpu' backend"):
    jaxnorm.rms_norm(x, impl="tpu", backend_config=jaxnorm.PallasConfig())
  with pytest.raises(ValueError, match=r"TpuConfig.block_rows must be None or a positive "
                                       r"multiple of 8"):
    TpuConfig(block_rows=12)
  with pytest.raises(ValueError, match=r"block_rows must be a multiple of 16 for bfloat16"):
    jaxnorm.rms_norm(x.astype(jnp.bfloat16), impl="tpu",
                     backend_config=_cfg(block_rows=8))
  with pytest.raises(TypeError, match=r"TpuConfig.interpret must be a bool, got 1"):
    TpuConfig(interpret=1)


@pytest.mark.parametrize("blocked", ["jax.experimental.pallas.tpu", "jax.experimental.pallas"])
def test_unavailable_where_pallas_tpu_is_blocked(monkeypatch, blocked):
  """The probe itself, against the module really blocked (``None`` in ``sys.modules``, Python's
  marker for a module ``import`` refuses): the backend is unavailable by name."""
  tpu_compat.missing.cache_clear()
  monkeypatch.setitem(sys.modules, blocked, None)
  try:
    why = TPU.unavailable()
    assert why is not None and "has no TPU backend" in why, why
    with pytest.raises(ValueError, match=r"^impl='tpu' cannot run this call: jax .*'s Pallas has "
                                         r"no TPU backend"):
      jaxnorm.rms_norm(jnp.ones((8, 128)), impl="tpu", backend_config=INTERP)
  finally:
    monkeypatch.undo()
    tpu_compat.missing.cache_clear()
  assert TPU.unavailable() is None


def test_auto_on_tpu_stays_xla_until_the_switch(monkeypatch):
  """Goal 4: the declaration's switch (off) gives ``impl="auto"`` no TPU platform; flipped
  alone, the table's per-platform choice (read from the backends' declarations) lowers ``auto``
  to the kernels for a TPU, the model's training step included."""
  from jaxnorm.backends.tpu import AUTO_ON_TPU
  assert AUTO_ON_TPU is False and TPU.auto_platforms == ()
  assert table.BACKENDS["tpu"] is TPU and "tpu" in table.PREFERENCE
  x, s = jnp.ones((16, 256), jnp.bfloat16), jnp.ones(256, jnp.bfloat16)

  # A TPU host, as the table's tests stand for a GPU host (auto gives a kernel backend a
  # platform only on a host whose default platform has one).
  monkeypatch.setattr(table, "host_platform", lambda: "tpu", raising=False)

  def auto_text(on):
    monkeypatch.setattr(TPU, "auto_on_tpu", on)
    assert (table.PLATFORM_BACKENDS.get("tpu") == "tpu") == on

    def loss(x, s):  # a new function each time: no trace cached under the other switch
      return jnp.sum(jaxnorm.rms_norm(x, s, impl="auto").astype(jnp.float32))

    return _tpu_text(jax.grad(loss, argnums=(0, 1)), x, s)

  assert "tpu_custom_call" not in auto_text(False)
  assert auto_text(True).count("tpu_custom_call") == 2
  assert TPU.auto_platforms == ("tpu",)
  # The model's training step (its norms take impl="auto"): its norms' kernels, forward and
  # backward, for a TPU.
  model = TransformerLM(TransformerConfig(d_model=128, n_layers=1, n_heads=2, d_ff=128,
                                          max_len=16, norm_impl="jaxnorm", scan_layers=False),
                        rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tokens = jnp.zeros((2, 8), jnp.int32)

  def step_loss(params):
    return jnp.mean(nnx.merge(graphdef, params)(tokens) ** 2)

  text = _tpu_text(jax.grad(step_loss), params)
  # (Equal kernel calls are one function of the module, called from each norm.)
  assert text.count("tpu_custom_call") >= 2
  assert re.search(r"jaxnorm_tpu_\w*norm_fwd", text) and re.search(r"jaxnorm_tpu_\w*norm_bwd", text)


def test_measuring_script_in_interpret_mode(tmp_path):
  """The TPU measuring script (``python -m experiments.bench.tpu``) at small shapes in interpret
  mode: every entry checked against XLA and timed, JSON written."""
  from experiments.bench import tpu as tpu_bench
  rc = tpu_bench.main(["--shapes", "24x300", "--dtypes", "float32", "--ops", "add_rms_norm",
                       "--repeats", "1", "--sample-ms", "0.1", "--out", str(tmp_path)]
                      + ([] if ON_TPU else ["--interpret"]))
  assert rc == 0
  report = json.loads((tmp_path / "tpu-bench.json").read_text())
  assert {"device", "versions", "date", "interpret", "results"} <= set(report)
  assert report["interpret"] is not ON_TPU
  by = {(r["op"], r["impl"], r["mode"]): r for r in report["results"]}
  assert len(by) == 2 * 3
  for r in report["results"]:
    assert r["status"] == "ok" and r["median_s"] > 0 and r["max_abs_err_vs_xla"] < 1e-4, r


@pytest.mark.parametrize("d", [1, 7, 128, 300, 1024, 4096, 8192, tpu_config.MAX_D])
@pytest.mark.parametrize("rows", [1, 37, 100000])
def test_block_rules(rows, d):
  """The row block: a multiple of the largest sublane count among the operands (8 for float32,
  16 for bfloat16), or all the rows; about TARGET_TILE elements; the VMEM asked for only where
  the estimate passes the smallest default, never past the cap."""
  for dtypes, sub in (((jnp.float32,), 8), ((jnp.float32, jnp.bfloat16), 16)):
    br = tpu_config.block_rows(rows, d, dtypes, TpuConfig())
    if br == rows:
      assert rows <= max(sub, tpu_config.TARGET_TILE // tpu_config.padded_width(d, True))
    else:
      assert br % sub == 0 and br < rows
      assert br == sub or br * tpu_config.padded_width(d, True) <= tpu_config.TARGET_TILE
    limit = tpu_config.vmem_limit_bytes(br, d, [2, 2, 2])
    assert limit is None or limit <= tpu_config.MAX_VMEM_LIMIT_BYTES
  assert tpu_config.vmem_limit_bytes(16, tpu_config.MAX_D, [2] * 4) is not None
  assert tpu_config.padded_width(300, True) == 384 and tpu_config.padded_width(300, False) == 300
