"""The table of jaxnorm's ops: one entry per op, read by the models, the docs and the tests.

An op is declared where its family lives (the norms in :mod:`jaxnorm._norm_ops`,
the pointwise ops in :mod:`jaxnorm._pointwise`); this table names it once, with its public
function, its autodiff oracle in :mod:`jaxnorm.reference`, the names of its parameters after
``x`` and its layer classes in :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen`. A new op adds its
own modules and one entry here (``docs/ops.md`` lists what else it touches).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Callable

from jaxnorm import reference
from jaxnorm._layer_norm import layer_norm
from jaxnorm._pointwise_ops import derf, dyt
from jaxnorm._rms_norm import rms_norm

__all__ = ["OPS", "NORM_FAMILY", "POINTWISE_FAMILY", "Op"]

NORM_FAMILY = "norm"  # statistics over the normalized axes (LayerNorm, RMSNorm)
POINTWISE_FAMILY = "pointwise"  # one element at a time (DyT, Derf)


@dataclasses.dataclass(frozen=True)
class Op:
  """One op of the table.

  Attributes:
    name: the op's name (``jaxnorm.<name>``, ``TransformerConfig(norm_type=<name>)``).
    family: :data:`NORM_FAMILY` or :data:`POINTWISE_FAMILY`.
    fn: the public op.
    reference: its autodiff oracle, called with the same arguments.
    params: the names of its array parameters after ``x``, in call order (all positional).
    layer: the class name of its layer in :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen`.
  """

  name: str
  family: str
  fn: Callable
  reference: Callable
  params: tuple[str, ...]
  layer: str


OPS = types.MappingProxyType({
    "layer_norm": Op("layer_norm", NORM_FAMILY, layer_norm, reference.layer_norm,
                     ("scale", "bias"), "LayerNorm"),
    "rms_norm": Op("rms_norm", NORM_FAMILY, rms_norm, reference.rms_norm, ("scale",), "RMSNorm"),
    "dyt": Op("dyt", POINTWISE_FAMILY, dyt, reference.dyt, ("alpha", "scale", "bias"), "DyT"),
    "derf": Op("derf", POINTWISE_FAMILY, derf, reference.derf,
               ("alpha", "shift", "scale", "bias"), "Derf"),
})
