r"""Internal API: the norm family's closed-form forward, backward and tangent in XLA ops.

Written once for every op of the family (:mod:`jaxnorm._norm_ops`): each function takes the
static :class:`jaxnorm._norm_config.NormConfig` first, trusts it (checked once, in
:mod:`jaxnorm.ops.norm.args`) and reads the op's declaration from ``cfg.op`` (its statistics, its
centred row, whether the mean-path term is present). Used by the XLA backend
(:mod:`jaxnorm.backends.xla.backend`), the differentiation layer (:func:`tangent`) and the Jacobian.
With :math:`\hat x = x_c\, r`, :math:`g = \gamma \odot dy` and bars for masked row means,

.. math::

   y = \gamma \odot \hat x + \beta, \qquad
   dx = r \Big( g - m\, \overline{g} - c\, m\, \hat x\, \overline{g \hat x} \Big)

(:math:`\overline g` only with a mean path; :math:`c` the variance-path factor), derived in
``docs/derivations.md`` with the forward-mode tangent; the program-shape choices (the
:func:`~jaxnorm._xla_rows.cse_barrier` barriers, the YNNPACK threshold) are explained beside each
function and in ``docs/perf-notes.md``.
"""

from __future__ import annotations


import functools

import jax.numpy as jnp

from jaxnorm._jax_compat import default_platform
from jaxnorm._norm_config import NormConfig
from jaxnorm._xla_rows import as_row, compute_dtype, count, cse_barrier, gamma, on_ynn_rows
from jaxnorm._xla_rows import param_row, psum, row_sums, variance_path_factor
from jaxnorm.backends.xla.statistics import centered, statistics


def _rows_axes(p, ndim):
  """The axes of a ``(..., d)`` array a ``(heads..., d)`` parameter's cotangent sums over."""
  return tuple(range(ndim - p.ndim))


def forward(cfg: NormConfig, x, scale, bias, mask, *, decouple: bool = True,
            alone: bool = False):
  """``(y, (shift, delta, rstd))``: what the JVP rule computes (reverse mode keeps the stats).

  ``decouple`` and ``alone`` as in :func:`statistics`; the undifferentiated call goes through
  :func:`forward_only`.
  """
  stats = statistics(cfg, x, mask, decouple=decouple, alone=alone)
  if decouple:
    # y's map sees its own view of x and of the statistics (see cse_barrier), so that XLA does not
    # share x's float32 copy or x - shift between the statistics' fusions and this one.
    x, stats = cse_barrier(x, stats)
  shift, delta, rstd = stats
  xc = centered(cfg, x.astype(rstd.dtype), shift, delta)
  plan = cfg.plan(x.dtype)  # the order of casts of the affine stage (jaxnorm._casting)
  y = plan.normalized_affine(xc, rstd, gamma(cfg, scale, x.ndim, x.dtype), param_row(bias, x.ndim))
  return y.astype(cfg.out_dtype), stats


# The ops whose undifferentiated forward reads ``x`` through separate views (:func:`forward_only`;
# measured in docs/perf-notes.md, issues 23 and 56): LayerNorm. RMSNorm keeps Flax's program
# (but for its one sum's view of a 16-bit x on many rows, in its statistics). XLA's tuning, not
# a field of the ops' declarations.
FORWARD_VIEWS = frozenset({"layer_norm"})


