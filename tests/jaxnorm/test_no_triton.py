"""After Triton (issue 51): on a JAX whose Pallas has no Triton backend (the module really
blocked: ``None`` in ``sys.modules``, Python's marker for a module ``import`` refuses, for
Pallas's Triton module or for Pallas itself; the probe of :mod:`jaxnorm.backends.triton.compat`
runs as it is), ``impl="auto"`` runs XLA and warns once, and ``impl="triton"``/``"pallas"`` raise
a ``ValueError`` naming the JAX version and the alternatives.
"""

import importlib
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm.backends import table
from jaxnorm.backends.triton import compat

KERNELS = "jaxnorm_kernels"  # the kernel-call primitive's name in a jaxpr


@pytest.fixture(params=["jax.experimental.pallas.triton", "jax.experimental.pallas"])
def no_triton(monkeypatch, request):
  """This process's JAX as one without ``jax.experimental.pallas.triton``: the module (or
  Pallas) blocked in ``sys.modules``, the probe itself asked."""
  monkeypatch.setitem(sys.modules, request.param, None)
  monkeypatch.setattr(table, "_WARNED", set())
  compat.missing.cache_clear()
  compat._api.cache_clear()
  yield
  monkeypatch.undo()
  compat.missing.cache_clear()
  compat._api.cache_clear()
  assert compat.missing() is None or not _importable()


def _importable() -> bool:
  try:
    importlib.import_module("jax.experimental.pallas.triton")
    return True
  except ImportError:
    return False


def _inputs():
  x = jax.random.normal(jax.random.key(0), (4, 16), jnp.float32)
  return x, jnp.linspace(0.5, 1.5, 16), jnp.linspace(-1.0, 1.0, 16)


def test_the_probe_agrees_with_an_import():
  """The probe (no import) says the module is there exactly when importing it works."""
  assert (compat.missing() is None) == _importable()


def test_auto_runs_xla_and_warns_once(no_triton, gpu_host):
  x, scale, bias = _inputs()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
      y = jaxnorm.layer_norm(x, scale, bias)
      g = jax.grad(lambda x: jnp.sum(jaxnorm.rms_norm(x, scale) ** 2))(x)
    text = str(jax.make_jaxpr(lambda x: jaxnorm.layer_norm(x, scale, bias))(x))
  ours = [w for w in caught if "impl='auto' runs XLA" in str(w.message)]
  assert len(ours) == 1, [str(w.message) for w in caught]
  assert issubclass(ours[0].category, RuntimeWarning)
  assert jax.__version__ in str(ours[0].message)
  assert KERNELS not in text
  np.testing.assert_array_equal(y, jaxnorm.layer_norm(x, scale, bias, impl="xla"))
  g_xla = jax.grad(lambda x: jnp.sum(jaxnorm.rms_norm(x, scale, impl="xla") ** 2))(x)
  np.testing.assert_array_equal(g, g_xla)
  assert not jaxnorm.pallas_compiles_on("gpu")


def test_auto_gated_runs_xla(no_triton):
  x, scale, _ = _inputs()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    text = str(jax.make_jaxpr(lambda x: jaxnorm.gated_rms_norm(x, x, scale))(x))
  assert KERNELS not in text


@pytest.mark.parametrize("impl", ["triton", "pallas"])
def test_naming_the_kernels_is_refused(no_triton, impl):
  x, scale, bias = _inputs()
  cfg = jaxnorm.PallasConfig(interpret=True)
  for call in (lambda: jaxnorm.layer_norm(x, scale, bias, impl=impl, pallas=cfg),
               lambda: jaxnorm.add_rms_norm(x, x, scale, impl=impl, pallas=cfg),
               lambda: jaxnorm.gated_rms_norm(x, x, scale, impl=impl, pallas=cfg)):
    with pytest.raises(ValueError, match=rf"impl='{impl}'") as err:
      call()
    message = str(err.value)
    assert f"jax {jax.__version__}" in message
    assert "no Triton backend" in message and "impl='xla' or 'auto'" in message


def test_a_kernel_traced_anyway_says_why(no_triton):
  """Past the choice of backend (the kernels' own test API), the fence raises, naming the JAX."""
  with pytest.raises(RuntimeError, match=rf"jax {jax.__version__}'s Pallas has no Triton"):
    compat.compiler_params(num_warps=4, num_stages=1)
