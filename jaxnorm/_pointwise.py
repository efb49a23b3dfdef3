r"""Internal API: the pointwise op family, DyT and Derf, with their derived rules in one place.

Every op of the family maps each element on its own,

.. math::

   u = \alpha \odot x + s, \qquad y = \gamma \odot \varphi(u) + \beta,

with a squashing function :math:`\varphi` (``tanh`` for DyT, ``erf`` for Derf, whose shift
:math:`s` is learned; DyT has none) and parameters that broadcast against ``x`` from its
trailing axes (a scalar :math:`\alpha`, one value per channel, or one per head and channel).
A :class:`Squash` (:data:`DYT`, :data:`DERF`) declares an op: its function and its derivative;
:data:`jaxnorm.OPS` names each declaration once.
Everything else (forward, residuals, tangent, derived backward, Jacobian diagonal) is written
once here for the whole family, from the derivation in ``docs/derivations.md`` ("Pointwise
ops: DyT and Derf"):

.. math::

   \dot y = \gamma \varphi'(u) \odot (\alpha \dot x + \dot\alpha x + \dot s)
            + \dot\gamma \odot \varphi(u) + \dot\beta,

and its transpose, with :math:`g = \bar y \odot \gamma \varphi'(u)`:
:math:`\bar x = \alpha g`, :math:`\bar\alpha = \Sigma\, g x`, :math:`\bar s = \Sigma\, g`,
:math:`\bar\gamma = \Sigma\, \bar y \varphi(u)`, :math:`\bar\beta = \Sigma\, \bar y`, each sum
over the axes its parameter is broadcast along.

Differentiation follows the norms' design (:mod:`jaxnorm._ad`): a ``jax.custom_jvp`` whose
tangent is ``pointwise_tangent_p``, a primitive linear in the tangents whose transpose rule is
the backward above. ``jax.grad`` therefore runs the derived VJP; the primitive's own JVP
(autodiff of the tangent formula) serves higher orders, and its batching rule keeps the
primitive for batched parameters. Inside the primitive every operand has ``x``'s rank (the
parameters carry leading size-1 axes), so broadcasting alone aligns them and a cotangent is
its operand's shape by summing the broadcast axes. Reverse mode keeps ``x`` and the parameters
(``x`` tagged :data:`jaxnorm.INPUT_RESIDUAL`) and recomputes :math:`u` and :math:`\varphi(u)`.

Numerics: the arithmetic runs in ``promote_types(x, parameters, float32)``, so bfloat16 and
float16 inputs are computed in float32 and rounded once; cotangents come back in the dtypes of
their primals.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from jaxnorm import _jax_compat as jc
from jaxnorm import _validation as v
from jaxnorm._remat import INPUT_RESIDUAL

__all__ = ["DERF", "DYT", "PointwiseConfig", "Squash", "apply", "jacobian_diagonal", "prepare",
           "pointwise_tangent_p"]

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _tanh_slope(u, t):
  """sech^2(u) = 4 e^{-2|u|} / (1 + e^{-2|u|})^2: no cancellation where tanh(u) rounds to 1."""
  del t
  e = jnp.exp(-2.0 * jnp.abs(u))
  return 4.0 * e / jnp.square(1.0 + e)


def _erf_slope(u, t):
  """erf'(u) = 2 / sqrt(pi) * exp(-u^2)."""
  del t
  return _TWO_OVER_SQRT_PI * jnp.exp(-jnp.square(u))


@dataclasses.dataclass(frozen=True)
class Squash:
  """One op of the family: its squashing function and that function's derivative.

  Attributes:
    name: the op's name (``"dyt"``, ``"derf"``).
    fn: :math:`\\varphi(u)`, elementwise.
    slope: :math:`\\varphi'(u)`, called as ``slope(u, fn(u))``.
    has_shift: whether the op learns a shift :math:`s` inside :math:`\\varphi`.
  """

  name: str
  fn: Callable[[Any], Any]
  slope: Callable[[Any, Any], Any]
  has_shift: bool


