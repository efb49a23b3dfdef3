"""``import jaxnorm`` and the XLA path leave ``jax.experimental.pallas`` unimported (issue 33),
with both kernel backends in the table (issue 66): only a kernel launch or lowering imports it
(:func:`jaxnorm.backends.triton.backend.kernels`, :func:`jaxnorm.backends.tpu.backend.kernels`),
and only through each kernel backend's own fence (:mod:`jaxnorm.backends.triton.compat`,
:mod:`jaxnorm.backends.tpu.compat`)."""

import subprocess
import sys

PROGRAM = """
import sys
import jax, jax.numpy as jnp
import jaxnorm
x = jnp.ones((4, 8))
jax.grad(lambda x: jnp.sum(jaxnorm.layer_norm(x, jnp.ones(8), jnp.zeros(8)) ** 2))(x)
jax.grad(lambda x: jnp.sum(jaxnorm.add_rms_norm(x, x, jnp.ones(8))[0] ** 2))(x)
jax.jvp(lambda x: jaxnorm.rms_norm(x), (x,), (x,))
jax.grad(lambda x: jnp.sum(jaxnorm.dyt(x, jnp.array(0.5))))(x)
assert "jax.experimental.pallas" not in sys.modules, sorted(m for m in sys.modules if "pallas" in m)
cfg = jaxnorm.PallasConfig(interpret=True)
jaxnorm.rms_norm(x, impl="pallas", pallas=cfg).block_until_ready()
assert "jax.experimental.pallas" in sys.modules
"""


def test_pallas_is_imported_only_by_a_kernel_call():
  out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]


def test_pallas_api_is_imported_in_one_module():
  """Pallas is fenced like JAX internals: only each kernel backend's ``compat.py`` imports it."""
  import pathlib
  import re

  import jaxnorm

  package = pathlib.Path(jaxnorm.__file__).parent
  pallas_import = re.compile(r"^\s*(from\s+jax\.experimental\.pallas\b|"
                             r"from\s+jax\.experimental\s+import\s+.*\bpallas\b|"
                             r"import\s+jax\.experimental\.pallas)", re.M)
  fences = {pathlib.Path("backends/triton/compat.py"), pathlib.Path("backends/tpu/compat.py")}
  offenders = [str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.relative_to(package) not in fences and pallas_import.search(p.read_text())]
  assert offenders == []
  assert all(pallas_import.search((package / f).read_text()) for f in fences)
