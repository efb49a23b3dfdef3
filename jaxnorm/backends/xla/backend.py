"""Internal API: the ``"xla"`` entry of the backend table, the closed forms in XLA ops.

Runs everywhere and takes every call (masks, ``axis_name``, any dtype, the op's options). Its
table holds the norm family's roles (these methods) for LayerNorm and RMSNorm, and gated
RMSNorm's (:data:`jaxnorm.backends.xla.gated.ROLES`, registered here under the op's name). The
formulas are :mod:`jaxnorm.backends.xla.formulas`'s; the residual add + norm is :class:`Backend`'s
composition (the add, then the plain op at ``h``), which XLA fuses. Its one tuning switch,
:data:`FORWARD_VIEWS`, lives here rather than in the ops' declarations.
"""

from __future__ import annotations

import functools

from jaxnorm.backends.xla import formulas as _xla
from jaxnorm.backends.xla import gated as _gated
from jaxnorm.backends.interface import Backend, add_backward_of
from jaxnorm._gated_op import GATED_RMS_NORM
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM

__all__ = ["FORWARD_VIEWS", "XLA", "XlaBackend"]

# The ops whose undifferentiated forward reads ``x`` through separate views on fewer rows than
# XLA:CPU's YNNPACK takes whole (:func:`jaxnorm.backends.xla.formulas.forward_only`; measured in
# docs/perf-notes.md, issue 23): LayerNorm. RMSNorm keeps Flax's program.
FORWARD_VIEWS = frozenset({LAYER_NORM})


class XlaBackend(Backend):
  """The XLA formulas behind :class:`~jaxnorm.backends.interface.Backend`'s methods."""

  name = "xla"
  platforms = None  # every lowering platform
  config_class = None

  def forward_only(self, cfg, x, scale, bias, mask):
    """``y`` (:func:`jaxnorm.backends.xla.formulas.forward_only`, with views for
    :data:`FORWARD_VIEWS`)."""
    return _xla.forward_only(cfg, x, scale, bias, mask, use_views=cfg.op in FORWARD_VIEWS)

  def forward(self, cfg, x, scale, bias, mask):
    """``(y, stats)`` (:func:`jaxnorm.backends.xla.formulas.forward`)."""
    return _xla.forward(cfg, x, scale, bias, mask)

  def backward(self, cfg, x, scale, mask, stats, dy, dx_dtype=None, c=None):
    """``(dx, dscale, dbias)`` (:func:`jaxnorm.backends.xla.formulas.backward`; ``c``, the
    variance-path factor second order recomputes, as there: this backend's own keyword)."""
    return _xla.backward(cfg, x, scale, mask, stats, dy, dx_dtype=dx_dtype, c=c)

  def add_backward(self, cfg, h, scale, mask, stats, dy, dh, c=None):
    """The composition of :class:`Backend`, with ``c`` passed to :meth:`backward`."""
    return add_backward_of(functools.partial(self.backward, c=c), cfg, h, scale, mask, stats,
                           dy, dh)


XLA = XlaBackend()
for _op in (LAYER_NORM, RMS_NORM):
  XLA.register(_op.name, **XLA.norm_roles())
XLA.register(GATED_RMS_NORM.name, **_gated.ROLES)
