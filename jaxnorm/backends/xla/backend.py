"""Internal API: the ``"xla"`` entry of the backend table, the closed forms in XLA ops.

Runs everywhere and takes every call (masks, ``axis_name``, any dtype, the op's options). Its
table maps each of the norm family's roles straight to its arithmetic in this package: the
statistics (:mod:`jaxnorm.backends.xla.statistics`) and the forward, backward and tangent
(:mod:`jaxnorm.backends.xla.formulas`), for every op with statistics there
(:func:`register_norm_op`); the residual add + norm is the composition of
:class:`~jaxnorm.backends.interface.Backend` (the add, then the plain op at ``h``), which XLA
fuses. Beside the roles every backend implements (:data:`~jaxnorm.backends.interface.NORM_ROLES`)
it holds the formulas the differentiation layer runs in XLA whatever the call's backend
(:data:`FORMULA_ROLES`, reached through :func:`jaxnorm.backends.table.formula`), and gated
RMSNorm's (:data:`jaxnorm.backends.xla.gated.ROLES`, registered here under the op's
name).
"""

from __future__ import annotations

from jaxnorm.backends.interface import Backend
from jaxnorm.backends.xla import formulas, statistics
from jaxnorm.backends.xla import gated as _gated
from jaxnorm._gated_op import GATED_RMS_NORM

__all__ = ["FORMULA_ROLES", "XLA", "XlaBackend", "register_norm_op"]

#: The roles only the XLA backend has: the tangent map, the statistics, the row's standard
#: deviation (second order) and the normalized row (the Jacobian).
FORMULA_ROLES = ("tangent", "statistics", "row_std", "x_hat")


class XlaBackend(Backend):
  """The XLA backend: no config, every platform, every call."""

  name = "xla"
  platforms = None  # every lowering platform
  config_class = None


def register_norm_op(name: str, statistics_fn) -> None:
  """Gives the XLA backend a norm-family op: its statistics (``(cfg, x, mask, *, decouple) ->
  (shift, delta, rstd)``, added to :data:`~jaxnorm.backends.xla.statistics.STATISTICS`) and, in
  :data:`XLA`'s table, the family's roles and :data:`FORMULA_ROLES`, all written once for the
  family. A name already there is a ``ValueError`` (one home per op and backend)."""
  if (name, "forward") in XLA.table:
    raise ValueError(f"the xla backend already has the norm op {name!r}")
  statistics.STATISTICS[name] = statistics_fn
  XLA.register(name, forward_only=formulas.forward_only, forward=formulas.forward,
               backward=formulas.backward, tangent=formulas.tangent,
               statistics=statistics.statistics, row_std=statistics.row_std,
               x_hat=statistics.x_hat, **XLA.add_roles())


XLA = XlaBackend()
for _name, _fn in dict(statistics.STATISTICS).items():
  register_norm_op(_name, _fn)
XLA.register(GATED_RMS_NORM.name, **_gated.ROLES)
