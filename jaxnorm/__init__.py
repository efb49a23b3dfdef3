"""jaxnorm: LayerNorm, RMSNorm, DyT and Derf with hand-derived derivative rules for JAX and Flax.

Functional ops live here (:data:`OPS` is their table), the fused residual add + norm ops among
them (``import jaxnorm`` needs only JAX); the Flax modules are in :mod:`jaxnorm.nnx` and
:mod:`jaxnorm.linen`, the autodiff oracle in :mod:`jaxnorm.reference`. :class:`PallasConfig`
says how ``impl="pallas"`` runs the kernels (interpret mode, a :class:`BlockConfig`),
:func:`default_block_config` gives the heuristic's blocks for a shape, and
:func:`pallas_compiles_on` whether a backend compiles them.

The ops' public functions (``jaxnorm.<op>``, the residual add + norm ops and the Jacobians) are
exported from :data:`OPS` (:func:`jaxnorm.ops.table.exports`): ``__all__`` lists the library's,
and an op added with :func:`jaxnorm.ops.table.register` is an attribute too.
"""

import typing as _typing

from jaxnorm import reference as reference
from jaxnorm.ops import table as _table
from jaxnorm.ops.table import OPS as OPS
from jaxnorm.backends.triton.config import BlockConfig as BlockConfig
from jaxnorm.backends.triton.config import PallasConfig as PallasConfig
from jaxnorm.backends.triton.config import default_block_config as default_block_config
from jaxnorm.backends.triton.config import pallas_compiles_on as pallas_compiles_on
from jaxnorm._remat import INPUT_RESIDUAL as INPUT_RESIDUAL
from jaxnorm._remat import OUTPUT_RESIDUAL as OUTPUT_RESIDUAL
from jaxnorm._remat import STATS_RESIDUAL as STATS_RESIDUAL
from jaxnorm._casting import CASTINGS as CASTINGS

if _typing.TYPE_CHECKING:  # what static analysis sees of the exports below (not needed to run)
  from jaxnorm.ops.norm.add_norm import add_layer_norm as add_layer_norm
  from jaxnorm.ops.norm.add_norm import add_rms_norm as add_rms_norm
  from jaxnorm.ops.norm.jacobian import layer_norm_jacobian as layer_norm_jacobian
  from jaxnorm.ops.norm.jacobian import rms_norm_jacobian as rms_norm_jacobian
  from jaxnorm.ops.norm.layer_norm import layer_norm as layer_norm
  from jaxnorm.ops.norm.rms_norm import rms_norm as rms_norm
  from jaxnorm.ops.gated.rules import gated_rms_norm as gated_rms_norm
  from jaxnorm.ops.pointwise.derf import derf as derf
  from jaxnorm.ops.pointwise.derf import derf_jacobian as derf_jacobian
  from jaxnorm.ops.pointwise.dyt import dyt as dyt
  from jaxnorm.ops.pointwise.dyt import dyt_jacobian as dyt_jacobian

# Every op's public functions, by name, from the table.
globals().update(_table.exports())

__version__ = "0.1.0"

__all__ = sorted([
    "BlockConfig",
    "PallasConfig",
    "CASTINGS",
    "OPS",
    "INPUT_RESIDUAL",
    "OUTPUT_RESIDUAL",
    "STATS_RESIDUAL",
    "default_block_config",
    "pallas_compiles_on",
    "reference",
    *_table.exports(),
])


def __getattr__(name: str):
  """The public function of an op added to :data:`OPS` after import (``register``)."""
  found = _table.exports().get(name)
  if found is None:
    raise AttributeError(f"module 'jaxnorm' has no attribute {name!r}")
  return found


def __dir__():
  return sorted(set(globals()) | set(_table.exports()))
