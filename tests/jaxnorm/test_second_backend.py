"""A second backend registered from outside the library (issue 51, goal 4): the float64-oracle
callback backend of ``tests/_oracle_backend.py``, with its own config class, reached by
``impl="oracle64"`` through the one dispatch, for every op that has a backend and every role of
its table."""

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
  assert "oracle64" not in table.PREFERENCE  # "auto" keeps the library's order
  x, _, s, _ = _inputs()
  with pytest.raises(TypeError, match=r"^backend_config= is a OracleConfig, which does not "
                     r"configure the 'triton' backend"):
    jaxnorm.rms_norm(x, s, impl="pallas", backend_config=CFG)
  with pytest.raises(TypeError, match=r"^backend_config= is a PallasConfig, which does not "
                     r"configure the 'oracle64' backend"):
    jaxnorm.rms_norm(x, s, impl="oracle64", backend_config=jaxnorm.PallasConfig())
  # pallas= is the documented alias of backend_config=: the same check, named as it was given.
  with pytest.raises(TypeError, match=r"^pallas= is a OracleConfig, which does not configure"):
    jaxnorm.rms_norm(x, s, impl="pallas", pallas=CFG)
  np.testing.assert_array_equal(jaxnorm.rms_norm(x, s, impl="oracle64", pallas=CFG),
                                jaxnorm.rms_norm(x, s, impl="oracle64", backend_config=CFG))
  with pytest.raises(ValueError, match=r"backend_config= and its alias pallas= were both given"):
    jaxnorm.rms_norm(x, s, impl="oracle64", backend_config=CFG, pallas=CFG)
  with pytest.raises(ValueError, match=r"impl='oracle64' cannot run this call: the oracle"):
    jaxnorm.rms_norm(x, s, impl="oracle64", mask=jnp.ones(x.shape, bool))


@pytest.mark.parametrize("name", list(_calls("xla")))
def test_every_op_and_role_matches_xla(name):
  """Value (forward_only), gradient (forward + backward; the add + norm roles for the fused
  ops), JVP (forward) and a jitted gradient on the oracle backend equal the XLA backend's."""
  f, ref = _calls("oracle64", backend_config=CFG)[name], _calls("xla")[name]
  args = _inputs()

  def loss(fn):
    return lambda *a: jnp.sum(jnp.sin(jax.tree.leaves(fn(*a))[0]))

  _close(f(*args), ref(*args))
  _close(jax.grad(loss(f), argnums=(0, 1, 2, 3))(*args),
         jax.grad(loss(ref), argnums=(0, 1, 2, 3))(*args))
  _close(jax.jit(jax.grad(loss(f), argnums=(0, 2)))(*args),
         jax.grad(loss(ref), argnums=(0, 2))(*args))
  _close(jax.jvp(f, args, args), jax.jvp(ref, args, args))


def test_every_entry_of_its_table_ran():
  """After the op tests, every (op, role) the oracle's callbacks implement has run (the add +
  norm roles run its plain roles, recorded under the op)."""
  for name in _calls("xla"):
    test_every_op_and_role_matches_xla(name)
  ran = {(op, role) for op, role in oracle.CALLS}
  assert ran == {(op, role) for op in ("layer_norm", "rms_norm", "gated_rms_norm")
                 for role in ("forward", "backward")}
  assert oracle.ENTRIES == set(oracle.ORACLE.table)  # every entry of its table was dispatched to
  assert {op for op, _ in oracle.ORACLE.table} == {"layer_norm", "rms_norm", "gated_rms_norm"}
  assert len(oracle.ORACLE.table) == 2 * 6 + 3
