"""Checks that need an argument's value, not only its shape or dtype: they run where the value is
concrete (an eager call; also inside a JVP rule under eager ``grad``/``vjp``/``jvp``, where the
primals are concrete) and return without a check where it is traced; each caller documents what
happens then. The other half of :mod:`jaxnorm._validation`, with the same conventions.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def concrete(a: Any):
  """``a`` as a NumPy array if its value is known here (not a tracer), else None."""
  try:
    return np.asarray(a)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def check_invertible_scale(scale: Any, zero_centered_scale: bool) -> None:
  r"""``memory_efficient=True`` divides by :math:`\gamma`: a ``ValueError`` where the scale is a
  concrete array (not traced) with a :math:`\gamma_i = 0` (``scale_i = 0``, or ``-1`` with a
  zero-centred scale). Called by the ops' argument check and by the JVP rule, whose primal scale
  is concrete under eager ``grad``/``vjp``/``jvp``. A traced scale cannot be checked: a zero then
  gives NaN in that feature's ``dx`` column and ``dscale`` entry (``docs/derivations.md``)."""
  if scale is None:
    return
  value = concrete(scale)
  if value is None:
    return   # traced: not checkable here
  gamma = value.astype(np.float64) + (1.0 if zero_centered_scale else 0.0)
  zeros = np.flatnonzero(gamma.reshape(-1) == 0)
  if zeros.size:
    raise ValueError(
        f"memory_efficient=True recovers x_hat = (y - bias) / gamma in the backward, but gamma "
        f"is 0 at {zeros.size} of {gamma.size} features (first at flat index {int(zeros[0])}); "
        f"those cotangents would be NaN. Use memory_efficient=False, or a nonzero scale.")


def check_token_ids(name: str, tokens: Any, vocab_size: int) -> bool:
  """Checks integer token ids against ``[0, vocab_size)`` where their value is concrete.

  Returns True if it checked them (concrete), False if they are traced (the caller then
  applies its documented behaviour for ids out of range).

  Raises:
    ValueError: a concrete id is negative or ``>= vocab_size`` (naming the first one).
  """
  ids = concrete(tokens)
  if ids is None:
    return False
  bad = (ids < 0) | (ids >= vocab_size)
  if bad.any():
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"{name} must be ids in [0, {vocab_size}) (vocab_size={vocab_size}), got "
        f"{int(bad.sum())} out of range, the first {int(ids[where])} at index {where}; "
        f"map them into the vocabulary (or build the model with a larger vocab_size).")
  return True
