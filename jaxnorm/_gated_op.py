r"""Internal API: gated RMSNorm's declaration, :data:`GATED_RMS_NORM`, and its static call
description, :class:`GatedConfig`.

Per row of ``x: (..., d)`` and gate ``z`` (same shape), the features split into groups of
``group_size`` (Mamba2's ``ngroups = d // group_size``; one group by default), with
:math:`g = \operatorname{silu}(z)` and :math:`r = (\overline{u^2} + \epsilon)^{-1/2}` per group:

.. math::

   \text{gate last (Qwen3-Next):}\ u = x,\ y = \gamma \odot \hat u \odot g; \qquad
   \text{gate first (Mamba2's norm\_before\_gate=False):}\ u = x \odot g,\ y = \gamma \odot \hat u,

with :math:`\hat u = u\,r` (derivation: ``docs/derivations.md``, "Gated RMSNorm"). The op's own
options (:attr:`GatedOp.options`) are declared here once: the public function
(:func:`jaxnorm.gated_rms_norm`) checks them, its layers pass them on by these names, and the
backends' refusals read them. Low in the import graph, as :mod:`jaxnorm._norm_ops` and
:mod:`jaxnorm._norm_config` are for the norm family: the differentiation rules
(:mod:`jaxnorm.ops.gated.rules`) and every backend's code for the op (the XLA formulas,
:mod:`jaxnorm.backends.xla.gated`; the Triton kernels' entry,
:mod:`jaxnorm.backends.triton.gated_entry`) import it, and it imports no op and no backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxnorm._casting import CastPlan
from jaxnorm._norm_ops import Option

__all__ = ["GATED_RMS_NORM", "GatedConfig", "GatedOp"]


@dataclasses.dataclass(frozen=True, repr=False)
class GatedOp:
  """The declaration of gated RMSNorm (hashable: part of the static config).

  Attributes:
    name: ``"gated_rms_norm"``: the key of its entries in each backend's table, ``(name, role)``.
    options: its own switches (:class:`~jaxnorm._norm_ops.Option`), in the order of the public
      function's keywords: what its layers store and pass on by name, and the ``(name, value)``
      pairs the backends' refusals read.
  """

  name: str
  options: tuple

  def __repr__(self):
    return f"GatedOp({self.name!r})"

  def defaults(self) -> dict:
    """``{name: default}`` of :attr:`options`."""
    return {o.name: o.default for o in self.options}


@dataclasses.dataclass(frozen=True)
class GatedConfig:
  """Static description of one call (hashable: a ``nondiff_argnums`` value, a primitive
  parameter and the kernel-call primitive's config, which reads ``impl`` and ``backend_config``)."""

  op: GatedOp
  group_size: int  # features per group; d for one group
  epsilon: float
  norm_before_gate: bool  # True: y = gamma * u_hat * silu(z); False: u = x * silu(z) first
  out_dtype: Any
  compute_dtype: Any
  impl: str  # a backend's name or "per_platform" (jaxnorm.backends.table.resolve_impl)
  # One config per backend it runs on besides XLA, as sorted (name, config) pairs
  # (jaxnorm.backends.table.call_config); each backend reads its own as backend_config.
  backend_config: Any = ()
  # Where the affine stage rounds (casting=, jaxnorm._casting), in the compute dtype; None where
  # nothing rounds before y ("float32", or a mode whose dtypes are all the compute dtype).
  cast: CastPlan | None = None

  def grouped(self, a, ct):
    """``a: (..., d)`` in ``ct``, viewed as ``(..., groups, group_size)`` (None stays None);
    with one group, ``a`` as it is (XLA:CPU's programs with the size-1 axis ran the backward
    1.3-3x slower, docs/perf-notes.md). The view every XLA formula of the op works in (a group's
    statistic broadcasts along its last axis) and the one the range check measures."""
    if a is None:
      return None
    a = a.astype(ct)
    if a.shape[-1] == self.group_size:
      return a
    return a.reshape(a.shape[:-1] + (a.shape[-1] // self.group_size, self.group_size))


GATED_RMS_NORM = GatedOp("gated_rms_norm", options=(
    Option("group_size", None),  # features per group (None: the whole row)
    Option("norm_before_gate", True),  # True: normalize, then gate; False: gate first
    Option("casting", "float32"),  # where u_hat * gamma rounds (jaxnorm._casting.CASTINGS)
))
"""Gated RMSNorm's declaration."""
