"""The table of jaxnorm's ops, :data:`OPS`: the one list of op names, every other table its view.

An op is declared where its family lives (the norms in :mod:`jaxnorm._norm_ops`, each pointwise op
in its own module of :mod:`jaxnorm.ops.pointwise`, gated RMSNorm in :mod:`jaxnorm._gated_op`);
this table names it once, with its declaration, its public function (and its residual add + norm
function and its Jacobian, if it has them), its autodiff oracle, its inputs, the names of its
parameters, its layer class in :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen` and, for a layer the
library builds from the entry, that layer's docstrings. Every other list of ops is read from it
when it is needed: the public names of :mod:`jaxnorm` (:func:`exports`), the pointwise layers of
:mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen` (built from their entries), the model's norm types
(:func:`layer_replacements`) and the benchmarks' ops (:func:`names`). A dispatch on an op's name
is :func:`lookup`, which raises a ``ValueError`` naming the argument on an unknown name.

A new pointwise op is one module of its own and one entry here (``docs/adding-an-op.md``); an op
defined outside the library (a test's, a user's) is added with :func:`register` and removed with
:func:`unregister`, and is then reached by every reader of the table as the library's own are.
"""

from __future__ import annotations

import dataclasses
import keyword
import types
from typing import Any, Callable

from jaxnorm import _validation as v
from jaxnorm import reference
from jaxnorm.ops.norm.add_norm import add_layer_norm, add_rms_norm
from jaxnorm.ops.gated.rules import GATED_RMS_NORM, gated_rms_norm
from jaxnorm.ops.norm.jacobian import layer_norm_jacobian, rms_norm_jacobian
from jaxnorm.ops.norm.layer_norm import layer_norm
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm.ops.pointwise import derf, dyt
from jaxnorm.ops.norm.rms_norm import rms_norm

__all__ = ["FAMILIES", "GATED_FAMILY", "NORM_FAMILY", "NORM_OPS", "OPS", "POINTWISE_FAMILY", "Op",
           "exports", "layer_replacements", "lookup", "names", "register", "unregister"]

NORM_FAMILY = "norm"  # statistics over the normalized axes (LayerNorm, RMSNorm)
POINTWISE_FAMILY = "pointwise"  # one element at a time (DyT, Derf)
GATED_FAMILY = "gated"  # a norm of x gated by a second input z (gated RMSNorm)
FAMILIES = (NORM_FAMILY, POINTWISE_FAMILY, GATED_FAMILY)


@dataclasses.dataclass(frozen=True)
class Op:
  """One op of the table.

  Attributes:
    name: the op's name (``jaxnorm.<name>``, ``TransformerConfig(norm_type=<name>)``).
    family: :data:`NORM_FAMILY`, :data:`POINTWISE_FAMILY` or :data:`GATED_FAMILY`.
    decl: its declaration (a :class:`~jaxnorm._norm_ops.NormOp`, a
      :class:`~jaxnorm.ops.pointwise.rules.Squash` or a :class:`~jaxnorm._gated_op.GatedOp`),
      whose ``name`` is :attr:`name`; its ``options`` (where it declares them) are the op's own
      keywords, which the layers take and pass on (``jaxnorm.flax.common``).
    fn: the public op.
    reference: its autodiff oracle, called with the same arguments.
    params: the names of its array parameters after its inputs, in call order (positional).
    layer: the class name of its layer in :mod:`jaxnorm.nnx` and :mod:`jaxnorm.linen`.
    add_fn: the public residual add + norm op, ``(y, h) = add_fn(x, residual, *params)``, or
      None where the op has none.
    inputs: its row-shaped array inputs, first in the call (``("x",)``; gated RMSNorm's
      ``("x", "z")``): an op with the one input ``x`` can stand where a norm layer stands.
    jacobian: the public function of its explicit Jacobian (``jaxnorm.<its __name__>``), or
      None.
    layer_docs: ``(NNX docstring, Linen docstring)`` of the layers the library builds from this
      entry (the pointwise family's); empty strings give a docstring naming :attr:`fn`.
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
  jacobian: Callable | None = None
  layer_docs: tuple[str, str] = ("", "")


_TABLE = {
    "layer_norm": Op("layer_norm", NORM_FAMILY, LAYER_NORM, layer_norm, reference.layer_norm,
                     ("scale", "bias"), "LayerNorm", add_layer_norm, jacobian=layer_norm_jacobian),
    "rms_norm": Op("rms_norm", NORM_FAMILY, RMS_NORM, rms_norm, reference.rms_norm, ("scale",),
                   "RMSNorm", add_rms_norm, jacobian=rms_norm_jacobian),
    "dyt": Op("dyt", POINTWISE_FAMILY, dyt.DYT, dyt.dyt, reference.dyt, ("alpha", "scale", "bias"),
              "DyT", jacobian=dyt.dyt_jacobian, layer_docs=dyt.LAYER_DOCS),
    "derf": Op("derf", POINTWISE_FAMILY, derf.DERF, derf.derf, reference.derf,
               ("alpha", "shift", "scale", "bias"), "Derf", jacobian=derf.derf_jacobian,
               layer_docs=derf.LAYER_DOCS),
    "gated_rms_norm": Op("gated_rms_norm", GATED_FAMILY, GATED_RMS_NORM, gated_rms_norm,
                         reference.gated_rms_norm, ("scale",), "GatedRMSNorm",
                         inputs=("x", "z")),
}
OPS = types.MappingProxyType(_TABLE)
"""Every op by name, in the library's order; ops added by :func:`register` come after."""
_BUILT_IN = frozenset(_TABLE)


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
"""The norm family's declarations (:class:`~jaxnorm._norm_ops.NormOp`) by name, from :data:`OPS`
(the library's; not updated by :func:`register`, which takes no norm-family op)."""


