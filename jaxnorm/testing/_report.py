"""The results of :func:`jaxnorm.testing.check_rule`: one :class:`Outcome` per check, the
:class:`Report` of them all, and the printing of the inputs a failure message shows.

Contract: an :class:`Outcome` is frozen; a :class:`Report` is true when no outcome failed and
prints one line per check followed by the inputs (:func:`_describe`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

_SMALL = 48  # arrays up to this size are printed whole in a failure message


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One check's result.

  Attributes:
    check: what was compared, e.g. ``"vmap(vjp), batched parameters"``.
    status: ``"pass"``; ``"fail"`` (a wrong result); ``"unsupported"`` (the function of the rule
      raised: ``detail`` gives the exception); ``"outside_domain"`` (wrong where the
      reference's own graph in the compute dtype is wrong too: the input is outside the
      function's float domain); ``"nondifferentiable"`` (every element off the oracle sits
      where the reference is not differentiable, the rule's result between its one-sided
      values: not a failure); ``"skip"`` (not checked, ``detail`` says why).
    worst: the largest error / budget ratio over the compared elements (<= 1 passes).
    worst_ulps: the error of that element in ulps of its dtype.
    detail: the worst element (failure) or why the check was skipped.
  """

  check: str
  status: str
  worst: float = 0.0
  worst_ulps: float = 0.0
  detail: str = ""


@dataclasses.dataclass
class Report:
  """Every check's :class:`Outcome`; true when none failed (``assert report, report``).

  A failure is an outcome with status ``"fail"``, or ``"unsupported"`` / ``"outside_domain"``
  unless ``allow`` names it (``check_rule``'s ``allow=``; the ``value`` check raising is always
  a failure).
  """

  outcomes: list
  inputs: str
  allow: tuple = ()

  @property
  def ok(self) -> bool:
    return not self.failures

  @property
  def failures(self) -> list:
    return [o for o in self.outcomes if o.status == "fail" or (
        o.status in ("unsupported", "outside_domain") and
        (o.status not in self.allow or (o.status, o.check) == ("unsupported", "value")))]

  @property
  def unsupported(self) -> list:
    """The checks whose function of the rule raised (allowed or not)."""
    return [o for o in self.outcomes if o.status == "unsupported"]

  def __bool__(self) -> bool:
    return self.ok

  def __str__(self) -> str:
    lines = [f"{o.status:4}  {o.check}: " + (o.detail if o.status != "pass" else
                                               f"worst {o.worst_ulps:.3g} ulp, "
                                               f"{o.worst:.2g} of the budget")
             for o in self.outcomes]
    return "\n".join(lines + ["inputs:", self.inputs])


def _describe(names, values) -> str:
  """One line per argument leaf: its name, dtype and shape, and its values (all of them when
  it has at most ``_SMALL`` elements, else its range)."""
  out = []
  for name, a in zip(names, values):
    a = np.asarray(a)
    head = f"  {name}: {a.dtype}{list(a.shape)}"
    if a.size <= _SMALL:
      body = np.array2string(a.astype(np.float64) if a.dtype.kind == "f" else a,
                             precision=8, separator=", ", max_line_width=96)
      out.append(head + " = " + body.replace("\n", "\n    "))
    else:
      f = a.astype(np.float64) if a.dtype.kind == "f" else a
      out.append(head + f" (min {np.nanmin(f):.4g}, max {np.nanmax(f):.4g})")
  return "\n".join(out)