DYT = Squash("dyt", jnp.tanh, _tanh_slope, has_shift=False)
"""DyT's declaration: :math:`\\varphi = \\tanh`, no shift."""

DERF = Squash("derf", lax.erf, _erf_slope, has_shift=True)
"""Derf's declaration: :math:`\\varphi = \\operatorname{erf}` with a learned shift."""


@dataclasses.dataclass(frozen=True)
class PointwiseConfig:
  """Static description of one call (hashable: a ``nondiff_argnums`` value and a primitive
  parameter)."""

  squash: Squash  # the op's declaration (DYT, DERF)
  out_dtype: Any  # NumPy dtype of y
  compute_dtype: Any  # dtype of the arithmetic: promote_types(inputs, float32)


# ---------------------------------------------------------------------------------------------
# Argument preparation (checks in :mod:`jaxnorm._validation`).


def prepare(squash: Squash, x, alpha, shift, scale, bias, *, dtype=None):
  """Checks a call of the op ``squash`` declares and returns ``(cfg, alpha, shift, scale, bias)``
  aligned to ``x``'s rank.

  Each parameter must broadcast against ``x`` from the trailing axes (see
  :func:`jaxnorm._validation.check_pointwise_param`); it comes back with leading size-1 axes
  up to ``x.ndim``. None parameters stay None.
  """
  v.check_floating("x", x)
  out_dtype = v.check_out_dtype("dtype", dtype)
  names = ("alpha", "shift", "scale", "bias")
  params = (alpha, shift, scale, bias)
  for name, p in zip(names, params):
    v.check_pointwise_param(name, p, tuple(x.shape))
  dtypes = [x.dtype] + [p.dtype for p in params if p is not None]
  ct = jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)
  cfg = PointwiseConfig(squash, jnp.dtype(out_dtype or x.dtype), jnp.dtype(ct))
  aligned = tuple(None if p is None else jnp.reshape(p, (1,) * (x.ndim - p.ndim) + p.shape)
                  for p in params)
  return (cfg,) + aligned


# ---------------------------------------------------------------------------------------------
# The formulas (one home for the family's forward, tangent, backward and Jacobian).


def _pre(cfg: PointwiseConfig, x, alpha, shift):
  ct = cfg.compute_dtype
  u = alpha.astype(ct) * x.astype(ct)
  if shift is not None:
    u = u + shift.astype(ct)
  return u


def forward(cfg: PointwiseConfig, x, alpha, shift, scale, bias):
  """:math:`y = \\gamma \\odot \\varphi(\\alpha x + s) + \\beta` in ``cfg.out_dtype``."""
  ct = cfg.compute_dtype
  y = cfg.squash.fn(_pre(cfg, x, alpha, shift))
  if scale is not None:
    y = y * scale.astype(ct)
  if bias is not None:
    y = y + bias.astype(ct)
  return y.astype(cfg.out_dtype)


def _gain(cfg: PointwiseConfig, u, t, scale):
  """:math:`\\gamma \\varphi'(u)`, the derivative of ``y`` in ``u``."""
  g = cfg.squash.slope(u, t)
  return g if scale is None else g * scale.astype(cfg.compute_dtype)


def jacobian_diagonal(cfg: PointwiseConfig, x, alpha, shift, scale):
  """:math:`\\partial y_i / \\partial x_i = \\alpha \\gamma \\varphi'(u)`: the Jacobian in
  ``x`` is diagonal, and this is its diagonal, shaped like ``x``, in the compute dtype."""
  u = _pre(cfg, x, alpha, shift)
  shape = jnp.broadcast_shapes(*(a.shape for a in (x, alpha, shift, scale) if a is not None))
  gain = _gain(cfg, u, cfg.squash.fn(u), scale) * alpha.astype(cfg.compute_dtype)
  return jnp.broadcast_to(gain, shape)


