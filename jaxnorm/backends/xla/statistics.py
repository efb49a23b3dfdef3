r"""Internal API: the norm family's per-row statistics in XLA ops, the XLA backend's home of them.

Each op of the family (:mod:`jaxnorm._norm_ops`) has its statistics here, keyed by its name in
:data:`STATISTICS`: LayerNorm's mean and variance from shifted data (or Flax's fast variance, its
option ``use_fast_variance``), RMSNorm's mean square. :func:`statistics` is what the XLA forward
(:mod:`jaxnorm.backends.xla.formulas`) and the differentiation layer (through the backend's table,
:func:`jaxnorm.backends.table.formula`) call; :func:`centered`, :func:`x_hat` and :func:`row_std`
are the rows the statistics describe. The Triton kernels compute the same statistics in their own
package (:mod:`jaxnorm.backends.triton.forward`). Derived and discussed in
``docs/derivations.md``.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm._norm_config import NormConfig
from jaxnorm._xla_rows import compute_dtype, count, cse_barrier, first_pivot, normalizer
from jaxnorm._xla_rows import on_ynn_rows, psum, row_sums

__all__ = ["STATISTICS", "centered", "row_std", "statistics", "x_hat"]


def statistics(cfg: NormConfig, x, mask, *, decouple: bool = True, alone: bool = False):
  """``(shift, delta, rstd)`` of ``x: (..., d)``, each ``(..., 1)`` in the compute dtype (None
  where the op has no such statistic): the entry of ``cfg.op`` in :data:`STATISTICS`.

  ``decouple``: the row sums read ``x`` through separate :func:`~jaxnorm._xla_rows.cse_barrier`
  views (see :func:`_layer_norm_statistics`). ``alone``: the statistics of an undifferentiated
  forward on as many rows as XLA:CPU's YNNPACK takes
  (:func:`jaxnorm.backends.xla.formulas.forward_only`): no float-range guard (``rstd`` is 0 past
  the range, as in Flax), LayerNorm pivoted on the row mean (two passes, no slice; for a 16-bit
  ``x`` without the offset term, :func:`_two_pass_statistics`), RMSNorm's
  sum read straight from ``x``: the program YNNPACK fuses whole, as it does Flax's."""
  return STATISTICS[cfg.op.name](cfg, x, mask, decouple=decouple, alone=alone)


def centered(cfg: NormConfig, xf, shift, delta):
  """``x_c``, the op's centred row (:meth:`jaxnorm._norm_ops.NormOp.centered`)."""
  return cfg.op.centered(xf, shift, delta)


def x_hat(cfg: NormConfig, xf, shift, delta, rstd):
  """The normalized row, ``x_c * rstd`` (:func:`centered`), in the compute dtype."""
  return centered(cfg, xf, shift, delta) * rstd


def row_std(cfg: NormConfig, x, mask, stats):
  r""":math:`\sqrt v` of each row, ``(..., 1)``: the masked mean square of :func:`centered`
  (psum'd over ``axis_name``), from ``stats`` of the same ``x``; two-pass, so no digits are lost
  to a large mean. For second order (:func:`jaxnorm.ops.norm.rules._wide_backward`), not a
  forward."""
  ct = compute_dtype(x.dtype)
  xc = centered(cfg, x.astype(ct), stats[0], stats[1])
  (s,) = row_sums(xc * xc, mask=mask)
  return jnp.sqrt(psum(cfg, s) / count(cfg, mask, x.shape, ct))


