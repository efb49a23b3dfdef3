"""A backend registered from outside the library (issue 51, goal 4; issue 66, goal 3): the
float64-oracle callback backend of ``tests/_oracle_backend.py``, its own file plus one call, with
its own config class, reached by ``impl="oracle64"`` and by ``impl="auto"`` (its platform, cpu,
in auto's per-platform choice beside the library's Triton and TPU backends) through the one
dispatch, for every op that has a backend and every role of its table."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm.backends import table

import _oracle_backend as oracle

CFG = oracle.OracleConfig()


@pytest.fixture(autouse=True)
def _oracle_registered():
  with oracle.registered():
    yield


def _inputs():
  keys = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(keys[0], (6, 32)) + 0.5
  r = jax.random.normal(keys[1], (6, 32))
  s = 1.0 + 0.1 * jax.random.normal(keys[2], (32,))
  b = 0.1 * jax.random.normal(keys[3], (32,))
  return x, r, s, b


def _calls(impl, **kw):
  """Every op with a backend as a function of arrays, with ``impl`` (and its config)."""
  return {
      "layer_norm": lambda x, r, s, b: jaxnorm.layer_norm(x, s, b, impl=impl, **kw),
      "rms_norm": lambda x, r, s, b: jaxnorm.rms_norm(x, s, impl=impl, **kw),
      "add_layer_norm": lambda x, r, s, b: jaxnorm.add_layer_norm(x, r, s, b, impl=impl, **kw),
      "add_rms_norm": lambda x, r, s, b: jaxnorm.add_rms_norm(x, r, s, impl=impl, **kw),
      "gated_rms_norm": lambda x, r, s, b: jaxnorm.gated_rms_norm(x, r, s, group_size=8,
                                                                 impl=impl, **kw),
  }


def _close(got, want):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                               rtol=2e-5, atol=2e-5)


def test_registered_through_one_call_with_its_own_config():
  assert table.BACKENDS["oracle64"] is oracle.ORACLE and "oracle64" in table.IMPLS
  assert oracle.ORACLE.config_class is oracle.OracleConfig
  # auto=True: in "auto"'s order before XLA, its platform in the per-platform choice.
  assert table.PREFERENCE == ("triton", "tpu", "oracle64", "xla")
  assert dict(table.PLATFORM_BACKENDS) == {"cuda": "triton", "rocm": "triton", "cpu": "oracle64"}
  x, _, s, _ = _inputs()
  with pytest.raises(TypeError, match=r"^backend_config= is a OracleConfig, which does not "
                     r"configure the 'triton' backend"):
    jaxnorm.rms_norm(x, s, impl="pallas", backend_config=CFG)
  with pytest.raises(TypeError, match=r"^backend_config= is a PallasConfig, which does not "
                     r"configure the 'oracle64' backend"):
    jaxnorm.rms_norm(x, s, impl="oracle64", backend_config=jaxnorm.PallasConfig())
  # pallas= is the alias of backend_config= for the Triton backend's config only.
  with pytest.raises(TypeError, match=r"^pallas must be a jaxnorm.PallasConfig or None, got "
                                      r"OracleConfig"):
    jaxnorm.rms_norm(x, s, impl="oracle64", pallas=CFG)
  with pytest.raises(ValueError, match=r"backend_config= and its alias pallas= were both given"):
    jaxnorm.rms_norm(x, s, impl="oracle64", backend_config=CFG, pallas=jaxnorm.PallasConfig())
  with pytest.raises(ValueError, match=r"impl='oracle64' cannot run this call: the oracle"):
    jaxnorm.rms_norm(x, s, impl="oracle64", mask=jnp.ones(x.shape, bool))
  # The default refusal reads its table: an op it has no entries for is refused by name.
  no_entries = jaxnorm.OPS["rms_norm"].decl.__class__(**{
      **vars(jaxnorm.OPS["rms_norm"].decl), "name": "not_in_its_table"})
  assert oracle.ORACLE.refusal((6, 32), jnp.float32, None, None, no_entries) == (
      "the oracle64 backend does not implement not_in_its_table")


# "auto" with one config per backend: the oracle's and the Triton backend's (unused here).
IMPLS = {"oracle64": dict(backend_config=CFG),
         "auto": dict(backend_config=(jaxnorm.PallasConfig(), CFG))}


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("name", list(_calls("xla")))
def test_every_op_and_role_matches_xla(name, impl):
  """Value (forward_only), gradient (forward + backward; the add + norm roles for the fused
  ops), JVP (forward) and a jitted gradient on the oracle backend equal the XLA backend's,
  named and through "auto" (this CPU host's platform is the oracle's)."""
  f, ref = _calls(impl, **IMPLS[impl])[name], _calls("xla")[name]
  args = _inputs()

  def loss(fn):
    return lambda *a: jnp.sum(jnp.sin(jax.tree.leaves(fn(*a))[0]))

  oracle.CALLS.clear()
  _close(f(*args), ref(*args))
  _close(jax.grad(loss(f), argnums=(0, 1, 2, 3))(*args),
         jax.grad(loss(ref), argnums=(0, 1, 2, 3))(*args))
  _close(jax.jit(jax.grad(loss(f), argnums=(0, 2)))(*args),
         jax.grad(loss(ref), argnums=(0, 2))(*args))
  _close(jax.jvp(f, args, args), jax.jvp(ref, args, args))
  op = name.removeprefix("add_")
  assert oracle.CALLS == {(op, "forward"), (op, "backward")}  # it ran, not XLA


def test_every_entry_of_its_table_ran():
  """After the op tests, every (op, role) the oracle's callbacks implement has run (the add +
  norm roles run its plain roles, recorded under the op)."""
  ran = set()
  for name in _calls("xla"):
    test_every_op_and_role_matches_xla(name, "auto")
    ran |= oracle.CALLS
  assert ran == {(op, role) for op in ("layer_norm", "rms_norm", "gated_rms_norm")
                 for role in ("forward", "backward")}
  assert oracle.ENTRIES == set(oracle.ORACLE.table)  # every entry of its table was dispatched to
  assert {op for op, _ in oracle.ORACLE.table} == {"layer_norm", "rms_norm", "gated_rms_norm"}
  assert len(oracle.ORACLE.table) == 2 * 6 + 3


def _lowered(f, *args):
  """``(cuda, cpu)``: the program lowered for each platform alone (a host callback lowers for
  one platform at a time)."""
  return tuple(jax.jit(lambda *a: f(*a)).trace(*args).lower(lowering_platforms=(p,)).as_text()
               for p in ("cuda", "cpu"))


TRITON_CALL = "__gpu$xla.gpu.triton"
CALLBACK = "callback"  # the oracle's host callback in the lowered program


def test_auto_decides_per_platform(monkeypatch):
  """Three kernel backends in "auto" (Triton for cuda/rocm, the TPU backend held back by its
  switch, the oracle for cpu): each platform's branch is its backend's, and a backend that
  refuses the call, or that this JAX lacks, drops only its own platforms."""
  x, _, s, _ = _inputs()

  def grad(dtype=jnp.float32, **kw):
    return jax.grad(lambda x, s: jnp.sum(jaxnorm.rms_norm(x.astype(dtype), s, **kw)
                                         .astype(jnp.float32) ** 2), argnums=(0, 1))

  cuda, cpu = _lowered(grad(), x, s)
  assert cuda.count(TRITON_CALL) >= 2 and CALLBACK not in cuda
  assert CALLBACK in cpu and TRITON_CALL not in cpu
  # The Triton kernels refuse float64; the oracle takes it: cpu keeps its backend.
  with jax.enable_x64(True):
    cuda, cpu = _lowered(grad(jnp.float64), x, s)
  assert TRITON_CALL not in cuda and CALLBACK in cpu
  # Both refuse a mask: XLA everywhere.
  cuda, cpu = _lowered(grad(mask=x > 0), x, s)
  assert TRITON_CALL not in cuda and CALLBACK not in cpu
  # A JAX without Pallas's Triton module (blocked, the probe asked): the oracle keeps cpu.
  from jaxnorm.backends.triton import compat
  monkeypatch.setitem(sys.modules, "jax.experimental.pallas.triton", None)
  monkeypatch.setattr(table, "_WARNED", set())
  compat.missing.cache_clear()
  try:
    with pytest.warns(RuntimeWarning, match=r"impl='auto' runs XLA where it would run the "
                                            r"'triton' backend"):
      cuda, cpu = _lowered(grad(), x, s)
  finally:
    monkeypatch.undo()
    compat.missing.cache_clear()
  assert TRITON_CALL not in cuda and CALLBACK in cpu
