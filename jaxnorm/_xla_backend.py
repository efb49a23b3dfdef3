"""Internal API: the ``"xla"`` entry of the backend table, the closed forms in XLA ops.

Runs everywhere and takes every call (masks, ``axis_name``, any dtype, the op's options). The
formulas are :mod:`jaxnorm._xla`'s; the residual add + norm is :class:`Backend`'s composition
(the add, then the plain op at ``h``), which XLA fuses.
"""

from __future__ import annotations

from jaxnorm import _xla
from jaxnorm._backend_interface import Backend

__all__ = ["XLA", "XlaBackend"]


class XlaBackend(Backend):
  """The XLA formulas behind :class:`~jaxnorm._backend_interface.Backend`'s methods."""

  name = "xla"

  def forward_only(self, cfg, x, scale, bias, mask):
    """``y`` (:func:`jaxnorm._xla.forward_only`)."""
    return _xla.forward_only(cfg, x, scale, bias, mask)

  def forward(self, cfg, x, scale, bias, mask):
    """``(y, stats)`` (:func:`jaxnorm._xla.forward`)."""
    return _xla.forward(cfg, x, scale, bias, mask)

  def backward(self, cfg, x, scale, mask, stats, dy, dx_dtype=None, c=None):
    """``(dx, dscale, dbias)`` (:func:`jaxnorm._xla.backward`; ``c`` as there)."""
    return _xla.backward(cfg, x, scale, mask, stats, dy, dx_dtype=dx_dtype, c=c)


XLA = XlaBackend()