def _tangent(cfg: PointwiseConfig, x, alpha, shift, scale, tx, talpha, tshift, tscale, tbias):
  """:math:`\\dot y` (linear in the tangents; None ones are zero) in ``cfg.out_dtype``."""
  ct = cfg.compute_dtype
  u = _pre(cfg, x, alpha, shift)
  t = cfg.squash.fn(u)
  inner = None
  for term in (None if tx is None else alpha.astype(ct) * tx.astype(ct),
               None if talpha is None else talpha.astype(ct) * x.astype(ct),
               None if tshift is None else tshift.astype(ct)):
    if term is not None:
      inner = term if inner is None else inner + term
  out = jnp.zeros(u.shape, ct)
  if inner is not None:
    out = out + _gain(cfg, u, t, scale) * inner
  if tscale is not None:
    out = out + tscale.astype(ct) * t
  if tbias is not None:
    out = out + tbias.astype(ct)
  return out.astype(cfg.out_dtype)


def _sum_to(ct, shape, dtype):
  """``ct`` summed over the axes along which an operand of ``shape`` was broadcast."""
  axes = tuple(i for i, (n, m) in enumerate(zip(shape, ct.shape)) if n == 1 and m != 1)
  if axes:
    ct = jnp.sum(ct, axis=axes, keepdims=True)
  return ct.reshape(shape).astype(dtype)


def backward(cfg: PointwiseConfig, x, alpha, shift, scale, dy, wanted: dict):
  """The derived VJP: ``{name: cotangent}`` for each tangent operand named in ``wanted``
  (``name -> (shape, dtype)``), from the cotangent ``dy`` of ``y``."""
  ct = cfg.compute_dtype
  dy = dy.astype(ct)
  u = _pre(cfg, x, alpha, shift)
  t = cfg.squash.fn(u)
  out = {}
  if {"tx", "talpha", "tshift"} & wanted.keys():
    g = dy * _gain(cfg, u, t, scale)
    sources = {"tx": lambda: g * alpha.astype(ct), "talpha": lambda: g * x.astype(ct),
               "tshift": lambda: g}
    for name, src in sources.items():
      if name in wanted:
        out[name] = _sum_to(src(), *wanted[name])
  if "tscale" in wanted:
    out["tscale"] = _sum_to(dy * t, *wanted["tscale"])
  if "tbias" in wanted:
    out["tbias"] = _sum_to(dy, *wanted["tbias"])
  return out


# ---------------------------------------------------------------------------------------------
# The tangent primitive: linear in the tangents, transposed by the derived backward.

_RESIDUALS = ("x", "alpha", "shift", "scale")
_TANGENTS = ("tx", "talpha", "tshift", "tscale", "tbias")


def _named(operand_names, args) -> dict:
  named = dict.fromkeys(_RESIDUALS + _TANGENTS)
  named.update(zip(operand_names, args))
  return named


def _formula(*args, cfg: PointwiseConfig, operand_names):
  a = _named(operand_names, args)
  return [_tangent(cfg, *(a[k] for k in _RESIDUALS + _TANGENTS))]


pointwise_tangent_p = jc.Primitive("jaxnorm_pointwise_tangent")
pointwise_tangent_p.multiple_results = True  # one result, ``[dot y]``: the lowering helper's form
pointwise_tangent_p.def_impl(_formula)
jc.register_lowering(pointwise_tangent_p, _formula)


def _abstract_eval(*avals, cfg: PointwiseConfig, operand_names):
  """The broadcast shape of the operands, varying over the union of their mesh axes."""
  del operand_names
  shape = jnp.broadcast_shapes(*(av.shape for av in avals))
  axes = frozenset().union(*(jc.aval_varying_axes(av) for av in avals))
  base = avals[0].update(shape=shape, dtype=cfg.out_dtype, weak_type=False)
  return [jc.with_varying_axes(base, axes)]


pointwise_tangent_p.def_abstract_eval(_abstract_eval)


def _aval(a):
  return a.aval if jc.is_undefined_primal(a) else jax.typeof(a)


