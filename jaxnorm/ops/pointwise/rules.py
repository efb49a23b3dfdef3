r"""Internal API: the pointwise op family, DyT and Derf, with their derived rules in one place.

Every op of the family maps each element on its own,

.. math::

   u = \alpha \odot x + s, \qquad y = \gamma \odot \varphi(u) + \beta,

with a squashing function :math:`\varphi` (``tanh`` for DyT, ``erf`` for Derf, whose shift
:math:`s` is learned; DyT has none) and parameters that broadcast against ``x`` from its
trailing axes (a scalar :math:`\alpha`, one value per channel, or one per head and channel).
A :class:`Squash` declares an op: its function and its derivative. Each op of the family is its
own module of this package (:mod:`~jaxnorm.ops.pointwise.dyt`, :mod:`~jaxnorm.ops.pointwise.derf`:
its declaration, public function and Jacobian, on :func:`call` and :func:`jacobian`), and
:data:`jaxnorm.OPS` names it once (``docs/adding-an-op.md``).
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

Differentiation is built by the rule factory (:mod:`jaxnorm._rules`), as for the norms: a
``jax.custom_jvp`` whose tangent is ``pointwise_tangent_p``, a primitive linear in the tangents
whose transpose rule is the backward above. ``jax.grad`` therefore runs the derived VJP; the
primitive's own JVP (autodiff of the tangent formula) serves higher orders, and its batching
rule keeps the primitive for batched parameters. Inside the primitive every operand has
``x``'s rank (the parameters carry leading size-1 axes), so broadcasting alone aligns them and a
cotangent is its operand's shape by summing the broadcast axes. Reverse mode keeps ``x`` and the
parameters (``x`` tagged :data:`jaxnorm.INPUT_RESIDUAL`) and recomputes :math:`u` and
:math:`\varphi(u)`.

Numerics: the arithmetic runs in ``promote_types(x, parameters, float32)``, so bfloat16 and
float16 inputs are computed in float32 and rounded once; cotangents come back in the dtypes of
their primals.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from jaxnorm import _validation as v
from jaxnorm._remat import INPUT_RESIDUAL
from jaxnorm._rules import Family, TangentRule

__all__ = ["PointwiseConfig", "Squash", "apply", "call", "jacobian", "jacobian_diagonal",
           "prepare", "pointwise_tangent_p"]

@dataclasses.dataclass(frozen=True)
class Squash:
  """One op of the family: its squashing function and that function's derivative.

  Attributes:
    name: the op's name (``"dyt"``, ``"derf"``), its key in :data:`jaxnorm.OPS`.
    fn: :math:`\\varphi(u)`, elementwise.
    slope: :math:`\\varphi'(u)`, called as ``slope(u, fn(u))``.
    has_shift: whether the op learns a shift :math:`s` inside :math:`\\varphi`.
  """

  name: str
  fn: Callable[[Any], Any]
  slope: Callable[[Any, Any], Any]
  has_shift: bool


@dataclasses.dataclass(frozen=True)
class PointwiseConfig:
  """Static description of one call (hashable: a ``nondiff_argnums`` value and a primitive
  parameter)."""

  squash: Squash  # the op's declaration (e.g. jaxnorm.ops.pointwise.dyt.DYT)
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
  v.check_input("x", x)
  v.check_floating("alpha", alpha)  # required: None (left out) is refused by name
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
# The family's declarations for the rule factory (:mod:`jaxnorm._rules`): the tangent primitive
# is linear in the tangents and transposed by the derived backward.

_RESIDUALS = ("x", "alpha", "shift", "scale")
_TANGENTS = ("tx", "talpha", "tshift", "tscale", "tbias")


def _formula(cfg: PointwiseConfig, a: dict):
  return [_tangent(cfg, *(a[k] for k in _RESIDUALS + _TANGENTS))]


def _backward(cfg: PointwiseConfig, a: dict, cts, wanted: dict) -> dict:
  (ct,) = cts  # never None: the factory answers an all-zero cotangent itself
  return backward(cfg, a["x"], a["alpha"], a["shift"], a["scale"], ct, wanted)


def _out_types(cfg: PointwiseConfig, a: dict):
  """The broadcast shape of the operands, in ``y``'s dtype."""
  return [(jnp.broadcast_shapes(*(av.shape for av in a.values() if av is not None)),
           cfg.out_dtype)]


def _rows_batch(operand_names, args, dims, groups: int, size: int):
  """Batch axes to the front; an unbatched operand gets a size-1 axis and broadcasts.

  Every operand then has one more axis and the primitive applies as it is: a batched
  parameter (ensembles, ``jax.jacfwd`` in the parameters) keeps its own values per batch
  entry and its cotangent, summed to its shape, stays per entry.
  """
  del operand_names, groups, size
  return [jnp.expand_dims(a, 0) if d is None else jnp.moveaxis(a, d, 0)
          for a, d in zip(args, dims)], 0


POINTWISE = Family("pointwise", _RESIDUALS, _TANGENTS, frozenset(), _formula, _backward,
                   _out_types, rows_batch=_rows_batch, remat_names=(("x", INPUT_RESIDUAL),))
"""The pointwise family's declaration for :class:`jaxnorm._rules.TangentRule`."""

_RULE = TangentRule(POINTWISE)
pointwise_tangent_p = _RULE.primitive


# ---------------------------------------------------------------------------------------------
# The custom_jvp op.


def _forward(cfg: PointwiseConfig, x, alpha, shift, scale, bias):
  """The value and what reverse mode keeps: ``x`` and the parameters it reads."""
  y = forward(cfg, x, alpha, shift, scale, bias)
  return y, dict(x=x, alpha=alpha, shift=shift, scale=scale)


_pointwise = _RULE.op(forward, _forward, _TANGENTS, "_pointwise")


def apply(cfg: PointwiseConfig, x, alpha, shift, scale, bias):
  """The op on prepared arguments (:func:`prepare`), differentiable in both modes to any
  order; reverse mode runs :func:`backward`."""
  return _pointwise(cfg, x, alpha, shift, scale, bias)


def call(squash: Squash, x, alpha, shift, scale, bias, *, dtype=None):
  """The public function of the op ``squash`` declares: :func:`prepare`, then :func:`apply`.

  ``shift`` is passed on as given (None where the op has none); the op's own function checks
  that an op with a shift got one.
  """
  cfg, alpha, shift, scale, bias = prepare(squash, x, alpha, shift, scale, bias, dtype=dtype)
  return apply(cfg, x, alpha, shift, scale, bias)


def jacobian(squash: Squash, x, alpha, shift, scale):
  """The diagonal of the op's Jacobian in ``x`` (:func:`jacobian_diagonal`) on unprepared
  arguments, shaped like ``x`` in the compute dtype."""
  cfg, alpha, shift, scale, _ = prepare(squash, x, alpha, shift, scale, None)
  return jacobian_diagonal(cfg, x, alpha, shift, scale)
