"""The Pallas TPU (Mosaic) backend of the norm family: every piece of its Pallas code lives here.

In the library's table and :data:`jaxnorm.backends.table.PREFERENCE` (issue 66, goal 3): a call
reaches it with ``impl="tpu"`` and a :class:`~jaxnorm.backends.tpu.config.TpuConfig` as
``backend_config=``; ``impl="auto"`` gives it the ``tpu`` platform only once
:data:`AUTO_ON_TPU` is on::

    from jaxnorm.backends.tpu import TpuConfig
    y = jaxnorm.rms_norm(x, scale, impl="tpu", backend_config=TpuConfig(interpret=True))

Importing this package, :mod:`~jaxnorm.backends.tpu.config`, :mod:`~jaxnorm.backends.tpu.compat`,
:mod:`~jaxnorm.backends.tpu.tpu_call` or :mod:`~jaxnorm.backends.tpu.backend` does not import
``jax.experimental.pallas``; the kernel module (:mod:`~jaxnorm.backends.tpu.kernels`) is imported
where a kernel is traced. What was checked (TPU interpret mode on a CPU, the Mosaic lowering of
``jax.export(platforms=["tpu"])``) and what was not (Mosaic's compiler on a TPU, speed):
``docs/tpu.md``.

Modules:
  config: :class:`TpuConfig`, the row-block rule, the widths and dtypes the kernels take.
  compat: whether this JAX has Pallas TPU, and the Pallas names the kernels use (one fence).
  kernels: the forward and backward kernels, plain and residual add + norm.
  tpu_call: the primitive the kernels run behind (differentiable again, lowered per platform).
  backend: :class:`TpuBackend` and :data:`TPU`, the backend with its table.
"""

from jaxnorm.backends.tpu.backend import AUTO_ON_TPU, TPU, TpuBackend
from jaxnorm.backends.tpu.config import TpuConfig

__all__ = ["AUTO_ON_TPU", "TPU", "TpuBackend", "TpuConfig"]