def exports(ops=None) -> dict[str, Callable]:
  """The public functions of ``ops`` (default: every op of :data:`OPS`) by their public name:
  each op's ``fn`` under its name, its ``add_fn`` and ``jacobian`` under their ``__name__``
  (``jaxnorm.add_layer_norm``, ``jaxnorm.dyt_jacobian``)."""
  out = {}
  for op in (OPS.values() if ops is None else ops):
    out[op.name] = op.fn
    for extra in (op.add_fn, op.jacobian):
      if extra is not None:
        out[extra.__name__] = extra
  return out


def _check_new(op: Any) -> None:
  """Raises unless ``op`` can join the table: an :class:`Op` of the pointwise family, its name a
  new identifier equal to its declaration's, its layer's class name and public names unused."""
  if not isinstance(op, Op):
    raise TypeError(f"op must be a jaxnorm.ops.table.Op, got {type(op).__name__} {op!r}.")
  if not (isinstance(op.name, str) and op.name.isidentifier() and not keyword.iskeyword(op.name)):
    raise ValueError(f"op.name must be a Python identifier (it becomes jaxnorm.<name>), got "
                     f"{op.name!r}.")
  if op.name in OPS:
    raise ValueError(f"op.name {op.name!r} is already an op of jaxnorm.OPS; unregister it first.")
  if getattr(op.decl, "name", None) != op.name:
    raise ValueError(f"op.decl.name must be op.name {op.name!r}, got "
                     f"{getattr(op.decl, 'name', None)!r}.")
  if op.family != POINTWISE_FAMILY or op.inputs != ("x",):
    raise ValueError(f"register takes ops of the {POINTWISE_FAMILY!r} family with the one input "
                     f"x (the family whose layers are built from the entry), got family="
                     f"{op.family!r}, inputs={op.inputs!r}.")
  taken = {o.layer for o in OPS.values()} | set(exports())
  clash = sorted({op.layer, *exports([op])} & taken)
  if clash or not op.layer.isidentifier():
    raise ValueError(f"op.layer {op.layer!r} and the op's public names must be new identifiers; "
                     f"{clash} are taken.")


def register(op: Op) -> Op:
  """Adds ``op`` to :data:`OPS` (after the library's ops) and returns it.

  From then on every reader of the table takes it as one of the library's: ``jaxnorm.<name>``,
  its layers ``jaxnorm.nnx.<layer>`` and ``jaxnorm.linen.<layer>`` (built from the entry on first
  use), the model's ``norm_type`` and ``qk_norm``, the layers' dispatch and the benchmarks.
  ``__all__`` of those modules lists the library's ops only.

  Raises:
    TypeError: ``op`` not an :class:`Op`.
    ValueError: a name that is not an identifier or is already an op's, a declaration of
      another name, an op of another family than the pointwise one or with inputs other than
      ``x``, a layer class name or a public function name already taken.
  """
  _check_new(op)
  _TABLE[op.name] = op
  return op


def unregister(name: str) -> Op:
  """Removes the op ``name`` that :func:`register` added and returns its entry; the library's
  own ops cannot be removed (``ValueError``)."""
  if name in _BUILT_IN:
    raise ValueError(f"name {name!r} is one of the library's ops; only registered ops can be "
                     f"unregistered.")
  if name not in _TABLE:
    raise ValueError(f"name {name!r} is not a registered op; registered: "
                     f"{sorted(set(_TABLE) - _BUILT_IN)}.")
  return _TABLE.pop(name)
