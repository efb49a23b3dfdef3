"""``import jaxnorm`` and the XLA path leave ``jax.experimental.pallas`` unimported (issue 33):
only a kernel launch or lowering imports it (:func:`jaxnorm._pallas.backend.kernels`)."""

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
