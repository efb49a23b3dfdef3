r"""Internal API: the norm family's derived rules, each op one ``jax.custom_jvp`` over a primitive.

Reverse mode *is* the derived custom VJP. Each op is a ``jax.custom_jvp`` function (``jax.jvp``
needs one: JAX refuses forward mode through a ``jax.custom_vjp``) whose JVP rule returns the
primal from the forward that keeps the statistics (:func:`jaxnorm.backends.table.forward`, on the
call's backend) and the tangent from ``norm_tangent_p``, a primitive that is *linear* in the
tangents and whose transpose rule is the hand-derived backward
(:func:`jaxnorm.backends.table.backward` / :func:`jaxnorm.backends.table.add_backward`, the Pallas
backward kernels included). ``jax.grad`` linearizes the JVP rule (the forward runs once, its
residuals ``x, scale, mask, stats`` are kept) and transposes the primitive: exactly the pair
``jax.custom_vjp(fwd, bwd)`` with ``fwd`` = :func:`jaxnorm.backends.table.forward` and ``bwd`` =
:func:`jaxnorm.backends.table.backward`, which ``tests/jaxnorm/test_one_ad_layer.py`` builds and
compares bitwise, program included. An undifferentiated call runs
:func:`jaxnorm.backends.table.forward_only` (one pass, nothing kept).

The tangent (derived in ``docs/derivations.md``, "Forward mode"), per row, with
:math:`\dot x_c = \dot x - m\text{-mean}(\dot x)` (LayerNorm; :math:`\dot x_c = \dot x` for
RMSNorm), :math:`\overline{\,\cdot\,}` the masked mean, psum'd over ``axis_name``:

.. math::

   \dot y = \gamma \odot r\big(\dot x_c - c\, \hat x\, \overline{\hat x \dot x}\big)
            + \hat x \odot \dot s + \dot\beta,

with :math:`c` the variance-path factor (1 "inside"); for the fused op
:math:`\dot h = \dot x + \alpha \dot r` and :math:`\dot y` the same map at ``h`` applied to
:math:`\dot h`. The tangent is computed by XLA ops on every path.

The primitive and the ``custom_jvp`` ops are built by the rule factory (:mod:`jaxnorm._rules`)
from the family's declarations below (:data:`NORM`: operand names, tangent formula, derived
backward, output types, how batching adds rows), as every family's are.
It has every rule JAX asks of a primitive:
abstract evaluation (outputs shaped like ``x``, varying over the union of the operands' mesh
axes), lowering (the tangent formula), transposition (the derived VJP), its own JVP (autodiff of
the formula, for second order) and batching. Batching keeps the derived rules for every batched
operand: a batch axis of the row-like operands only is more rows; a batch axis of a parameter
(``scale``, its tangent or ``bias``'s: ensembles, one model per seed, ``jax.jacfwd`` in the
parameters) becomes a *group* axis, the static ``groups`` count of leading axes along which
every operand, parameters included, has its own values. Each rule then maps the ungrouped rule
over the groups with ``jax.vmap``: the transpose is still the derived backward (a
``pallas_call`` under ``vmap`` is one launch with one more grid axis), never autodiff of the
formula. A ``jax.vmap`` axis that ``axis_name`` names (the features split over it, as over a
mesh axis in ``shard_map``) becomes a group axis too, mapped by a ``jax.vmap`` of the same
name (``group_names``), so that the rules' ``psum`` over ``axis_name`` sums over that group.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from jaxnorm.backends import table as _backends
from jaxnorm import _math
from jaxnorm import _concrete_checks as _cc
from jaxnorm.ops.norm.memory_efficient import kept, lost, recovered
from jaxnorm._norm_config import NormConfig
from jaxnorm._remat import INPUT_RESIDUAL, OUTPUT_RESIDUAL, STATS_RESIDUAL
from jaxnorm._rules import Family, TangentRule, rows_of
from jaxnorm._wide import wide_jvp, wide_tangent
from jaxnorm._xla_rows import compute_dtype

__all__ = ["add_norm", "apply", "norm_tangent_p"]

# Operand names of the primitive. Residuals first (``x`` is the normalized input: ``h`` for
# the fused op), then the tangents it is linear in. Absent ones (no scale, no mask, RMSNorm's
# shift/delta, a symbolic-zero tangent) are left out. ``y`` and ``bias`` stand in for ``x``,
# ``shift`` and ``delta`` with memory_efficient.
_RESIDUALS = ("x", "y", "scale", "bias", "mask", "shift", "delta", "rstd")
_TANGENTS = ("tx", "tr", "tscale", "tbias")
_PARAMS = frozenset({"scale", "bias", "tscale", "tbias"})  # shape (groups..., d)


def _wide_backward(cfg: NormConfig, fn, xla_fn):
  """The derived backward ``fn(x, scale, mask, stats, *cotangents)`` (on the call's backend),
  with a JVP (second order) that :func:`jaxnorm._wide.wide_tangent` takes of the same backward
  in XLA ops, ``xla_fn`` (:func:`jaxnorm.backends.table.formula`'s), with the statistics recomputed
  from ``x``.

  The statistics are ``S(x)`` wherever JAX calls the backward (its residuals come from the
  forward), so their incoming tangents are ``S'(x) tx``, which the recomputation gives: every
  path from ``x`` is then in one float32 program, summed before the one rounding, where the
  forward's JVP would round its share of ``x``'s cotangent to 16 bits apart. They are taken
  about the plain mean, as for masked rows (an all-true mask where there is none): the first
  element as pivot loses about 2 log2(k) bits of the variance when it lies k deviations from the
  mean, which the second derivative amplifies. With epsilon outside the square root, the
  variance-path factor comes from the recomputed standard deviation
  (:func:`jaxnorm._math.variance_path_factor_of_std`), not from ``rstd``, whose
  ``1 - eps*rstd`` cancels where the deviation is far below epsilon (``docs/derivations.md``,
  "Second order in 16 bits").
  """
  outside = cfg.epsilon_placement == "outside"

  def of_x(x, scale, mask, stats, *cts):
    stats_mask = jnp.ones(x.shape, bool) if mask is None else mask
    fresh_stats = _backends.formula(cfg, "statistics")(x, stats_mask)
    kept = tuple(None if a is None else b for a, b in zip(stats, fresh_stats))
    c = (_math.variance_path_factor_of_std(_backends.formula(cfg, "row_std")(x, mask, fresh_stats),
                                           cfg.epsilon) if outside else None)
    return xla_fn(x, scale, mask, kept, *cts, c=c)

  def tangent_fn(x, scale, mask, stats, *cts):
    # Differentiated in x, scale and the cotangents; the mask is fixed, the statistics' incoming
    # tangents are not read (recomputed inside).
    return lambda x, scale, mask_, stats_, *cts: of_x(x, scale, mask, stats, *cts)

  return wide_jvp(fn, tangent_fn)


# ---------------------------------------------------------------------------------------------
# The family's declarations for the rule factory (:mod:`jaxnorm._rules`).


def _formula(cfg: NormConfig, a: dict):
  """One group's tangent (XLA ops, the fallback backend's ``"tangent"`` formula,
  :func:`jaxnorm.backends.table.formula`): ``[dot y]`` (plain op) or ``[dot y, dot h]`` (fused
  op)."""
  a = recovered(cfg, a)
  tangent = _backends.formula(cfg, "tangent")
  stats = (a["shift"], a["delta"], a["rstd"])
  if not cfg.has_add:
    return [tangent(a["x"], a["scale"], a["mask"], stats, a["tx"], a["tscale"], a["tbias"])]
  h = a["x"]
  th = None
  if a["tx"] is not None or a["tr"] is not None:
    ct = compute_dtype(h.dtype)
    th = jnp.zeros(h.shape, ct)
    if a["tx"] is not None:
      th = th + a["tx"].astype(ct)
    if a["tr"] is not None:
      th = th + cfg.residual_scale * a["tr"].astype(ct)
  ty = tangent(h, a["scale"], a["mask"], stats, th, a["tscale"], a["tbias"])
  th = jnp.zeros(h.shape, cfg.h_dtype) if th is None else th.astype(cfg.h_dtype)
  return [ty, th]


def _backward(cfg: NormConfig, a: dict, cts, wanted: dict) -> dict:
  """One group's derived VJP (:func:`jaxnorm.backends.table.backward`, fused: ``add_backward``)."""
  if "tbias" not in wanted and cfg.bias_dtype is not None:
    cfg = dataclasses.replace(cfg, bias_dtype=None, bias_shape=None)  # no dbias wanted
  # With memory_efficient, x is recovered from y in x's compute dtype: dx is cast to tx's dtype.
  dx_dtype = None if a["x"] is not None or "tx" not in wanted else wanted["tx"][1]
  given, a = a, recovered(cfg, a, safe=True)
  x, scale, mask = a["x"], a["scale"], a["mask"]
  stats = (a["shift"], a["delta"], a["rstd"])
  dy = jnp.zeros(x.shape, cfg.out_dtype) if cts[0] is None else cts[0]
  if not cfg.has_add:
    kw = {} if dx_dtype is None else {"dx_dtype": dx_dtype}
    dx, dscale, dbias = _wide_backward(
        cfg, functools.partial(_backends.backward, cfg, **kw),
        functools.partial(_backends.formula(cfg, "backward"), **kw))(x, scale, mask, stats, dy)
    dscale, dbias = _backends.param_cotangents(cfg, scale, dscale, dbias)
    dx, dscale = lost(cfg, given, dx, dscale)  # NaN where memory_efficient lost x_hat
    return dict(zip(("tx", "tscale", "tbias"), (dx, dscale, dbias)))
  dh = cts[1]  # None: h unused downstream, skipped
  return dict(zip(("tx", "tr", "tscale", "tbias"),
                  _wide_backward(cfg, functools.partial(_backends.add_backward, cfg),
                                 _backends.formula(cfg, "add_backward"))(
                      x, scale, mask, stats, dy, dh)))


def _out_types(cfg: NormConfig, a: dict):
  """Outputs shaped like ``x`` (or ``y``): ``y``'s dtype, and ``h``'s for the fused op."""
  shape = (a["x"] if a["x"] is not None else a["y"]).shape
  return [(shape, cfg.out_dtype)] + ([(shape, cfg.h_dtype)] if cfg.has_add else [])


def _split_axes(cfg: NormConfig) -> tuple:
  """The ``jax.vmap`` axes that split the features: those ``cfg.axis_name`` names."""
  return cfg.axis_name if isinstance(cfg.axis_name, tuple) else (cfg.axis_name,)


NORM = Family("norm", _RESIDUALS, _TANGENTS, _PARAMS, _formula, _backward, _out_types,
              rows_batch=rows_of(_PARAMS), split_axes=_split_axes, second_order=wide_tangent,
              remat_names=(("x", INPUT_RESIDUAL), ("y", OUTPUT_RESIDUAL),
                           ("shift", STATS_RESIDUAL), ("delta", STATS_RESIDUAL),
                           ("rstd", STATS_RESIDUAL)),
              output_residual="y")
"""The norm family's declaration for :class:`jaxnorm._rules.TangentRule`."""

_RULE = TangentRule(NORM)
norm_tangent_p = _RULE.primitive


# ---------------------------------------------------------------------------------------------
# The custom_jvp ops.


def _check(cfg: NormConfig, x, scale, residual=None):
  """The checks of values (:mod:`jaxnorm._concrete_checks`), run by the value and by the JVP
  rule, whose primals are concrete in an eager call, differentiated (eager grad/vjp/jvp) or
  not; a traced call checks nothing here (its outcome is documented with each check)."""
  _cc.check_row_range(cfg.op.name, x, cfg.epsilon, residual=residual,
                      residual_scale=cfg.residual_scale if cfg.has_add else 1.0)
  if cfg.option("memory_efficient"):
    _cc.check_invertible_scale(scale, cfg.zero_centered_scale)


def _norm_value(cfg: NormConfig, x, scale, bias, mask):
  _check(cfg, x, scale)
  return _backends.forward_only(cfg, x, scale, bias, mask)


def _add_norm_value(cfg: NormConfig, x, residual, scale, bias, mask):
  _check(cfg, x, scale, residual)
  return _backends.add_forward_only(cfg, x, residual, scale, bias, mask)


def _norm_forward(cfg: NormConfig, x, scale, bias, mask):
  _check(cfg, x, scale)
  y, stats = wide_jvp(functools.partial(_backends.forward, cfg))(x, scale, bias, mask)
  # What reverse mode saves: x and the statistics, or y and rstd (memory_efficient).
  return y, dict(kept(cfg, x, y, bias, stats), scale=scale, mask=mask)


def _add_norm_forward(cfg: NormConfig, x, residual, scale, bias, mask):
  _check(cfg, x, scale, residual)
  y, h, stats = wide_jvp(functools.partial(_backends.add_forward, cfg))(
      x, residual, scale, bias, mask)
  return (y, h), dict(x=h, scale=scale, mask=mask, shift=stats[0], delta=stats[1],
                      rstd=stats[2])


apply = _RULE.op(_norm_value, _norm_forward, ("tx", "tscale", "tbias", None), "_norm")
apply.__doc__ = r"""``apply(cfg, x2, scale, bias, mask2)``: the plain op on prepared arguments,
differentiable in both modes (the ``custom_jvp`` op itself, so that a call enters this module
once).

.. math::

   y = \gamma \odot \hat x + \beta, \qquad
   \dot y = \gamma \odot r\big(\dot x_c - c\,\hat x\,\overline{\hat x \dot x}\big)
            + \hat x \odot \dot s + \dot\beta

(see the module docstring); reverse mode transposes :math:`\dot y` into the derived VJP.
"""

add_norm = _RULE.op(_add_norm_value, _add_norm_forward, ("tx", "tr", "tscale", "tbias", None),
                    "_add_norm")
add_norm.__doc__ = r"""``add_norm(cfg, x2, r2, scale, bias, mask2)``: the fused op on prepared
arguments, ``(y, h)``, differentiable in both modes.

.. math::

   \dot h = \dot x + \alpha\,\dot r, \qquad \dot y = \dot{\mathrm{Norm}}(h)[\dot h, \dot s,
   \dot\beta]

(the plain op's tangent at ``h``); reverse mode transposes it into the fused backward.
"""
