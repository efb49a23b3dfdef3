r"""Internal API: the one interface every backend implements, and the dispatch's :class:`Entry`.

A backend declares what it runs: ``name``, ``platforms`` (the lowering platforms it compiles
for, None for every one), ``config_class`` (the class of its ``impl``-specific configuration,
the call's ``backend_config=``; None for none), :meth:`Backend.unavailable` (whether this JAX can
run it at all), and its :attr:`Backend.table`, ``(op name, role) -> function``: the one way the
dispatcher (:mod:`jaxnorm.backends.table`) reaches its code, and the allow-list of the ops it
implements; :meth:`Backend.refusal` / :meth:`Backend.supports` add what it refuses of a call
(options, masks, shapes). A backend never guesses an op.

A backend (an entry of :data:`jaxnorm.backends.table.BACKENDS`) runs the ops on ``(..., d)``
arrays prepared by the ops' argument preparation and described by their config (for the norm
family a :class:`jaxnorm._norm_config.NormConfig`), whose ``impl`` names the backend. Besides its
table, :class:`Backend` has four methods that declare what it takes
(:meth:`~Backend.unavailable`, :meth:`~Backend.refusal`, :meth:`~Backend.supports`,
:meth:`~Backend.add_refusal`), one for how a kernel backend runs its code
(:meth:`~Backend.launch`), three that fill the table (:meth:`~Backend.register`,
:meth:`~Backend.norm_roles`, :meth:`~Backend.add_roles`), and the six :data:`NORM_ROLES` of the
norm family, the plain op and the residual add + norm op each in three roles:

* ``forward_only``: the value of an undifferentiated call, nothing kept;
* ``forward``: the value and the per-row statistics reverse mode keeps (the JVP rule's primal);
* ``backward``: the derived VJP (run where :mod:`jaxnorm.ops.norm.rules` transposes the tangent
  map).

A backend's table entries are its own functions (the XLA backend's: its formulas; the Triton
backend's: its methods, :meth:`~Backend.norm_roles`). The math is the op's (its declaration,
derived in ``docs/derivations.md``); a backend says only how it is computed, in its own package.
:class:`Backend` gives the residual add + norm as the composition of an add in XLA and the plain
op's entries of the backend's own table (:meth:`~Backend.add_roles`, what the XLA backend
registers); a backend with fused add + norm kernels overrides the three ``add_*`` methods.
Imports nothing of jaxnorm but the ground floor's row helpers (:mod:`jaxnorm._xla_rows`: the add
and the compute dtype), never a backend (issue 66).
"""

from __future__ import annotations

import dataclasses
import functools
import types

from jaxnorm._xla_rows import compute_dtype, residual_add

__all__ = ["NORM_ROLES", "Backend", "Entry", "add_backward_of"]

#: The norm family's roles: the plain op and the residual add + norm op, each in three.
NORM_ROLES = ("forward_only", "forward", "backward", "add_forward_only", "add_forward",
              "add_backward")


@dataclasses.dataclass(frozen=True)
class Entry:
  """One ``(op, role)`` entry of the tables of the backends a call may run on, as one hashable
  function of the config: ``entry(cfg, *args)`` runs the function of ``cfg.impl``'s backend with
  the static keywords. Built by the dispatcher (:func:`jaxnorm.backends.table.run`) from each
  backend's table once per call; a kernel backend's primitive carries it as a parameter and
  swaps ``cfg.impl`` to ``"xla"`` to type it, to differentiate it, or to lower it where its
  kernels do not compile.

  Attributes:
    fns: ``((backend name, function), ...)``: the entry in each backend's table.
    static: ``((keyword, value), ...)``: hashable keywords every function is called with.
  """

  fns: tuple
  static: tuple = ()

  def __call__(self, cfg, *args):
    return dict(self.fns)[cfg.impl](cfg, *args, **dict(self.static))


