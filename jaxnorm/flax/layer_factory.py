"""The layer classes the library builds from entries of :data:`jaxnorm.OPS` (the pointwise ops'),
for one Flax API each: :class:`LayerFactory`.

Private: :mod:`jaxnorm.flax.nnx_pointwise` and :mod:`jaxnorm.flax.linen_pointwise` hold one
factory each, and :mod:`jaxnorm.nnx` / :mod:`jaxnorm.linen` export what it builds.
"""

from __future__ import annotations

import types
from typing import Any

from jaxnorm.ops.table import OPS

__all__ = ["LayerFactory"]


class LayerFactory:
  """Builds the layer class of each op of one family of :data:`jaxnorm.OPS`, once per entry.

  A class is a subclass of ``base`` (the family's layer: its constructor or fields and its call)
  named ``op.layer`` (``__name__`` and ``__qualname__``), with ``__module__`` ``home`` (where it
  is exported, so that pickling finds it), the docstring ``op.layer_docs[doc_index]`` or
  ``default_doc`` formatted with ``layer`` and ``name``, and the class attribute ``_op_name``,
  the op's name, by which ``base`` looks the op up in the table.
  """

  def __init__(self, base: type, home: str, family: str, doc_index: int, default_doc: str):
    self.base, self.home, self.family = base, home, family
    self.doc_index, self.default_doc = doc_index, default_doc
    self._classes: dict[Any, type] = {}

  def layer_class(self, op: Any) -> type:
    """The class of ``op`` (an entry of the factory's family), built on first use."""
    cls = self._classes.get(op)
    if cls is None:
      doc = op.layer_docs[self.doc_index] or self.default_doc.format(layer=op.layer, name=op.name)

      def body(ns):
        ns.update(__doc__=doc, __module__=self.home, __qualname__=op.layer, _op_name=op.name)

      cls = self._classes[op] = types.new_class(op.layer, (self.base,), exec_body=body)
    return cls

  def layers(self) -> dict[str, type]:
    """``{class name: class}`` for every op of the family in :data:`jaxnorm.OPS` now."""
    return {op.layer: self.layer_class(op) for op in OPS.values() if op.family == self.family}

  def module_getattr(self, name: str) -> type:
    """The class named ``name`` of an op of the table (the ``__getattr__`` of ``home``, for ops
    registered after it was imported); ``AttributeError`` naming ``home`` otherwise."""
    found = self.layers().get(name)
    if found is None:
      raise AttributeError(f"module {self.home!r} has no attribute {name!r}")
    return found

  def export(self, namespace: dict, fixed: list[str]):
    """Puts every layer of the family into ``namespace`` (the globals of ``home``) and returns
    ``(__all__, __getattr__, __dir__)`` for it: ``fixed`` (the module's own layers) and the
    family's, sorted; the layer of an op registered after import (:meth:`module_getattr`); and
    the listing with those layers."""
    namespace.update(self.layers())

    def module_getattr(name: str) -> type:
      return self.module_getattr(name)

    def module_dir() -> list[str]:
      return sorted(set(namespace) | set(self.layers()))

    return sorted([*fixed, *self.layers()]), module_getattr, module_dir
