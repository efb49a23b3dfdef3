"""The table of jaxnorm's ops, :data:`OPS`: the one list of op names, every other table its view.

An op is declared where its family lives (the norms in :mod:`jaxnorm._norm_ops`, the pointwise
ops in :mod:`jaxnorm.ops.pointwise.rules`, gated RMSNorm in :mod:`jaxnorm._gated_op`); this
table names it once, with its declaration, its public function (and its residual add + norm
function, if it has one), its autodiff oracle in :mod:`jaxnorm.reference`, its inputs, the names of
its parameters and its layer class in :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen`. Every other list
of ops is derived from it: :data:`NORM_OPS` (the norm family's declarations),
:data:`POINTWISE_OPS`, the layers' kinds, the model's norm types (:func:`layer_replacements`)
and the benchmark's ops (:func:`names`). A dispatch on an op's name is :func:`lookup`, which
raises a ``ValueError`` naming the argument on an unknown name. A new op adds its own modules
and one entry here (``docs/ops.md`` lists what else it touches).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable

from jaxnorm import _validation as v
from jaxnorm import reference
from jaxnorm.ops.norm.add_norm import add_layer_norm, add_rms_norm
from jaxnorm.ops.gated.rules import GATED_RMS_NORM, gated_rms_norm
from jaxnorm.ops.norm.layer_norm import layer_norm
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm.ops.pointwise.rules import DERF, DYT
from jaxnorm.ops.pointwise.api import derf, dyt
from jaxnorm.ops.norm.rms_norm import rms_norm

__all__ = ["GATED_FAMILY", "NORM_FAMILY", "NORM_OPS", "OPS", "POINTWISE_FAMILY", "POINTWISE_OPS",
           "Op", "layer_replacements", "lookup", "names"]

NORM_FAMILY = "norm"  # statistics over the normalized axes (LayerNorm, RMSNorm)
POINTWISE_FAMILY = "pointwise"  # one element at a time (DyT, Derf)
GATED_FAMILY = "gated"  # a norm of x gated by a second input z (gated RMSNorm)


@dataclasses.dataclass(frozen=True)
class Op:
  """One op of the table.

  Attributes:
    name: the op's name (``jaxnorm.<name>``, ``TransformerConfig(norm_type=<name>)``).
    family: :data:`NORM_FAMILY`, :data:`POINTWISE_FAMILY` or :data:`GATED_FAMILY`.
    decl: its declaration in its family's module (a :class:`~jaxnorm._norm_ops.NormOp`, a
      :class:`~jaxnorm.ops.pointwise.rules.Squash` or a :class:`~jaxnorm._gated_op.GatedOp`),
      whose ``name`` is :attr:`name`.
    fn: the public op.
    reference: its autodiff oracle, called with the same arguments.
    params: the names of its array parameters after its inputs, in call order (positional).
    layer: the class name of its layer in :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen`.
    add_fn: the public residual add + norm op, ``(y, h) = add_fn(x, residual, *params)``, or
      None where the op has none.
    inputs: its row-shaped array inputs, first in the call (``("x",)``; gated RMSNorm's
      ``("x", "z")``): an op with the one input ``x`` can stand where a norm layer stands.
  """

  name: str
  family: str
  decl: Any
  fn: Callable
  reference: Callable
  params: tuple[str, ...]
  layer: str
  add_fn: Callable | None = None
  inputs: tuple[str, ...] = ("x",)


OPS = types.MappingProxyType({
    "layer_norm": Op("layer_norm", NORM_FAMILY, LAYER_NORM, layer_norm, reference.layer_norm,
                     ("scale", "bias"), "LayerNorm", add_layer_norm),
    "rms_norm": Op("rms_norm", NORM_FAMILY, RMS_NORM, rms_norm, reference.rms_norm, ("scale",),
                   "RMSNorm", add_rms_norm),
    "dyt": Op("dyt", POINTWISE_FAMILY, DYT, dyt, reference.dyt, ("alpha", "scale", "bias"),
              "DyT"),
    "derf": Op("derf", POINTWISE_FAMILY, DERF, derf, reference.derf,
               ("alpha", "shift", "scale", "bias"), "Derf"),
    "gated_rms_norm": Op("gated_rms_norm", GATED_FAMILY, GATED_RMS_NORM, gated_rms_norm,
                         reference.gated_rms_norm, ("scale",), "GatedRMSNorm",
                         inputs=("x", "z")),
})


def names(family: str | None = None) -> tuple[str, ...]:
  """The names of :data:`OPS` (of one ``family`` if given), in the table's order."""
  return tuple(n for n, op in OPS.items() if family is None or op.family == family)


def layer_replacements() -> tuple[str, ...]:
  """The names of :data:`OPS` that can stand where a norm layer stands: those whose one input
  is ``x`` (a model's ``norm_type`` and ``qk_norm``)."""
  return tuple(n for n, op in OPS.items() if op.inputs == ("x",))


def lookup(name: Any, argument: str, family: str | None = None,
           among: tuple[str, ...] | None = None) -> Op:
  """``OPS[name]``, or a ``ValueError`` naming ``argument``, ``name`` and the valid names.

  Args:
    name: the op's name as the caller received it (any type: a non-string is refused too).
    argument: what the caller calls it (``"norm_type"``, ``"op_name"``, ...), for the message.
    family: if given, only that family's ops are valid.
    among: if given, only these names are valid (e.g. :func:`layer_replacements`).
  """
  valid = names(family) if among is None else tuple(n for n in names(family) if n in among)
  v.check_choice(argument, name, valid)
  return OPS[name]


NORM_OPS = types.MappingProxyType({n: OPS[n].decl for n in names(NORM_FAMILY)})
"""The norm family's declarations (:class:`~jaxnorm._norm_ops.NormOp`) by name, from :data:`OPS`."""

POINTWISE_OPS = types.MappingProxyType({n: OPS[n].decl for n in names(POINTWISE_FAMILY)})
"""The pointwise family's declarations (:class:`~jaxnorm.ops.pointwise.rules.Squash`) by name."""