def forward_only(cfg: NormConfig, x, scale, bias, mask):
  r"""``y`` alone, for a call that is not differentiated: nothing is kept for a backward.

  .. math::

     y = \gamma \odot (x - K - \delta)\, r + \beta

  :func:`forward` without the statistics as outputs.

  **On a CPU host, at least** :data:`~jaxnorm._xla_rows.YNN_MIN_ELEMENTS` **rows** (what
  XLA:CPU hands to YNNPACK): the program YNNPACK fuses whole, one pass over ``x`` as Flax's
  (issue 62): ``statistics(..., alone=True)``: LayerNorm pivoted on the row mean (two-pass; the
  first-element pivot's slice would share ``x``'s float32 convert with the fusion, which then
  writes it to memory), and **no float-range guard**: a traced row past the float range comes out
  as Flax's does (zeros, LayerNorm's bias) instead of NaN, because the guard uses ``rstd``
  twice and so ends YNNPACK's fusion (2-5 fusions and a full-size intermediate instead of one
  fusion). Every derivative of such a row stays NaN (they run :func:`forward`), and a concrete
  call raises before any of this. The one place jaxnorm's forward is as quiet as Flax's
  (``docs/derivations.md``, "Where the float range ends"). Not for the residual add + norm with
  a 16-bit ``h``: in one YNNPACK fusion XLA (excess precision allowed) drops ``h``'s rounding
  when ``h`` is no output, and ``y`` would not be the norm of the ``h`` the op returns
  (``tests/jaxnorm/test_fused.py``); that call keeps the form below.

  Otherwise, how ``x`` is shared between the row sums and the output map, for the ops of
  :data:`FORWARD_VIEWS` (the XLA backend's tuning for LayerNorm), follows what XLA:CPU does
  with the call's shape and dtype:

  * **Fewer than** :data:`~jaxnorm._xla_rows.YNN_MIN_ELEMENTS` **rows, or a 16-bit** ``x``: a
    :func:`cse_barrier` view per sum and one for the map (``decouple``, as :func:`forward` does
    for the JVP rule). Each sum's fusion subtracts the pivot (and converts a 16-bit ``x``) as it
    reads ``x``, and the program has Flax's shape plus the pivot's slice. A shared ``x - K``
    would have three users in separate fusions and be written to memory once for them (on few
    rows the per-row statistics stay outside YNNPACK; on many, the float range's guard,
    :func:`jaxnorm._math.past_range_guard`, uses ``rstd`` twice, which ends YNNPACK's fusion
    at it): a full-size float32 store and two loads more.
  * **At least that many rows of a float32** ``x``: one shared ``x - K``. No convert is
    needed, and XLA fuses the subtraction into the sums' and the map's loops (measured against
    the views: ``docs/perf-notes.md``, issues 23 and 56).

  RMSNorm keeps the shared form at every size: its one row sum reads ``x`` directly (a 16-bit
  ``x`` on many rows through its own view, :func:`jaxnorm.backends.xla.statistics.statistics`),
  and its program is Flax's plus the guard, whose outputs the casting modes match bit for bit
  (``tests/jaxnorm/test_casting.py``; views of a 16-bit ``x`` on fewer rows would stop XLA from
  keeping a bfloat16 input of its fusion in float32, as it may for the hand-written formula: a
  llama-mode decoder's bfloat16 logits would then differ; with XLA's
  ``--xla_allow_excess_precision=false`` they agree again).

  LayerNorm's fast variance (its option ``use_fast_variance``) follows the same rule.

  The rows counted are those of the traced ``x``: under ``jax.vmap`` the per-example rows (a
  vmap of many short sequences takes the views, whatever the batch). XLA on other platforms,
  whose fusions were not measured, gets the shared form. The choice is the tracing host's
  (:func:`jaxnorm._jax_compat.default_platform`), not a per-platform switch, which would trace
  both forms (issue 62: tracing time); a program traced on a CPU and exported for another
  platform carries the views, whose barriers change no value.

  Returned in ``cfg.out_dtype``. The JVP rule, which reverse mode linearizes, calls
  :func:`forward` instead.
  """
  def shared(x, scale, bias, mask):
    return forward(cfg, x, scale, bias, mask, decouple=False)[0]

  def views(x, scale, bias, mask):
    return forward(cfg, x, scale, bias, mask, decouple=True)[0]

  cpu = default_platform() == "cpu"
  narrow_h = cfg.add is not None and x.dtype != compute_dtype(x.dtype)
  if cpu and on_ynn_rows(x) and not narrow_h:
    return forward(cfg, x, scale, bias, mask, decouple=False, alone=True)[0]
  if cfg.op.name not in FORWARD_VIEWS or (on_ynn_rows(x) and x.dtype == compute_dtype(x.dtype)):
    return shared(x, scale, bias, mask)
  # YNNPACK is XLA:CPU's: a program traced on another host keeps the shared form. Decided by
  # the host when tracing, not per lowering platform: a switch would trace both forms.
  return (views if cpu else shared)(x, scale, bias, mask)


def _with_scale(hide, scale, *arrays):
  """``(*views of arrays, the scale's view)``: the scale goes behind each backward site's barrier
  too (its own view of gamma * dy per fusion) where ``hide``: not on YNNPACK's rows, where a
  constant scale behind a barrier crashed XLA:CPU (issue 62); below them, without it, XLA shared
  gamma * dy between the fusions (RMSNorm's forward + backward 1.36x slower at 512x64)."""
  return cse_barrier(*arrays, scale) if hide else (*cse_barrier(*arrays), scale)