def _transpose(cts, *args, cfg: PointwiseConfig, operand_names):
  """The derived VJP (:func:`backward`), each cotangent summed over the mesh axes its operand
  is replicated on."""
  a = _named(operand_names, args)
  for k in _RESIDUALS:
    if a[k] is not None and jc.is_undefined_primal(a[k]):
      raise ValueError(f"jaxnorm's pointwise tangent map is linear in the tangents only, not in "
                       f"{k!r}.")
  (ct,) = cts
  if isinstance(ct, jc.Zero):
    return [None] * len(args)
  wanted = {k: (_aval(a[k]).shape, _aval(a[k]).dtype) for k in _TANGENTS if a[k] is not None}
  cts = backward(cfg, a["x"], a["alpha"], a["shift"], a["scale"], ct, wanted)
  for k, c in cts.items():
    extra = jc.varying_axes(c) - jc.aval_varying_axes(_aval(a[k]))
    if extra:
      cts[k] = lax.psum(c, tuple(sorted(extra, key=str)))
  return [cts.get(k) for k in operand_names]


jc.register_transpose(pointwise_tangent_p, _transpose)


def _jvp(primals, tangents, *, cfg: PointwiseConfig, operand_names):
  """Higher orders: the primitive for the value, autodiff of the formula for the tangent."""
  live = [i for i, t in enumerate(tangents) if not isinstance(t, jc.Zero)]

  def f(*vals):
    args = list(primals)
    for i, val in zip(live, vals):
      args[i] = val
    return _formula(*args, cfg=cfg, operand_names=operand_names)

  out = pointwise_tangent_p.bind(*primals, cfg=cfg, operand_names=operand_names)
  _, tout = jax.jvp(f, [primals[i] for i in live], [tangents[i] for i in live])
  return out, tout


jc.register_jvp(pointwise_tangent_p, _jvp)


def _batch(args, dims, *, vmap_axis_name, vmap_axis_size, cfg: PointwiseConfig, operand_names):
  """Batch axes to the front; an unbatched operand gets a size-1 axis and broadcasts.

  Every operand then has one more axis and the primitive applies as it is: a batched
  parameter (ensembles, ``jax.jacfwd`` in the parameters) keeps its own values per batch
  entry and its cotangent, summed to its shape, stays per entry.
  """
  del vmap_axis_name, vmap_axis_size
  new = [jnp.expand_dims(a, 0) if d is None else jnp.moveaxis(a, d, 0)
         for a, d in zip(args, dims)]
  return pointwise_tangent_p.bind(*new, cfg=cfg, operand_names=operand_names), [0]


jc.register_batching(pointwise_tangent_p, _batch)


# ---------------------------------------------------------------------------------------------
# The custom_jvp op.


def _live(t):
  return None if t is None or jc.is_symbolic_zero(t) else t


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _pointwise(cfg: PointwiseConfig, x, alpha, shift, scale, bias):
  return forward(cfg, x, alpha, shift, scale, bias)


def _pointwise_jvp(cfg: PointwiseConfig, primals, tangents):
  x, alpha, shift, scale, bias = primals
  y = forward(cfg, x, alpha, shift, scale, bias)
  tx, talpha, tshift, tscale, tbias = (_live(t) for t in tangents)
  named = dict(x=checkpoint_name(x, INPUT_RESIDUAL), alpha=alpha, shift=shift,
               scale=scale, tx=tx, talpha=talpha, tshift=tshift, tscale=tscale, tbias=tbias)
  operand_names = tuple(k for k in _RESIDUALS + _TANGENTS if named[k] is not None)
  if not set(operand_names) & set(_TANGENTS):
    return y, jnp.zeros(y.shape, y.dtype)
  (ty,) = pointwise_tangent_p.bind(*(named[k] for k in operand_names), cfg=cfg,
                                   operand_names=operand_names)
  return y, ty


_pointwise.defjvp(_pointwise_jvp, symbolic_zeros=True)


def apply(cfg: PointwiseConfig, x, alpha, shift, scale, bias):
  """The op on prepared arguments (:func:`prepare`), differentiable in both modes to any
  order; reverse mode runs :func:`backward`."""
  return _pointwise(cfg, x, alpha, shift, scale, bias)
