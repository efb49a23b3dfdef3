r"""Internal API: the norm family's ops, each declared once: :data:`LAYER_NORM`, :data:`RMS_NORM`.

An op of the family normalizes the trailing axis of ``x: (..., d)`` by per-row statistics,
``y = gamma * x_hat + beta`` with ``x_hat = x_c * r``. A :class:`NormOp` says what differs
between its members; everything else (the forward, the derived backward and tangent, the
Jacobian, batching, sharding, the kernels' launch) is written once for the family and reads
the declaration from the call's :class:`~jaxnorm._norm_config.NormConfig` (``cfg.op``):

* ``mean_path``: whether the op centres the row, :math:`x_c = x - \mu` (LayerNorm) or
  :math:`x_c = x` (RMSNorm); it decides :meth:`NormOp.centered` and the mean-path term of the
  backward, the tangent and the Jacobian (the variance-path factor :math:`c` is the family's,
  :func:`jaxnorm._xla_rows.variance_path_factor`);
* ``residuals``: the per-row statistics reverse mode keeps (the kernels return exactly these);
* ``params``: the array parameters after ``x``; ``options``: the op's own switches
  (:class:`Option`, e.g. LayerNorm's ``use_fast_variance``).

How a backend computes an op is the backend's, not the declaration's: each backend's package is
the one home of its arithmetic for each op (the XLA statistics, LayerNorm's from shifted data and
RMSNorm's mean square, are :mod:`jaxnorm.backends.xla.statistics`'s; ``docs/ops.md`` says why).

The math, derivations and numerics are in ``docs/derivations.md``. A new op of the family is one
more declaration here, its statistics in each backend's package, named by its entry of
:data:`jaxnorm.OPS` (``docs/ops.md``); the family's table, :data:`jaxnorm.ops.table.NORM_OPS`,
is derived from ``OPS``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["LAYER_NORM", "MEMORY_EFFICIENT", "RMS_NORM", "NormOp", "Option"]


@dataclasses.dataclass(frozen=True)
class Option:
  """A switch of one op beyond the family's arguments (a Python bool, checked once).

  Attributes:
    name: the keyword of the public op and the layer (e.g. ``use_fast_variance``).
    default: its value when not given.
  """

  name: str
  default: Any = False


@dataclasses.dataclass(frozen=True, repr=False)
class NormOp:
  """The declaration of one op of the norm family (hashable: part of the static config).

  Attributes:
    name: the op's name (``jaxnorm.<name>``, ``OPS[name]``).
    mean_path: whether the row is centred (:meth:`centered`) and the derivatives carry the
      mean-path term.
    residuals: the names of the statistics reverse mode keeps, in ``(shift, delta, rstd)``
      order (the kernels return these, in this order).
    params: the array parameters after ``x``, in call order.
    options: the op's own options (:class:`Option`).
  """

  name: str
  mean_path: bool
  residuals: tuple[str, ...]
  params: tuple[str, ...]
  options: tuple[Option, ...] = ()

  def __repr__(self):
    return f"NormOp({self.name!r})"

  def centered(self, xf, shift, delta):
    """``x_c``: ``(x - shift) - delta`` (exact where ``x`` is near the pivot; ``delta`` None:
    ``x - shift``), or ``x`` itself without a mean path; ``xf`` in the compute dtype."""
    if not self.mean_path:
      return xf
    return xf - shift if delta is None else (xf - shift) - delta


# Reverse mode keeps the output y and rstd instead of x, and recovers x_hat = (y - beta) / gamma
# in the backward (docs/derivations.md, "memory_efficient=True").
MEMORY_EFFICIENT = Option("memory_efficient", False)

LAYER_NORM = NormOp("layer_norm", mean_path=True,
                    residuals=("shift", "delta", "rstd"), params=("scale", "bias"),
                    options=(Option("use_fast_variance", False), MEMORY_EFFICIENT))
"""LayerNorm's declaration: centred, statistics from shifted data; Flax's fast variance and
the memory-saving backward as options."""

RMS_NORM = NormOp("rms_norm", mean_path=False, residuals=("rstd",),
                  params=("scale",), options=(MEMORY_EFFICIENT,))
"""RMSNorm's declaration: not centred, the root mean square its only statistic; the
memory-saving backward as an option."""
