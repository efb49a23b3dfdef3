"""Checks that need an argument's value, not only its shape or dtype: they run where the value is
concrete (an eager call; also inside a JVP rule under eager ``grad``/``vjp``/``jvp``, where the
primals are concrete) and return without a check where it is traced; each caller documents what
happens then. The other half of :mod:`jaxnorm._validation`, with the same conventions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import _jax_compat


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


def row_range(dtype, d: int) -> tuple[float, float]:
  r"""``(huge, tiny)``: where the norm ops' float range ends for rows of ``d`` features.

  The statistics are computed in ``ct``, float32 (float64 for float64 inputs). A row whose
  largest magnitude is at least :math:`\sqrt{\mathrm{max}_{ct} / (4d)}` may overflow its sum of
  squares (the factor 4: LayerNorm squares deviations from a pivot, up to twice the magnitude);
  with ``epsilon=0``, a nonzero row whose largest magnitude is below
  :math:`\sqrt{d\,\mathrm{tiny}_{ct}}` may underflow its mean square to 0.
  """
  ct = np.float64 if np.dtype(dtype) == np.float64 else np.float32
  fi = np.finfo(ct)
  d = max(int(d), 1)
  return float(np.sqrt(fi.max / (4.0 * d))), float(np.sqrt(fi.tiny * d))


def _with_subnormal_rows(h, big):
  """``big`` (each row's largest magnitude, as the device computed it) with the rows it saw as
  zero measured again on the host. XLA:CPU flushes subnormal floats to zero, so a row of them
  reads as a zero row there, and the op treats it as one (NaN with ``epsilon=0``); only those
  rows leave the device."""
  zero = np.flatnonzero(big == 0)
  if not zero.size:
    return big
  rows = np.asarray(h.reshape(-1, h.shape[-1])[zero]).astype(np.float64)
  big = big.astype(np.float64)
  big[zero] = np.abs(rows).max(axis=-1)
  return big


def check_row_range(op_name: str, x: Any, epsilon: float, *, residual: Any = None,
                    residual_scale: float = 1.0, x_name: str = "x") -> None:
  """Raises ``ValueError`` where a concrete finite row of ``x`` (or of ``h = x +
  residual_scale * residual``) is past :func:`row_range`: the op would otherwise return zeros
  (LayerNorm: its bias), NaN or inf for it. Rows holding a NaN or an infinity are left to
  propagate (non-finite already); traced rows are not checked (``docs/derivations.md``, "Where
  the float range ends"). With ``epsilon=0``, a row the device reads as zero is measured again on
  the host, so that a row of subnormals counts as below the range.
  ``x``: ``(..., d)``; ``epsilon``: already checked with the arguments, within the statistics'
  range too (:func:`jaxnorm._validation.check_epsilon_range`).
  """
  if any(_jax_compat.is_tracer(a) for a in (x, residual)):
    return
  ct = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
  # Concrete arrays may still meet an outer trace (a jitted function that closes over x and
  # differentiates with respect to it): evaluate on the device now, not staged into that trace.
  with jax.ensure_compile_time_eval():
    h = x.astype(ct) if residual is None else x.astype(ct) + residual_scale * residual.astype(ct)
    if h.size == 0:
      return
    big = np.asarray(jnp.max(jnp.abs(h), axis=-1)).reshape(-1)
    if epsilon == 0:
      big = _with_subnormal_rows(h, big)
  huge, tiny = row_range(ct, h.shape[-1])
  over = np.flatnonzero(np.isfinite(big) & (big >= huge))
  under = np.flatnonzero((big > 0) & (big < tiny)) if epsilon == 0 else over[:0]
  name = x_name if residual is None else f"h = {x_name} + residual_scale * residual"
  if over.size:
    i = int(over[0])
    raise ValueError(
        f"{op_name}: {over.size} row(s) of {name} are past the float range of its statistics "
        f"({np.dtype(ct).name}): row {i} (flattened) has largest magnitude {big[i]:.3g} >= "
        f"{huge:.3g} = sqrt(finfo.max / (4 d)), d = {h.shape[-1]}, where its sum of squares "
        f"overflows (the result would be zeros, LayerNorm's bias, or NaN). Rescale the rows "
        f"(the op is invariant to a row's scale, up to epsilon) or compute in float64.")
  if under.size:
    i = int(under[0])
    raise ValueError(
        f"{op_name}: {under.size} row(s) of {name} are below the float range of its statistics "
        f"({np.dtype(ct).name}) with epsilon=0: row {i} (flattened) has largest magnitude "
        f"{big[i]:.3g} < {tiny:.3g} = sqrt(d * finfo.tiny), d = {h.shape[-1]}, where its mean "
        f"square underflows to 0 (the result would be inf or NaN). Pass epsilon > 0 or rescale "
        f"the rows.")
