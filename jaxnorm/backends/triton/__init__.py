"""The Pallas (Triton) backend of the norm family: every piece of Pallas code lives here.

Importing this package, :mod:`~jaxnorm.backends.triton.config`,
:mod:`~jaxnorm.backends.triton.kernel_call` or :mod:`~jaxnorm.backends.triton.backend` does not
import ``jax.experimental.pallas``: ``import jaxnorm`` and every XLA-path call leave it out of
``sys.modules``. The kernel modules, :mod:`~jaxnorm.backends.triton.common` (with the fence around
Pallas API differences), :mod:`~jaxnorm.backends.triton.forward` and
:mod:`~jaxnorm.backends.triton.backward`, are imported where a kernel is traced
(:func:`jaxnorm.backends.triton.backend.kernels`). The checked API of the kernels on their own,
which only the tests use, is ``tests/_kernel_api.py``.

Modules:
  config: :class:`PallasConfig`, :class:`BlockConfig`, the block-size heuristic and whether
    the kernels take a call (public names re-exported by :mod:`jaxnorm`).
  kernel_call: the primitive the kernels run behind (differentiable again, lowered per platform).
  backend: the ``"triton"`` entry (alias ``"pallas"``) of the backend table
    (:mod:`jaxnorm.backends.table`).
  common, forward, backward: the kernels.
  gated, gated_entry: gated RMSNorm's kernels and their entry in the backend.
"""