class Backend:
  """The methods of a backend; the ``add_*`` ones default to add-then-plain-op.

  Every method takes the static config first and trusts it. ``stats`` is the op's residual
  tuple ``(shift, delta, rstd)``, each ``(..., 1)`` in the compute dtype (None where the op
  keeps none, e.g. RMSNorm's shift and delta). Parameter cotangents come back in their primals'
  shapes and dtypes, not yet summed over the mesh axes their primal is replicated on
  (:func:`jaxnorm.backends.table.param_cotangents` does that).
  """

  name = ""
  platforms: tuple[str, ...] | None = None  # None: every lowering platform
  config_class: type | None = None
  config_example: str = ""  # a config of config_class, as the error messages suggest it
  #: The refusal of an op without entries in :attr:`table` (``{name}``: the backend's,
  #: ``{op}``: the op's).
  not_implemented = "the {name} backend does not implement {op}"

  @property
  def auto_platforms(self) -> tuple[str, ...] | None:
    """The lowering platforms ``impl="auto"`` may give this backend where it is in
    :data:`jaxnorm.backends.table.PREFERENCE` (the per-platform choice,
    :data:`jaxnorm.backends.table.PLATFORM_BACKENDS`): its :attr:`platforms` unless it declares
    fewer (a backend whose kernels are not yet measured on a platform declares none there)."""
    return self.platforms

  def refusal(self, x2_shape, dtype, mask, axis_name, op, options=()) -> str | None:
    """Why this backend cannot take a plain call on ``x2: (rows, d)`` of ``dtype``, or None.

    ``op``: the call's :class:`~jaxnorm._norm_ops.NormOp`; ``options``: its ``(name, value)``
    pairs. The default reads the backend's own :attr:`table`: an op without a ``(op,
    "forward")`` entry is refused by name (:attr:`not_implemented`), then the op's ``(op,
    "refusal")`` entry, if it has one, is asked (``entry(op, x2_shape, dtype, options)``, a
    reason or None). A backend adds its own rules (masks, shapes) after this.
    """
    del mask, axis_name
    if (op.name, "forward") not in self.table:
      return self.not_implemented.format(name=self.name, op=op.name)
    op_refusal = self.table.get((op.name, "refusal"))
    return None if op_refusal is None else op_refusal(op, x2_shape, dtype, dict(options))

  def unavailable(self) -> str | None:
    """Why this JAX cannot run this backend at all (a phrase naming the JAX version), or None.

    Asked before :meth:`refusal` when a call chooses its backend: ``impl="auto"`` then runs
    without this backend (warning once), a call naming it gets a ``ValueError``. The default is
    always available.
    """
    return None

  def supports(self, op, x2_shape, dtype, mask=None, axis_name=None, options=()) -> bool:
    """Whether this backend implements ``op`` with these options on this call (:meth:`refusal`
    has no objection)."""
    return self.refusal(x2_shape, dtype, mask, axis_name, op, options) is None

  def launch(self, cfg, fn, *args, elsewhere: str = "raise"):
    """``fn(cfg, *args)``, one of this backend's methods bound by the dispatcher, run the way this
    backend runs its code. The default runs it as it is (XLA ops). A kernel backend runs it
    behind a primitive of its own that lowers the kernels for its platforms (``elsewhere``: what
    lowering for another platform gives, "raise" or "xla"; see
    :func:`jaxnorm.backends.triton.kernel_call.kernel_call`)."""
    del elsewhere
    return fn(cfg, *args)

  def __init__(self):
    self._table = {}
    self.table = types.MappingProxyType(self._table)

  def register(self, op_name: str, **roles) -> None:
    """Adds the entries ``(op_name, role) -> function`` to :attr:`table` (``role=function``;
    an entry already there is an error: one home per op and backend)."""
    for role, fn in roles.items():
      if (op_name, role) in self._table:
        raise ValueError(f"the {self.name} backend already has {op_name}'s {role!r}")
      self._table[(op_name, role)] = fn

  def norm_roles(self) -> dict:
    """``{role: method}`` for :data:`NORM_ROLES`: what a norm-family op registers with a backend
    whose methods implement the family (``backend.register(op.name, **backend.norm_roles())``)."""
    return {role: getattr(self, role) for role in NORM_ROLES}

  def add_refusal(self, dtypes) -> str | None:
    """Why this backend cannot take a residual add's ``(name, dtype)`` pairs, or None."""
    del dtypes
    return None

  def forward_only(self, cfg, x, scale, bias, mask):
    """``y``: the value of an undifferentiated call."""
    raise NotImplementedError

  def forward(self, cfg, x, scale, bias, mask):
    """``(y, stats)``: the value and the statistics reverse mode keeps."""
    raise NotImplementedError

  def backward(self, cfg, x, scale, mask, stats, dy, dx_dtype=None):
    """``(dx, dscale, dbias)``; ``dx`` in ``dx_dtype`` (None: ``x.dtype``)."""
    raise NotImplementedError

  def add_forward_only(self, cfg, x, residual, scale, bias, mask):
    """``(y, h)`` of the residual add + norm, nothing kept: the add, then the plain op's
    ``forward_only`` entry of this backend's table at ``h``."""
    h = residual_add(cfg, x, residual)
    return self.table[(cfg.op.name, "forward_only")](cfg, h, scale, bias, mask), h

  def add_forward(self, cfg, x, residual, scale, bias, mask):
    """``(y, h, stats)``: the statistics are the plain op's (its ``forward`` entry) at ``h``."""
    h = residual_add(cfg, x, residual)
    y, stats = self.table[(cfg.op.name, "forward")](cfg, h, scale, bias, mask)
    return y, h, stats

  def add_backward(self, cfg, h, scale, mask, stats, dy, dh, **backward_kw):
    """``(dx, dresidual, dscale, dbias)``: ``dx = dh + J^T dy``, ``dresidual = alpha dx``
    (:func:`add_backward_of`, on the plain op's ``backward`` entry of this backend's table,
    called with ``backward_kw``, e.g. the XLA formulas' second-order ``c``)."""
    backward = self.table[(cfg.op.name, "backward")]
    if backward_kw:
      backward = functools.partial(backward, **backward_kw)
    return add_backward_of(backward, cfg, h, scale, mask, stats, dy, dh)

  def add_roles(self) -> dict:
    """``{role: method}`` for the residual add + norm's three roles composed as above: what a
    backend without fused add + norm code registers with its plain op's entries."""
    return {role: getattr(self, role) for role in NORM_ROLES if role.startswith("add_")}


def add_backward_of(backward, cfg, h, scale, mask, stats, dy, dh):
  """The residual add + norm's backward composed from a plain op's ``backward`` (a backend's
  method, or one with its own keywords bound): ``dx = dh + J^T dy``, ``dresidual = alpha dx``.

  ``J^T dy`` is the plain op's backward at ``h``, kept in the compute dtype until ``dh``
  (None: ``h`` unused downstream) is added, so each cotangent is rounded once.
  """
  ct = compute_dtype(h.dtype)
  # h goes in as stored, so the backward's barriers see it and no float32 copy of a narrow
  # h is materialized.
  dn, dscale, dbias = backward(cfg, h, scale, mask, stats, dy, dx_dtype=ct)
  total = dn if dh is None else dn + dh.astype(ct)  # (..., d)
  dx = total.astype(cfg.add.x_dtype)
  if cfg.residual_scale == 1.0 and cfg.add.residual_dtype == cfg.add.x_dtype:
    dres = dx  # one array for both input cotangents
  else:
    dres = (cfg.residual_scale * total).astype(cfg.add.residual_dtype)
  return dx, dres, dscale, dbias
