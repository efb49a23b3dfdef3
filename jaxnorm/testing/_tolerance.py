r"""Error budgets in ulps of the output dtype, scaled by a condition estimate.

A rule's result :math:`a_i` (dtype :math:`D`) is compared with the float64 oracle :math:`e_i`
computed on the same input values. A correct rule errs by the rounding of its result to
:math:`D` and by the roundings of its intermediate steps, carried in a compute dtype :math:`C`
(float32 for 16-bit inputs, as jaxnorm computes) and amplified by the conditioning of the
problem. The budget of element :math:`i` is

.. math::

   |a_i - e_i| \le u\,\mathrm{ulp}_D(e_i) + p\,\varepsilon_C\,M_i + \mathrm{tiny}_D,

with :math:`u` ulps (the result's own rounding), :math:`p` the propagated-error factor,
:math:`\varepsilon_C` the machine epsilon of :math:`C` and :math:`M_i` the condition magnitude:
the largest change of the exact result under a few random relative perturbations of every
input and intermediate (:math:`\max_k |J (z \odot r_k)|_i`, multipliers
:math:`r_k \in \pm[0.5, 1)`, a float64 ``jax.jvp`` of the oracle;
:mod:`jaxnorm.testing._condition`). :math:`M_i / |e_i|` is the componentwise condition number,
which is large where the
exact result cancels (a gradient entry near zero) or where the input is ill-conditioned (a row
with a large mean/std ratio). In ulps of :math:`D` the budget is
:math:`u + p\,(\varepsilon_C/\varepsilon_D)\,\kappa_i`: a 16-bit rule computing in float32 is
held to a few ulps of its own dtype, and one that computes in the 16-bit dtype is rejected.

Where the exact result is 0, or below :math:`\varepsilon_C A_i` with :math:`A_i` the scale of
the quantities it is built from (the reference's graph evaluated with absolute values,
:func:`jaxnorm.testing._condition.scale`), :math:`M_i` is at least :math:`A_i`: there the
first-order :math:`M_i` can vanish (a product of two cancelling factors) while any rule
computing along another path errs by a rounding of those quantities; ulps of 0 are no scale.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import jax.numpy as jnp

from jaxnorm import _validation

__all__ = ["Tolerance", "ulp"]


def _finfo(dtype):
  return jnp.finfo(jnp.dtype(dtype))


def ulp(values, dtype) -> np.ndarray:
  """The spacing of ``dtype`` at ``|values|`` (float64), the smallest normal's below it.

  Args:
    values: an array-like of magnitudes (any float dtype; read as float64).
    dtype: a floating dtype (``jnp.bfloat16``, ``"float16"``, ...).

  Returns:
    A float64 array of ``values``' shape: one unit in the last place of ``dtype`` at each value.
  """
  fi = _finfo(dtype)
  v = np.maximum(np.abs(np.asarray(values, np.float64)), float(fi.tiny))
  v = np.where(np.isfinite(v), v, float(fi.max))
  return np.ldexp(float(fi.eps), np.frexp(v)[1] - 1)


@dataclasses.dataclass(frozen=True)
class Tolerance:
  r"""How far a rule's result may be from the float64 oracle (module docstring).

  Attributes:
    ulps: :math:`u`, the result's own rounding, in ulps of its dtype at the exact value (one
      rounding is half an ulp; two allow for a result rounded from a value already off by
      less than an ulp).
    propagated: :math:`p`, the multiple of :math:`\varepsilon_C M_i` allowed for the
      intermediate roundings (a chain of a few operations and reductions).
    compute_dtype: :math:`C`. None: ``promote_types(dtype, float32)``, the dtype a rule is
      expected to compute in (float32 for bfloat16 and float16, float64 for float64). Pass the
      output dtype itself for a rule that deliberately rounds an intermediate to it (jaxnorm's
      ``casting="llama"``).
  """

  ulps: float = 2.0
  propagated: float = 32.0
  compute_dtype: object = None

  def __post_init__(self):
    for name in ("ulps", "propagated"):
      value = getattr(self, name)
      if not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"Tolerance.{name} must be a number >= 0, got {value!r}.")
    _validation.check_out_dtype("Tolerance.compute_dtype", self.compute_dtype)

  def compute_eps(self, dtype) -> float:
    """:math:`\\varepsilon_C` for results of ``dtype``."""
    c = self.compute_dtype
    c = jnp.promote_types(jnp.dtype(dtype), jnp.float32) if c is None else jnp.dtype(c)
    return float(_finfo(c).eps)

  def budget(self, expected, magnitude, dtype) -> np.ndarray:
    """The allowed ``|actual - expected|`` per element (float64), for results of ``dtype``.

    Args:
      expected: the float64 oracle's values.
      magnitude: :math:`M`, the condition magnitude of each element (float64, same shape).
      dtype: the dtype of the rule's result.
    """
    fi = _finfo(dtype)
    return (self.ulps * ulp(expected, dtype) + self.propagated * self.compute_eps(dtype) *
            np.abs(np.asarray(magnitude, np.float64)) + float(fi.tiny))
