r"""Internal API: the closed-form LayerNorm/RMSNorm forward and backward in XLA ops.

Shared by :mod:`jaxnorm._core` (the plain op), :mod:`jaxnorm._fused` (the residual add + norm
op) and :mod:`jaxnorm._jacobian`. Names without a leading underscore here are the package's
internal API (no public guarantee); a leading underscore means "only this file". Every function
takes the static :class:`jaxnorm._spec.NormConfig` first and trusts it (validated once, in
:func:`jaxnorm._core.prepare`). The formulas are those of the :mod:`jaxnorm._core` docstring:

.. math::

   \hat x = (x - \mu)\, r, \qquad y = \gamma \odot \hat x + \beta, \qquad
   dx = r \Big( g - m\, \overline{g} - c\, m\, \hat x\, \overline{g \hat x} \Big), \quad
   g = \gamma \odot dy,

derived in ``docs/derivations.md`` (with the forward-mode tangent, :func:`tangent`, used by
:mod:`jaxnorm._ad`); the numerics (shifted-data variance, the ``_fresh``
barriers) are explained beside each function.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm import _jax_compat
from jaxnorm import _math
from jaxnorm._norm_config import NormConfig


def compute_dtype(dtype) -> np.dtype:
  """Dtype of statistics and row reductions: at least float32, float64 stays float64."""
  return jnp.promote_types(dtype, jnp.float32)


def _psum(cfg: NormConfig, x):
  if cfg.axis_name is None:
    return x
  return lax.psum(x, cfg.axis_name, axis_index_groups=cfg.axis_index_groups)


def _row_sums(*arrays, mask=None):
  """Row sums (over the last axis, keepdims) of each array; masked-out entries count as 0.

  Separate ``jnp.sum`` calls rather than one variadic ``lax.reduce``: XLA:CPU lowers a
  variadic reduce with its generic loop emitter, which measured 1.5x slower than two
  vectorized sums over the same data.
  """
  if mask is not None:
    arrays = tuple(jnp.where(mask, a, 0) for a in arrays)
  return tuple(jnp.sum(a, axis=-1, keepdims=True) for a in arrays)


def match_vma(ct, primal_vma):
  """Sums a parameter cotangent over the mesh axes its primal is replicated on.

  Inside ``shard_map`` with the batch split over, say, "data", a parameter replicated over
  "data" receives per-shard gradient contributions: its cotangent is their sum.
  """
  extra = _jax_compat.varying_axes(ct) - primal_vma
  if extra:
    ct = lax.psum(ct, tuple(sorted(extra, key=str)))
  return ct


def _count(cfg: NormConfig, mask, x_shape, dtype):
  """n: the number of elements (over all shards) the statistics average over, shape (..., 1)."""
  if mask is None:
    size = x_shape[-1]
    if cfg.axis_name is not None and cfg.axis_index_groups is None:
      # The axes' size is known when tracing: no collective of a constant (which JAX cannot
      # batch over a vmap axis inside shard_map: a bare AssertionError; the row sums' psum
      # then raises JAX's own message). Not with groups, which may differ in size.
      return jnp.full((1,) * len(x_shape), size * lax.axis_size(cfg.axis_name), dtype)
    n = jnp.full((1,) * len(x_shape), size, dtype)
  else:
    n = jnp.sum(mask, axis=-1, keepdims=True, dtype=dtype)
  return _psum(cfg, n)


def _normalizer(cfg: NormConfig, var):
  """rstd = 1/sqrt(v + eps) ("inside") or 1/(sqrt(v) + eps) ("outside"): :func:`_math.rstd`."""
  return _math.rstd(var, cfg.epsilon, cfg.epsilon_placement == "outside")


def variance_path_factor(cfg: NormConfig, rstd):
  """c in the backward's variance-path term (None for "inside").

  See :func:`jaxnorm._math.variance_path_factor`.
  """
  return _math.variance_path_factor(rstd, cfg.epsilon, cfg.epsilon_placement == "outside")


def _fresh(*arrays):
  """The arrays behind an ``optimization_barrier``: same values, opaque to XLA's CSE.

  XLA:CPU keeps a full-size ``(..., d)`` intermediate (``x - shift``, a broadcast ``rstd``, the
  float32 copy of a bfloat16 input) in memory when two of its fusions share it, instead of
  recomputing it inside each: one more write and read of ``x``'s size, and on a large array a
  freshly mapped buffer. Giving each consumer (a row sum, a column sum, the final map) its own
  barrier-wrapped view of the inputs stops common-subexpression elimination from merging their
  elementwise prologues, so each fuses with its own recomputation. Where YNNPACK takes the whole
  forward into one loop (4096 rows or more, see :func:`forward_only`), the forward alone goes
  without them. The barriers are removed before code generation and cost nothing at run time.

  Two barriers over the same operands in the same order are themselves merged (and constant
  operands do not tell them apart), so every call site passes a different tuple; where two sites
  need the same arrays, they pass them in a different order. See ``docs/perf-notes.md``.
  """
  return lax.optimization_barrier(arrays)


def statistics(cfg: NormConfig, x, mask, *, decouple: bool = True):
  r"""Row statistics of ``x: (..., d)`` in the compute dtype, from shifted data.

  .. math::

     \delta = \tfrac1n \sum_i m_i (x_i - K), \qquad
     v = \tfrac1n \sum_i m_i (x_i - K)^2 - \delta^2, \qquad \mu = K + \delta.

  The pivot ``K`` is the row's first element (:func:`first_pivot`, as in the Pallas kernels)
  for a row without a mask or a sharded feature axis: the two sums then depend on nothing but
  ``x`` and are the only passes over it. Otherwise it is the plain (rounded) mean, a reduction
  first, which every shard agrees on and which ignores masked-out entries. Either way ``x - K``
  is exact wherever it is small (Sterbenz), so the variance does not lose the digits that
  ``E[x^2] - E[x]^2`` loses at a large mean/std ratio. The price of the first element: when it
  lies ``k`` standard deviations from the row's mean, ``v`` comes out of a difference of two
  terms of size about ``k^2 v`` and loses about ``2 log2(k)`` bits (3 bits at ``k = 3``; a row
  whose first feature is an outlier channel 100 standard deviations out keeps about 10 of
  float32's 24); the mean pivot loses nothing there.

  ``decouple``: the two shifted sums read ``x`` through separate :func:`_fresh` views (for when
  the statistics are outputs of the jitted program, e.g. residuals, and for LayerNorm's forward
  alone on fewer rows than YNNPACK takes whole); False lets them share ``x - shift`` (the
  forward alone otherwise, :func:`forward_only`).

  With ``cfg.fast_variance`` (``use_fast_variance=True``): Flax's ``E[x^2] - E[x]^2`` instead,
  :func:`_fast_statistics`, which returns ``(mean, None, rstd)``.

  Returns ``(shift, delta, rstd)`` (each ``(..., 1)``) for LayerNorm, where the row mean is
  ``shift + delta``, or ``(None, None, rstd)`` for RMSNorm.
  """
  ct = compute_dtype(x.dtype)
  xf = x.astype(ct)
  if not cfg.center:
    if mask is None and cfg.axis_name is None:
      # jnp.mean, as Flax and the published formulas write it: called eagerly, it is one
      # compiled program (sum and divide) like theirs, which XLA:CPU may round differently
      # from a sum and a divide compiled apart (jax 0.8.1: 2 of 6 rows of a (6, 40) input).
      # Jitted, the compiled program is the same as the sum and divide's.
      ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
    else:
      (ss,) = _row_sums(xf * xf, mask=mask)
      ms = _psum(cfg, ss) / _count(cfg, mask, x.shape, ct)
    return None, None, _normalizer(cfg, ms)
  n = _count(cfg, mask, x.shape, ct)
  if cfg.fast_variance:
    return _fast_statistics(cfg, x, mask, n, decouple=decouple)
  if mask is None and cfg.axis_name is None:
    shift = first_pivot(x)  # no reduction to wait for
  else:
    # The plain (rounded) mean: every shard agrees on it, and it ignores masked-out (possibly
    # garbage) entries, which a masked-out first element could be.
    (s0,) = _row_sums(xf, mask=mask)
    shift = _psum(cfg, s0) / n
  # The two shifted sums each see their own view of x (see _fresh): when the statistics are
  # residuals, XLA:CPU computes each in its own fusion, and would otherwise write x - shift (in
  # float32) to memory once for both to read.
  x1, shift1, mask1 = _fresh(x, shift, mask) if decouple else (x, shift, mask)
  (s1,) = _row_sums(x1.astype(ct) - shift1, mask=mask1)
  shift2, x2, mask2 = _fresh(shift, x, mask) if decouple else (shift, x, mask)
  xs2 = x2.astype(ct) - shift2
  (s2,) = _row_sums(xs2 * xs2, mask=mask2)
  if cfg.axis_name is not None:
    s1, s2 = _psum(cfg, jnp.stack([s1, s2]))
  delta = s1 / n
  var = jnp.maximum(s2 / n - delta * delta, 0.0)
  return shift, delta, _normalizer(cfg, var)


def _fast_statistics(cfg: NormConfig, x, mask, n, *, decouple: bool):
  r"""``(mean, None, rstd)`` with Flax's fast variance (``use_fast_variance=True``).

  .. math::

     \mu = \tfrac1n \sum_i m_i x_i, \qquad
     v = \max\big(\tfrac1n \sum_i m_i x_i^2 - \mu^2,\ 0\big)

  Both sums read ``x`` directly (one level of row sums, as in Flax's program), so ``v`` is the
  difference of two terms of size about :math:`\mu^2 + v` and loses about
  :math:`2\log_2(|\mu|/\sigma)` of float32's 24 bits (all of them at mean/std ``4e3``; the clamp
  at 0 then gives :math:`r = \epsilon^{-1/2}`). The mean is the shift and there is no offset
  (``delta`` is None): :func:`centered` is ``x - mean``, and the derived rules, which take the
  statistics the forward produced, differentiate this same function. ``decouple`` as in
  :func:`statistics`.
  """
  ct = compute_dtype(x.dtype)
  x1, mask1 = _fresh(x, mask) if decouple else (x, mask)
  (s1,) = _row_sums(x1.astype(ct), mask=mask1)
  # (x twice: with no mask, a barrier over (x,) alone would be merged with the first one.)
  mask2, x2, _ = _fresh(mask, x, x) if decouple else (mask, x, x)
  xf2 = x2.astype(ct)
  (s2,) = _row_sums(xf2 * xf2, mask=mask2)
  if cfg.axis_name is not None:
    s1, s2 = _psum(cfg, jnp.stack([s1, s2]))
  mean = s1 / n
  var = jnp.maximum(s2 / n - mean * mean, 0.0)
  return mean, None, _normalizer(cfg, var)


def residual_add(cfg: NormConfig, x, residual):
  """h = x + alpha * residual, added in at least float32 and rounded once to ``h_dtype``."""
  ct = compute_dtype(jnp.promote_types(cfg.h_dtype, jnp.promote_types(x.dtype,
                                                                      residual.dtype)))
  r = residual.astype(ct)
  if cfg.residual_scale != 1.0:
    r = cfg.residual_scale * r
  return (x.astype(ct) + r).astype(cfg.h_dtype)


def first_pivot(x):
  """The row's first element, ``(..., 1)`` in the compute dtype: a pivot with no reduction.

  Sliced from an :func:`_fresh` view of ``x``: XLA:CPU cannot put a slice into the fused loop
  of the row sums, and without the barrier it hoists the float32 convert of a bfloat16 ``x``
  out of that loop for the slice to share (a full-size float32 copy). With it, the slice is a
  small fusion of its own that reads one element per row, and the sums' loop reads ``x``.
  """
  (xv,) = _fresh(x)
  return xv[..., :1].astype(compute_dtype(x.dtype))


def centered(cfg: NormConfig, xf, shift, delta):
  """``x_c = (x - shift) - delta`` (exact where ``x`` is near the pivot), or ``x`` for RMSNorm;
  ``xf`` in the compute dtype."""
  if not cfg.center:
    return xf
  return xf - shift if delta is None else (xf - shift) - delta


def x_hat(cfg: NormConfig, xf, shift, delta, rstd):
  """The normalized row, ``x_c * rstd`` (:func:`centered`), in the compute dtype."""
  return centered(cfg, xf, shift, delta) * rstd


def _as_row(p, ndim, dtype):
  """:func:`_row` of a parameter, in ``dtype``."""
  return _row(p, ndim).astype(dtype)


def _row(p, ndim):
  """A ``(heads..., d)`` parameter as ``(1, ..., 1, heads..., d)`` (explicit rank, no rank
  promotion) in its own dtype, or None. ``heads`` is empty for a parameter shared by every
  row; per-head parameters line up with ``x``'s axes just before the normalized one."""
  return None if p is None else p.reshape((1,) * (ndim - p.ndim) + tuple(p.shape))


def _rows_axes(p, ndim):
  """The axes of a ``(..., d)`` array a ``(heads..., d)`` parameter's cotangent sums over."""
  return tuple(range(ndim - p.ndim))


def gamma(cfg: NormConfig, scale, ndim, dtype=None):
  r"""The effective per-feature multiplier :math:`\gamma` as a ``(1, ..., 1, d)`` row, or None.

  :math:`\gamma = s` or :math:`1 + s` (``zero_centered_scale``), formed as the call's casting
  mode forms it (:meth:`jaxnorm._casting.CastPlan.gamma_of`: in the scale's dtype for "llama"
  and "t5") and returned in the compute dtype. The one place the XLA forward, the backward, the
  tangent and the Jacobian get it from (the kernels call the same ``gamma_of``). ``dtype``: the
  input's dtype (it fixes the compute dtype); default ``scale.dtype``.
  """
  if scale is None:
    return None
  plan = cfg.plan(scale.dtype if dtype is None else dtype)
  return plan.gamma_of(_row(scale, ndim), cfg.zero_centered_scale)


def forward(cfg: NormConfig, x, scale, bias, mask, *, decouple: bool = True):
  """``(y, (shift, delta, rstd))``: what the JVP rule computes (reverse mode keeps the stats).

  ``decouple`` as in :func:`statistics`; the undifferentiated call goes through
  :func:`forward_only`.
  """
  stats = statistics(cfg, x, mask, decouple=decouple)
  if decouple:
    # y's map sees its own view of x and of the statistics (see _fresh), so that XLA does not
    # share x's float32 copy or x - shift between the statistics' fusions and this one.
    x, stats, scale, bias = _fresh(x, stats, scale, bias)
  shift, delta, rstd = stats
  xc = centered(cfg, x.astype(rstd.dtype), shift, delta)
  plan = cfg.plan(x.dtype)  # the order of casts of the affine stage (jaxnorm._casting)
  y = plan.normalized_affine(xc, rstd, gamma(cfg, scale, x.ndim, x.dtype), _row(bias, x.ndim))
  return y.astype(cfg.out_dtype), stats


# XLA:CPU hands an instruction to YNNPACK only if it or an operand has at least this many
# elements (``kMinElements`` in XLA's ``IsInstructionPreferredByYnn``, xla/backends/cpu/
# ynn_support.cc): with fewer rows than this, the per-row statistics stay out of YNNPACK's
# fusions, which then cannot take the whole normalization into one loop (see forward_only).
YNN_MIN_ELEMENTS = 4096


def forward_only(cfg: NormConfig, x, scale, bias, mask):
  r"""``y`` alone, for a call that is not differentiated: nothing is kept for a backward.

  .. math::

     y = \gamma \odot (x - K - \delta)\, r + \beta

  :func:`forward` without the statistics as outputs. How ``x`` is shared between the row sums
  and the output map follows what XLA:CPU's YNNPACK fusion can do with the call's shape:

  * **At least** :data:`YNN_MIN_ELEMENTS` **rows**: one shared ``x - K`` (no :func:`_fresh`
    views). YNNPACK takes the pivot's consumers, both row sums and the map, into one fusion, a
    loop over ``x``; separate views would add a subtraction (and a bfloat16 convert) per
    element and per view to it (1.1-1.3x the time at 4096x256, measured).
  * **Fewer rows** (LayerNorm): the per-row statistics (fewer elements than the threshold)
    stay outside YNNPACK, so the sums and the map are separate fusions. A shared ``x - K``
    then has three users and is written to memory once for them (a full-size store and two
    loads more than Flax's program). With a :func:`_fresh` view per sum and one for the map
    (``decouple``, as :func:`forward` does for the JVP rule), each sum's fusion subtracts the
    pivot as it reads ``x``, and the program has Flax's shape plus the pivot's slice
    (LayerNorm forward at 1024x4096 float32: 1.49x Flax's time before, 1.23x after, paired
    runs in docs/perf-notes.md).

  RMSNorm keeps the shared form at every size: its one row sum reads ``x`` directly, and its
  program must stay the one XLA compiles for the published formula written by hand, which the
  casting modes match bit for bit inside models jitted in one program with the hand-written
  formula (views would stop XLA from keeping a fused bfloat16 input in float32, as it may for
  the hand-written formula: a llama-mode decoder's bfloat16 logits then differ,
  ``tests/test_casting.py``; with XLA's ``--xla_allow_excess_precision=false`` they agree
  again).

  LayerNorm's fast variance (``cfg.fast_variance``) follows the same rule: on fewer rows its two
  sums read ``x`` through views too (Flax's program otherwise writes a float32 copy of a
  bfloat16 ``x`` for them), on more it is Flax's one YNNPACK loop.

  The rows counted are those of the traced ``x``: under ``jax.vmap`` the per-example rows (a
  vmap of many short sequences takes the views, whatever the batch). The choice is made per
  lowering platform (``lax.platform_dependent``): XLA on other platforms, whose fusions were
  not measured, always gets the shared form.

  Returned in ``cfg.out_dtype``. The JVP rule, which reverse mode linearizes, calls
  :func:`forward` instead.
  """
  def shared(x, scale, bias, mask):
    return forward(cfg, x, scale, bias, mask, decouple=False)[0]

  def views(x, scale, bias, mask):
    return forward(cfg, x, scale, bias, mask, decouple=True)[0]

  if not cfg.center or math.prod(x.shape[:-1]) >= YNN_MIN_ELEMENTS:
    return shared(x, scale, bias, mask)
  # YNNPACK is XLA:CPU's: a program lowered for another platform keeps the shared form.
  return lax.platform_dependent(x, scale, bias, mask, cpu=views, default=shared)


def backward(cfg: NormConfig, x, scale, mask, stats, dy, dx_dtype=None):
  """The closed-form backward in XLA ops; ``dx`` in ``dx_dtype`` (default ``x.dtype``).

  Written as ``dx = rstd * (g - m * mean(g)) + A * m * x_c`` with the per-row coefficient
  ``A = -c * rstd**3 * sum(g * x_c) / n`` (``x_c = x - mean``, so ``rstd * x_c = x_hat``): the
  same formula as the module docstring, arranged so that the only ``(..., d)`` quantities are
  the inputs, ``x_c`` and ``g``, and none is stored. Independent computations, each one pass
  over its inputs: ``dscale = sum_rows(dy * x_c * rstd)``, ``dbias = sum_rows(dy)``, the row sums
  ``sum(g * x_c)`` and ``sum(g)``, and the final map to ``dx`` (XLA puts the last three into one
  fusion when ``d`` is large). Each sees the inputs through its own :func:`_fresh` barrier, so
  that XLA recomputes ``x_c`` and ``g`` inside every fusion instead of materializing them; that
  also keeps them apart from the forward's fusions when both are in one jitted function.
  """
  ct = compute_dtype(x.dtype)
  plan = cfg.plan(x.dtype)  # each cast's transpose rounds the cotangent (docs/derivations.md)

  def centered_of(xv, statsv):  # (..., d): x - mean (x for RMSNorm), in the compute dtype
    shift, delta, _ = statsv
    return centered(cfg, xv.astype(ct), shift, delta)

  def g_of(dyv, scalev):  # (..., d): rd_A(rd_P(gamma * dy)), in the compute dtype
    return plan.cotangents(dyv, gamma(cfg, scalev, x.ndim, x.dtype))[2]

  dscale = dbias = None
  if scale is not None:
    xv, dyv, statsv = _fresh(x, dy, stats)
    u, _ = plan.affine_of(centered_of(xv, statsv) * statsv[2], None, None)  # rd_A(x_hat)
    dscale = jnp.sum(plan.cotangents(dyv, None)[1] * u, axis=_rows_axes(scale, x.ndim))
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
  if cfg.bias_dtype is not None:
    (dyv,) = _fresh(dy)
    dq = plan.cotangents(dyv, None)[0]
    lead = tuple(range(x.ndim - len(cfg.bias_shape)))
    dbias = jnp.sum(dq, axis=lead).reshape(cfg.bias_shape).astype(cfg.bias_dtype)

  n = _count(cfg, mask, x.shape, ct)  # (..., 1)
  xv, dyv, statsv, scalev = _fresh(x, dy, stats, scale)
  rstd = statsv[2]  # (..., 1)
  c = variance_path_factor(cfg, rstd)  # (..., 1) or None
  (sum_gxc,) = _row_sums(g_of(dyv, scalev) * centered_of(xv, statsv))  # (..., 1)
  if cfg.center:
    dyv, _, scalev = _fresh(dy, rstd, scale)
    (sum_g,) = _row_sums(g_of(dyv, scalev))  # (..., 1)
    if cfg.axis_name is not None:
      sum_g, sum_gxc = _psum(cfg, jnp.stack([sum_g, sum_gxc]))
  else:
    sum_gxc = _psum(cfg, sum_gxc)
  coef = -(rstd * rstd * rstd) * (sum_gxc / n)  # variance (RMS) path, per row
  if c is not None:
    coef = coef * c
  mean_g = rstd * (sum_g / n) if cfg.center else None  # mean path, per row

  dyv, xv, statsv, scalev, maskv = _fresh(dy, x, stats, scale, mask)
  xc = centered_of(xv, statsv)  # (..., d)
  g = g_of(dyv, scalev)  # (..., d)
  if maskv is not None:
    m = maskv.astype(ct)
    var_term = (coef * m) * xc
    mean_term = None if mean_g is None else mean_g * m
  else:
    var_term = coef * xc
    mean_term = mean_g
  # (statsv's rstd, not the one above: XLA:CPU materializes a broadcast of a per-row value that
  # comes from outside the barrier.)
  dx = statsv[2] * g + var_term
  if mean_term is not None:
    dx = dx - mean_term
  return dx.astype(x.dtype if dx_dtype is None else dx_dtype), dscale, dbias


def tangent(cfg: NormConfig, x, scale, mask, stats, tx, tscale, tbias):
  r"""``dot y`` of the plain op at ``x`` for the tangents ``tx, tscale, tbias`` (None = zero).

  .. math::

     \dot y = \gamma \odot \big(r (\dot x - \overline{\dot x}) + A\, x_c\big)
              + x_c\, r \odot \dot s + \dot\beta, \qquad
     A = -c\, r^3\, \tfrac1n {\textstyle\sum_i} m_i x_{c,i} \dot x_i,

  with ``x_c = x - shift - delta`` (``x`` for RMSNorm) and the bar the masked row mean (absent
  for RMSNorm): the closed form of ``docs/derivations.md`` ("Forward mode") arranged like
  :func:`backward`, so that the ``(..., d)`` quantities are inputs and ``x_c``, recomputed, is
  never stored. For LayerNorm the row sum behind ``A`` is taken about the pivot,
  :math:`\sum m (x - K)\dot x - \delta \sum m \dot x`, so that it does not wait for
  ``delta``: with the statistics' pivot a slice of ``x``, every row sum of the forward and of the
  tangent is one level over the inputs (as in autodiff of a one-pass variance). The two row sums
  and the final map each read the inputs through their own :func:`_fresh` view, so that XLA:CPU
  keeps no float32 copy of ``x`` or broadcast statistic in memory between them. Returned in
  ``cfg.out_dtype``.
  """
  ct = compute_dtype(x.dtype)
  shift, delta, rstd = stats
  coef = mean_t = None
  if tx is not None:
    n = _count(cfg, mask, x.shape, ct)  # (..., 1)
    txv, xv, shiftv, maskv = _fresh(tx, x, shift, mask)
    xk = xv.astype(ct) - shiftv if cfg.center else xv.astype(ct)  # (..., d): x - K, or x
    (s_kt,) = _row_sums(xk * txv.astype(ct), mask=maskv)  # (..., 1)
    if cfg.center:
      maskv, txv = _fresh(mask, tx)
      (s_t,) = _row_sums(txv.astype(ct), mask=maskv)  # (..., 1)
      if cfg.axis_name is not None:
        s_t, s_kt = _psum(cfg, jnp.stack([s_t, s_kt]))
      mean_t = s_t / n
      s_xt = s_kt if delta is None else s_kt - delta * s_t  # sum(m x_c tx)
    else:
      s_xt = _psum(cfg, s_kt)
    coef = -(rstd * rstd * rstd) * (s_xt / n)  # variance (RMS) path, per row
    c = variance_path_factor(cfg, rstd)
    if c is not None:
      coef = coef * c
  # The final map: its own view of the inputs and of every per-row value it broadcasts.
  txv, statsv, xv, scalev, tscalev, tbiasv, coefv, mean_tv = _fresh(
      tx, stats, x, scale, tscale, tbias, coef, mean_t)
  shiftv, deltav, rstdv = statsv
  xf = xv.astype(ct)
  xc = centered(cfg, xf, shiftv, deltav)  # (..., d)
  ty = jnp.zeros(x.shape, ct)
  if txv is not None:
    txf = txv.astype(ct)
    if mean_tv is not None:
      txf = txf - mean_tv
    ty = rstdv * txf + coefv * xc
    gam = gamma(cfg, scalev, x.ndim, x.dtype)
    if gam is not None:
      ty = ty * gam
  if tscalev is not None:
    ty = ty + (xc * rstdv) * _as_row(tscalev, x.ndim, ct)
  if tbiasv is not None:
    ty = ty + _as_row(tbiasv, x.ndim, ct)
  return ty.astype(cfg.out_dtype)