def backward(cfg: NormConfig, x, scale, mask, stats, dy, dx_dtype=None, c=None):
  """The closed-form backward in XLA ops; ``dx`` in ``dx_dtype`` (default ``x.dtype``).

  ``c``: the variance-path factor, where the caller has it from the standard deviation
  (:func:`jaxnorm._math.variance_path_factor_of_std`; second order); None: from ``rstd``.

  Written as ``dx = rstd * (g - m * mean(g)) + A * m * x_c`` with the per-row coefficient
  ``A = -c * rstd**3 * sum(g * x_c) / n`` (``x_c = x - mean``, so ``rstd * x_c = x_hat``): the
  same formula as the module docstring, arranged so that the only ``(..., d)`` quantities are
  the inputs, ``x_c`` and ``g``, and none is stored. Independent computations, each one pass
  over its inputs: ``dscale = sum_rows(dy * x_c * rstd)``, ``dbias = sum_rows(dy)``, the row sums
  ``sum(g * x_c)`` and ``sum(g)``, and the final map to ``dx`` (XLA puts the last three into one
  fusion when ``d`` is large). Each sees the inputs through its own :func:`cse_barrier` barrier, so
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
    xv, dyv, statsv = cse_barrier(x, dy, stats)
    u, _ = plan.affine_of(centered_of(xv, statsv) * statsv[2], None, None)  # rd_A(x_hat)
    dscale = jnp.sum(plan.cotangents(dyv, None)[1] * u, axis=_rows_axes(scale, x.ndim))
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
  if cfg.bias_dtype is not None:
    (dyv,) = cse_barrier(dy)
    dq = plan.cotangents(dyv, None)[0]
    lead = tuple(range(x.ndim - len(cfg.bias_shape)))
    dbias = jnp.sum(dq, axis=lead).reshape(cfg.bias_shape).astype(cfg.bias_dtype)

  n = count(cfg, mask, x.shape, ct)  # (..., 1)
  with_scale = functools.partial(_with_scale, scale is not None and not on_ynn_rows(x), scale)
  xv, dyv, statsv, scalev = with_scale(x, dy, stats)
  rstd = statsv[2]  # (..., 1)
  if c is None:
    c = variance_path_factor(cfg, rstd)  # (..., 1) or None
  (sum_gxc,) = row_sums(g_of(dyv, scalev) * centered_of(xv, statsv))  # (..., 1)
  if cfg.op.mean_path:
    dyv, _, scalev = with_scale(dy, rstd)
    (sum_g,) = row_sums(g_of(dyv, scalev))  # (..., 1)
    if cfg.axis_name is not None:
      sum_g, sum_gxc = psum(cfg, jnp.stack([sum_g, sum_gxc]))
  else:
    sum_gxc = psum(cfg, sum_gxc)
  coef = -(rstd * rstd * rstd) * (sum_gxc / n)  # variance (RMS) path, per row
  if c is not None:
    coef = coef * c
  mean_g = rstd * (sum_g / n) if cfg.op.mean_path else None  # mean path, per row

  dyv, xv, statsv, maskv, scalev = with_scale(dy, x, stats, mask)
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
  and the final map each read the inputs through their own :func:`cse_barrier` view, so that XLA:CPU
  keeps no float32 copy of ``x`` or broadcast statistic in memory between them. Returned in
  ``cfg.out_dtype``.
  """
  ct = compute_dtype(x.dtype)
  shift, delta, rstd = stats
  coef = mean_t = None
  if tx is not None:
    n = count(cfg, mask, x.shape, ct)  # (..., 1)
    txv, xv, shiftv, maskv = cse_barrier(tx, x, shift, mask)
    xk = centered(cfg, xv.astype(ct), shiftv, None)  # (..., d): x - K, or x
    (s_kt,) = row_sums(xk * txv.astype(ct), mask=maskv)  # (..., 1)
    if cfg.op.mean_path:
      maskv, txv = cse_barrier(mask, tx)
      (s_t,) = row_sums(txv.astype(ct), mask=maskv)  # (..., 1)
      if cfg.axis_name is not None:
        s_t, s_kt = psum(cfg, jnp.stack([s_t, s_kt]))
      mean_t = s_t / n
      s_xt = s_kt if delta is None else s_kt - delta * s_t  # sum(m x_c tx)
    else:
      s_xt = psum(cfg, s_kt)
    coef = -(rstd * rstd * rstd) * (s_xt / n)  # variance (RMS) path, per row
    c = variance_path_factor(cfg, rstd)
    if c is not None:
      coef = coef * c
  # The final map: its own view of the inputs and of every per-row value it broadcasts.
  txv, statsv, xv, coefv, mean_tv = cse_barrier(tx, stats, x, coef, mean_t)
  shiftv, deltav, rstdv = statsv
  xf = xv.astype(ct)
  xc = centered(cfg, xf, shiftv, deltav)  # (..., d)
  ty = jnp.zeros(x.shape, ct)
  if txv is not None:
    txf = txv.astype(ct)
    if mean_tv is not None:
      txf = txf - mean_tv
    ty = rstdv * txf + coefv * xc
    gam = gamma(cfg, scale, x.ndim, x.dtype)
    if gam is not None:
      ty = ty * gam
  if tscale is not None:
    ty = ty + (xc * rstdv) * as_row(tscale, x.ndim, ct)
  if tbias is not None:
    ty = ty + as_row(tbias, x.ndim, ct)
  return ty.astype(cfg.out_dtype)