def _layer_norm_statistics(cfg, x, mask, *, decouple: bool = True, alone: bool = False):
  r"""Row statistics of ``x: (..., d)`` in the compute dtype, from shifted data.

  .. math::

     \delta = \tfrac1n \sum_i m_i (x_i - K), \qquad
     v = \tfrac1n \sum_i m_i (x_i - K)^2 - \delta^2, \qquad \mu = K + \delta.

  The pivot ``K`` is the row's first element (:func:`~jaxnorm._xla_rows.first_pivot`, as in the
  kernels) for a row without a mask or a sharded feature axis: the two sums then depend on nothing
  but ``x`` and are the only passes over it. Otherwise it is the plain (rounded) mean, a reduction
  first, which every shard agrees on and which ignores masked-out entries. Either way ``x - K`` is
  exact wherever it is small (Sterbenz), so the variance does not lose the digits that ``E[x^2] -
  E[x]^2`` loses at a large mean/std ratio. The price of the first element: when it lies ``k``
  standard deviations from the row's mean, ``v`` comes out of a difference of two terms of size
  about ``k^2 v`` and loses about ``2 log2(k)`` bits (3 bits at ``k = 3``; a row whose first
  feature is an outlier channel 100 standard deviations out keeps about 10 of float32's 24); the
  mean pivot loses nothing there.

  ``decouple``: the two shifted sums read ``x`` through separate
  :func:`~jaxnorm._xla_rows.cse_barrier` views (for when the statistics are outputs of the
  jitted program, e.g. residuals, and for LayerNorm's forward alone on fewer rows than YNNPACK
  takes whole); False lets them share ``x - shift`` (the forward alone otherwise,
  :func:`jaxnorm.backends.xla.formulas.forward_only`).

  With the option ``use_fast_variance=True``: Flax's ``E[x^2] - E[x]^2`` instead,
  :func:`_fast_statistics`, which returns ``(mean, None, rstd)``.

  Returns ``(shift, delta, rstd)``, each ``(..., 1)``; the row mean is ``shift + delta``.
  """
  ct = compute_dtype(x.dtype)
  xf = x.astype(ct)
  n = count(cfg, mask, x.shape, ct)
  if cfg.option("use_fast_variance"):
    return _fast_statistics(cfg, x, mask, n, decouple=decouple, guard=not alone)
  if alone and x.dtype != ct:
    return _two_pass_statistics(cfg, xf, mask, n)
  if mask is None and cfg.axis_name is None and not alone:
    shift = first_pivot(x)  # no reduction to wait for
  else:
    # The plain (rounded) mean: every shard agrees on it, and it ignores masked-out (possibly
    # garbage) entries, which a masked-out first element could be.
    (s0,) = row_sums(xf, mask=mask)
    shift = psum(cfg, s0) / n
  # The two shifted sums each see their own view of x (see cse_barrier): when the statistics are
  # residuals, XLA:CPU computes each in its own fusion, and would otherwise write x - shift (in
  # float32) to memory once for both to read.
  x1, shift1, mask1 = cse_barrier(x, shift, mask) if decouple else (x, shift, mask)
  (s1,) = row_sums(x1.astype(ct) - shift1, mask=mask1)
  shift2, x2, mask2 = cse_barrier(shift, x, mask) if decouple else (shift, x, mask)
  xs2 = x2.astype(ct) - shift2
  (s2,) = row_sums(xs2 * xs2, mask=mask2)
  delta, rstd = _mean_and_rstd(cfg, s1, s2, n, guard=not alone)
  return shift, delta, rstd


def _two_pass_statistics(cfg, xf, mask, n):
  r"""``(mean, None, rstd)`` of a 16-bit ``x``'s forward alone on many rows: the textbook two-pass.

  .. math::

     \hat\mu = \mathrm{fl}\big(\tfrac1n \sum_i m_i x_i\big), \qquad
     v = \tfrac1n \sum_i m_i (x_i - \hat\mu)^2

  in float32, with no offset term (``delta`` is None) and no float-range guard: the program of
  Flax's ``use_fast_variance=False``, which XLA:CPU's YNNPACK runs as fast as Flax's fast variance
  where the corrected form (:func:`_layer_norm_statistics`, a second row sum of ``x - K``) costs
  1.26-1.39x (``docs/perf-notes.md``, issue 62). Dropping the offset
  :math:`\delta = \tfrac1n\sum_i m_i (x_i - \hat\mu)` moves each ``x_c`` by the float32
  rounding error of the mean (a few float32 ulps of :math:`|\mu|`), which is :math:`2^{-13}`
  (float16) to :math:`2^{-16}` (bfloat16) of one rounding of a 16-bit ``x`` near the mean: nothing
  the input can hold is lost (``docs/derivations.md``). A float32 ``x`` keeps the offset, whose
  loss would be as large as its own rounding. ``xf`` is ``x`` in the compute dtype.
  """
  (s0,) = row_sums(xf, mask=mask)
  mean = psum(cfg, s0) / n
  xc = xf - mean
  (s2,) = row_sums(xc * xc, mask=mask)
  return mean, None, normalizer(cfg, psum(cfg, s2) / n, False)


def _mean_and_rstd(cfg, s1, s2, n, guard: bool = True):
  r"""``(m, rstd)`` of a row from its sum :math:`s_1` and sum of squares :math:`s_2`.

  .. math:: m = s_1 / n, \qquad v = \max(s_2 / n - m^2,\ 0)

  with both sums first added up over the devices of ``cfg.axis_name`` (one ``psum``). The sums
  are of ``x - shift`` (:func:`_layer_norm_statistics`: ``m`` is the offset ``delta``) or of
  ``x`` (:func:`_fast_statistics`: ``m`` is the mean); ``rstd`` is :func:`normalizer` of ``v``.

  :math:`m^2` is capped at the largest finite value, which changes no finite square: past the
  float range (``docs/derivations.md``) :math:`s_2` overflows first, and ``inf - inf`` would be
  NaN, which XLA:CPU's YNNPACK ``max`` (4096 rows or more) turns into 0, so ``rstd`` would be
  ``eps**-0.5`` and the row finite nonsense; ``inf - max`` is ``inf``, which the normalizer's
  guard turns into NaN.
  """
  if cfg.axis_name is not None:
    s1, s2 = psum(cfg, jnp.stack([s1, s2]))
  m = s1 / n
  m2 = jnp.minimum(m * m, jnp.finfo(m.dtype).max)
  var = jnp.maximum(s2 / n - m2, 0.0)
  return m, normalizer(cfg, var, guard)


def _fast_statistics(cfg, x, mask, n, *, decouple: bool, guard: bool = True):
  r"""``(mean, None, rstd)`` with Flax's fast variance (``use_fast_variance=True``).

  .. math::

     \mu = \tfrac1n \sum_i m_i x_i, \qquad
     v = \max\big(\tfrac1n \sum_i m_i x_i^2 - \mu^2,\ 0\big)

  Both sums read ``x`` directly (one level of row sums, as in Flax's program), so ``v`` is the
  difference of two terms of size about :math:`\mu^2 + v` and loses about
  :math:`2\log_2(|\mu|/\sigma)` of float32's 24 bits (all of them at mean/std ``4e3``; the clamp at
  0 then gives :math:`r = \epsilon^{-1/2}`). The mean is the shift and there is no offset
  (``delta`` is None): :meth:`NormOp.centered` is ``x - mean``, and the derived rules, which take
  the statistics the forward produced, differentiate this same function. ``decouple`` as in
  :func:`_layer_norm_statistics`.
  """
  ct = compute_dtype(x.dtype)
  x1, mask1 = cse_barrier(x, mask) if decouple else (x, mask)
  (s1,) = row_sums(x1.astype(ct), mask=mask1)
  # (x twice: with no mask, a barrier over (x,) alone would be merged with the first one.)
  mask2, x2, _ = cse_barrier(mask, x, x) if decouple else (mask, x, x)
  xf2 = x2.astype(ct)
  (s2,) = row_sums(xf2 * xf2, mask=mask2)
  mean, rstd = _mean_and_rstd(cfg, s1, s2, n, guard)
  return mean, None, rstd


def _rms_norm_statistics(cfg, x, mask, *, decouple: bool = True, alone: bool = False):
  r"""``(None, None, rstd)`` of ``x: (..., d)``: the reciprocal root mean square.

  .. math:: r = \mathrm{rstd}\big(\tfrac1n {\textstyle\sum_i} m_i x_i^2\big)

  One row sum read straight from ``x`` (``decouple`` has nothing to separate; a 16-bit ``x`` on
  :data:`~jaxnorm._xla_rows.YNN_MIN_ELEMENTS` rows or more, through its own view).
  """
  del decouple
  ct = compute_dtype(x.dtype)
  if x.dtype != ct and on_ynn_rows(x) and not alone:
    # A 16-bit x on as many rows as YNNPACK takes: the float range's guard uses rstd twice,
    # which ends YNNPACK's fusion at it, so the sum and the output map are separate fusions.
    # Through its own view, the sum's fusion converts x as it reads it; sharing x's float32
    # convert with the map would write it to memory (2-7x the forward's time, measured in
    # docs/perf-notes.md, issue 56).
    x, _ = cse_barrier(x, x)
  xf = x.astype(ct)
  if mask is None and cfg.axis_name is None:
    # jnp.mean, as Flax and the published formulas write it: called eagerly, it is one
    # compiled program (sum and divide) like theirs, which XLA:CPU may round differently
    # from a sum and a divide compiled apart (jax 0.8.1: 2 of 6 rows of a (6, 40) input).
    # Jitted, the compiled program is the same as the sum and divide's.
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
  else:
    (ss,) = row_sums(xf * xf, mask=mask)
    ms = psum(cfg, ss) / count(cfg, mask, x.shape, ct)
  return None, None, normalizer(cfg, ms, not alone)


STATISTICS = {"layer_norm": _layer_norm_statistics, "rms_norm": _rms_norm_statistics}
"""``{op name: (cfg, x, mask, *, decouple, alone=False) -> (shift, delta, rstd)}``: each norm
op's statistics on XLA (:func:`statistics`)."""
