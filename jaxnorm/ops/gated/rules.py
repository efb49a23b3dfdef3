r"""Internal API: gated RMSNorm, an op of its own family, on the rule factory.

Per row of ``x: (..., d)`` and gate ``z`` (same shape), the features split into groups of
``group_size`` (Mamba2's ``ngroups = d // group_size``; one group by default), with
:math:`g = \operatorname{silu}(z)` and :math:`r = (\overline{u^2} + \epsilon)^{-1/2}` per group:

.. math::

   \text{gate last (Qwen3-Next):}\ u = x,\ y = \gamma \odot \hat u \odot g; \qquad
   \text{gate first (Mamba2's norm\_before\_gate=False):}\ u = x \odot g,\ y = \gamma \odot \hat u,

with :math:`\hat u = u\,r`. The derivation (tangent and VJP of both orders) is in
``docs/derivations.md``, "Gated RMSNorm". This module declares what the rule factory
(:mod:`jaxnorm._rules`) needs: the operands (residuals ``x, z, scale, rstd``; tangents ``tx,
tz, tscale``), the tangent formula and the derived backward, in XLA ops, and
:data:`GATED_RMS_NORM`, the op's declaration; its XLA formulas are registered per role in the
XLA backend's table (:func:`jaxnorm.backends.table.register`). The Triton backend's table has
the kernels' entries (:mod:`jaxnorm.backends.triton.gated_entry`).

Numerics: the arithmetic runs in ``promote_types(x, z, scale, float32)``; ``y`` is rounded once
to ``dtype``, cotangents come back in their primals' dtypes; second order differentiates the
forward and the backward in float32 copies of 16-bit inputs, as the norm family does. Reverse
mode keeps ``x``, ``z`` (tagged :data:`jaxnorm.INPUT_RESIDUAL`), the scale and one compute-dtype
number per group and row (``rstd``, tagged :data:`jaxnorm.STATS_RESIDUAL`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm.backends import table as _backends
from jaxnorm import _concrete_checks as _cc
from jaxnorm import _jax_compat
from jaxnorm import _validation as v
from jaxnorm._norm_ops import Option
from jaxnorm._remat import INPUT_RESIDUAL, STATS_RESIDUAL
from jaxnorm._rules import Family, TangentRule, rows_of
from jaxnorm._wide import wide_jvp, wide_tangent

__all__ = ["GATED_RMS_NORM", "GatedConfig", "GatedOp", "backward", "check_layer_features",
           "check_layer_group", "forward", "gated_rms_norm", "tangent"]


@dataclasses.dataclass(frozen=True, repr=False)
class GatedOp:
  """The declaration of gated RMSNorm (hashable: part of the static config).

  Attributes:
    name: ``"gated_rms_norm"``.
    options: its switches, as the backends' refusals read them (``group_size``,
      ``norm_before_gate``).

  Its XLA formulas (:func:`forward_only`, :func:`forward`, :func:`backward`) are registered in
  the XLA backend's table under its name, below; the Triton kernels' entries are the Triton
  backend's own (:mod:`jaxnorm.backends.triton.gated_entry`).
  """

  name: str
  options: tuple

  def __repr__(self):
    return f"GatedOp({self.name!r})"


@dataclasses.dataclass(frozen=True)
class GatedConfig:
  """Static description of one call (hashable: a ``nondiff_argnums`` value, a primitive
  parameter and the kernel-call primitive's config, which reads ``impl`` and ``pallas``)."""

  op: GatedOp
  group_size: int  # features per group; d for one group
  epsilon: float
  norm_before_gate: bool  # True: y = gamma * u_hat * silu(z); False: u = x * silu(z) first
  out_dtype: Any
  compute_dtype: Any
  impl: str  # a backend's name or "per_platform" (jaxnorm.backends.table.resolve_impl)
  pallas: Any = None  # the config of the kernel backend (jaxnorm.backends.table.call_config)


# ---------------------------------------------------------------------------------------------
# The XLA formulas (one home for the forward, tangent and backward).


def _grouped(cfg: GatedConfig, a, ct):
  """``a: (..., d)`` in ``ct``, viewed as ``(..., groups, group_size)`` (None stays None); with
  one group, ``a`` as it is (XLA:CPU's programs with the size-1 axis ran the backward 1.3-3x
  slower, docs/perf-notes.md). Every formula below works in this view, so a group's statistic
  broadcasts along its last axis."""
  if a is None:
    return None
  a = a.astype(ct)
  if a.shape[-1] == cfg.group_size:
    return a
  return a.reshape(a.shape[:-1] + (a.shape[-1] // cfg.group_size, cfg.group_size))


def _gamma(cfg: GatedConfig, scale, ndim: int):
  """``scale`` (``(d,)`` or None) in the compute dtype in the grouped view, with leading size-1
  axes to its rank."""
  if scale is None:
    return None
  g = _grouped(cfg, scale, cfg.compute_dtype)
  rank = ndim if g.ndim == 1 else ndim + 1
  return g.reshape((1,) * (rank - g.ndim) + g.shape)


def _from_residuals(cfg: GatedConfig, x, z, scale, rstd):
  """What the tangent and the backward recompute from the residuals, in the grouped view and the
  compute dtype: ``(x, silu(z), silu'(z), r, u_hat, gamma)``, ``r`` broadcastable."""
  ct = cfg.compute_dtype
  xg, zg = _grouped(cfg, x, ct), _grouped(cfg, z, ct)
  g, dg = _gate(zg)
  r = rstd.astype(ct)
  r = r if x.shape[-1] == cfg.group_size else r[..., None]
  u = xg if cfg.norm_before_gate else xg * g
  return xg, g, dg, r, u * r, _gamma(cfg, scale, x.ndim)


def _group_mean(a):
  return jnp.mean(a, axis=-1, keepdims=True)


def _gate(z):
  r"""``(silu(z), silu'(z))`` with :math:`\operatorname{silu}'(z) = s(1 + z(1 - s))`,
  :math:`s = \sigma(z)`."""
  s = jax.nn.sigmoid(z)
  return z * s, s * (1.0 + z * (1.0 - s))


def _times(a, b):
  return a if b is None else a * b


def forward(cfg: GatedConfig, x, z, scale):
  """``(y, rstd)``: ``y`` in ``cfg.out_dtype``, ``rstd: (..., groups)`` in the compute dtype."""
  ct = cfg.compute_dtype
  xg, zg = _grouped(cfg, x, ct), _grouped(cfg, z, ct)
  g, _ = _gate(zg)
  u = xg if cfg.norm_before_gate else xg * g
  rstd = lax.rsqrt(_group_mean(jnp.square(u)) + cfg.epsilon)
  y = _times(u * rstd, _gamma(cfg, scale, x.ndim))
  if cfg.norm_before_gate:
    y = y * g
  rstd = rstd if x.shape[-1] == cfg.group_size else rstd[..., 0]
  return y.reshape(x.shape).astype(cfg.out_dtype), rstd


def forward_only(cfg: GatedConfig, x, z, scale):
  """``y`` alone (nothing kept)."""
  return forward(cfg, x, z, scale)[0]


def tangent(cfg: GatedConfig, x, z, scale, rstd, tx, tz, tscale):
  r""":math:`\dot y`, linear in the tangents (None ones are zero), in ``cfg.out_dtype``:
  :math:`\dot{\hat u} = r(\dot u - \hat u\,\overline{\hat u \dot u})` with
  :math:`\dot u = \dot x` (gate last) or :math:`\dot x g + x g' \dot z` (gate first)."""
  ct = cfg.compute_dtype
  xg, g, dg, r, uh, gamma = _from_residuals(cfg, x, z, scale, rstd)
  txg, tzg = _grouped(cfg, tx, ct), _grouped(cfg, tz, ct)
  gate_after = g if cfg.norm_before_gate else None
  tgate = None if tzg is None else dg * tzg
  if cfg.norm_before_gate:
    tu = txg
  else:
    parts = [p for p in (None if txg is None else txg * g,
                         None if tgate is None else xg * tgate) if p is not None]
    tu = None if not parts else sum(parts[1:], parts[0])
  out = jnp.zeros(uh.shape, ct)
  if tu is not None:
    out = out + _times(_times(r * (tu - uh * _group_mean(uh * tu)), gamma), gate_after)
  if cfg.norm_before_gate and tgate is not None:
    out = out + _times(uh, gamma) * tgate
  if tscale is not None:
    out = out + _times(uh * _gamma(cfg, tscale, x.ndim), gate_after)
  return out.reshape(x.shape).astype(cfg.out_dtype)


def backward(cfg: GatedConfig, x, z, scale, rstd, dy):
  r"""The derived VJP, ``(dx, dz, dscale)``: ``dx``/``dz`` in ``x``'s/``z``'s dtypes, ``dscale``
  summed over the rows in the compute dtype (None without a scale). With
  :math:`a` the cotangent of :math:`\hat u` (:math:`\bar y \gamma g` gate last,
  :math:`\bar y \gamma` gate first) and :math:`\bar u = r(a - \hat u\,\overline{a \hat u})`:
  gate last, :math:`\bar x = \bar u`, :math:`\bar z = \bar y \gamma \hat u g'`,
  :math:`\bar\gamma = \Sigma\,\bar y \hat u g`; gate first, :math:`\bar x = \bar u g`,
  :math:`\bar z = \bar u x g'`, :math:`\bar\gamma = \Sigma\,\bar y \hat u`."""
  xg, g, dg, r, uh, gamma = _from_residuals(cfg, x, z, scale, rstd)
  dyg = _grouped(cfg, dy, cfg.compute_dtype)
  dn = dyg * g if cfg.norm_before_gate else dyg  # the cotangent of gamma * u_hat
  a = _times(dn, gamma)
  du = r * (a - uh * _group_mean(a * uh))
  if cfg.norm_before_gate:
    dx, dz = du, _times(dyg * uh, gamma) * dg
  else:
    dx, dz = du * g, du * xg * dg
  dscale = None
  if scale is not None:
    prod = (dn * uh).reshape(x.shape)
    dscale = jnp.sum(prod, axis=tuple(range(x.ndim - 1)))
  return dx.reshape(x.shape).astype(x.dtype), dz.reshape(z.shape).astype(z.dtype), dscale


GATED_RMS_NORM = GatedOp(
    "gated_rms_norm",
    options=(Option("group_size", None), Option("norm_before_gate", True)))
"""Gated RMSNorm's declaration."""

_backends.register("xla", GATED_RMS_NORM.name, forward_only=forward_only, forward=forward,
                   backward=backward)


# ---------------------------------------------------------------------------------------------
# The family's declarations for the rule factory.

_RESIDUALS = ("x", "z", "scale", "rstd")
_TANGENTS = ("tx", "tz", "tscale")
_PARAMS = frozenset({"scale", "tscale"})


def _formula(cfg: GatedConfig, a: dict):
  return [tangent(cfg, *(a[k] for k in _RESIDUALS + _TANGENTS))]


def _backward(cfg: GatedConfig, a: dict, cts, wanted: dict) -> dict:
  (dy,) = cts  # never None: the factory answers an all-zero cotangent itself
  # Second order differentiates the backward in float32 copies of 16-bit inputs (wide_jvp), as
  # the norm family's, so each path's cotangent is rounded once.
  dx, dz, dscale = wide_jvp(functools.partial(_backends.run, cfg, "backward"))(
      a["x"], a["z"], a["scale"], a["rstd"], dy)
  out = {"tx": dx, "tz": dz}
  if "tscale" in wanted:
    shape, dtype = wanted["tscale"]
    out["tscale"] = dscale.reshape(shape).astype(dtype)
  return {k: c for k, c in out.items() if k in wanted}


def _out_types(cfg: GatedConfig, a: dict):
  return [(a["x"].shape, cfg.out_dtype)]


GATED = Family("gated", _RESIDUALS, _TANGENTS, _PARAMS, _formula, _backward, _out_types,
               rows_batch=rows_of(_PARAMS), second_order=wide_tangent,
               remat_names=(("x", INPUT_RESIDUAL), ("z", INPUT_RESIDUAL),
                            ("rstd", STATS_RESIDUAL)))
"""The family's declaration for :class:`jaxnorm._rules.TangentRule`."""

_RULE = TangentRule(GATED)
gated_tangent_p = _RULE.primitive


def _check_range(cfg: GatedConfig, x, z) -> None:
  """Each group's statistic within the float range where ``x`` and ``z`` are concrete (an eager
  call, also in the JVP rule under eager grad/vjp/jvp), as the norm ops check their rows
  (:func:`jaxnorm._concrete_checks.check_row_range`); a traced group is not checked (past the
  range it comes back as the norm ops' rows do, ``docs/derivations.md``)."""
  if _jax_compat.is_tracer(x) or _jax_compat.is_tracer(z):
    return
  u, name = _grouped(cfg, x, cfg.compute_dtype), "x"
  if not cfg.norm_before_gate:
    u, name = u * _gate(_grouped(cfg, z, cfg.compute_dtype))[0], "x * silu(z)"
  _cc.check_row_range(GATED_RMS_NORM.name, u, cfg.epsilon, x_name=name)


def _forward(cfg: GatedConfig, x, z, scale):
  _check_range(cfg, x, z)
  y, rstd = wide_jvp(functools.partial(_backends.run, cfg, "forward"))(x, z, scale)
  return y, dict(x=x, z=z, scale=scale, rstd=rstd)


def _value(cfg: GatedConfig, x, z, scale):
  _check_range(cfg, x, z)
  return _backends.run(cfg, "forward_only", x, z, scale)


_gated = _RULE.op(_value, _forward, _TANGENTS, "_gated")


# ---------------------------------------------------------------------------------------------
# The public op (and the checks its layers share).


def check_layer_features(layer: str, x, num_features: int) -> None:
  """A ``ValueError`` unless ``x``'s last axis has ``num_features`` (the layers' check)."""
  if x.ndim < 1 or x.shape[-1] != num_features:
    raise ValueError(f"{layer} was built for {num_features} features (the last axis of x), got "
                     f"x of shape {tuple(x.shape)}.")


def check_layer_group(layer: str, num_features: int, group_size) -> None:
  """``group_size`` None or a positive int dividing ``num_features`` (the layers' check)."""
  if group_size is not None:
    v.check_positive_int("group_size", group_size)
    if num_features % group_size:
      raise ValueError(f"{layer}: group_size must divide num_features ({num_features}), got "
                       f"{group_size}.")



def _prepare(x, z, scale, *, epsilon, group_size, norm_before_gate, dtype, impl,
             backend_config=None, pallas=None):
  """Checks a call; returns its :class:`GatedConfig`."""
  v.check_input("x", x)
  v.check_input("z", z)   # the gate: None (left out) is refused by name
  if scale is not None:
    v.check_input("scale", scale)   # the gated kernels take no 8-bit scale either
  if x.ndim < 1:
    raise ValueError(f"x must have at least one axis (the normalized features), got shape "
                     f"{tuple(x.shape)}.")
  if tuple(z.shape) != tuple(x.shape):
    raise ValueError(f"z (the gate) must have x's shape {tuple(x.shape)}, got "
                     f"{tuple(z.shape)}.")
  d = int(x.shape[-1])
  if scale is not None:
    if tuple(scale.shape) != (d,):
      raise ValueError(f"scale must have shape ({d},) (x's last axis), got "
                       f"{tuple(scale.shape)}.")
  epsilon = v.check_epsilon(epsilon)
  v.check_bool("norm_before_gate", norm_before_gate)
  # No features: one group of one (nothing to normalize; the result is empty, as rms_norm's).
  k = (d or 1) if group_size is None else v.check_positive_int("group_size", group_size)
  if d % k:
    raise ValueError(f"group_size must divide x's last axis ({d}), got {k}; Mamba2's "
                     f"group_size is d // ngroups.")
  out_dtype = v.check_out_dtype("dtype", dtype)
  config, config_arg = _backends.one_config(backend_config, pallas)
  config = _backends.check_config(config, config_arg)
  dtypes = [a.dtype for a in (x, z, scale) if a is not None]
  ct = jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)
  rows = int(x.size // d) if d else 0
  resolved = _backends.resolve_impl(impl, (rows, d), jnp.result_type(*dtypes), None, None,
                                    GATED_RMS_NORM,
                                    (("group_size", k), ("norm_before_gate", norm_before_gate)))
  return GatedConfig(GATED_RMS_NORM, k, epsilon, norm_before_gate,
                     jnp.dtype(out_dtype or x.dtype), jnp.dtype(ct), resolved,
                     _backends.call_config(config, resolved, impl, config_arg))


def gated_rms_norm(x, z, scale=None, *, epsilon=1e-6, group_size=None, norm_before_gate=True,
                   dtype=None, impl="auto", backend_config=None, pallas=None):
  r"""Gated RMSNorm (Mamba2, Qwen3-Next) with hand-derived derivative rules.

  .. math::

     \text{norm\_before\_gate=True: } y = \gamma \odot \hat x \odot \operatorname{silu}(z),
     \qquad \text{False: } y = \gamma \odot \widehat{(x \odot \operatorname{silu}(z))},

  where :math:`\hat u = u / \sqrt{\overline{u^2} + \epsilon}` normalizes each group of
  ``group_size`` consecutive features of the last axis (one group, the whole row, by default).
  ``jax.grad`` runs the derived VJP and ``jax.jvp`` the derived tangent (both differentiate
  again); the arithmetic runs in float32 for 16-bit inputs, rounded once.

  Args:
    x: ``(..., d)`` floating array.
    z: the gate, a floating array of ``x``'s shape.
    scale: ``(d,)`` floating array, :math:`\gamma`; None for none.
    epsilon: Python float >= 0.
    group_size: features per normalized group (must divide ``d``; Mamba2's ``d // ngroups``);
      None: the whole row.
    norm_before_gate: True normalizes ``x`` and then gates (Qwen3-Next; Mamba2's default);
      False gates first and normalizes ``x * silu(z)``.
    dtype: dtype of ``y``; default ``x.dtype``.
    impl: "auto", "xla", "triton" or its alias "pallas" (see :func:`jaxnorm.layer_norm`).
    backend_config: the config of the backend ``impl`` runs, or None (a
      :class:`jaxnorm.PallasConfig` for the kernels; see :func:`jaxnorm.layer_norm`).
    pallas: the documented alias of ``backend_config``.

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError: a non-floating or 8-bit float ``x``, ``z`` or ``scale``, the gate left out
      (``z=None``), a non-bool ``norm_before_gate``, a non-int ``group_size``.
    ValueError: ``z`` not shaped like ``x``, ``scale`` not ``(d,)``, ``group_size`` not dividing
      ``d``, ``impl="triton"`` on a call its kernels refuse (saying why), or a concrete group
      past the float range (as :func:`jaxnorm.rms_norm`'s rows, with ``d`` the group size and
      the group of ``x``, or of ``x * silu(z)`` with ``norm_before_gate=False``); a traced one
      is not checked and comes back as the norm ops' rows do (zeros, ``docs/derivations.md``).

  Example:
    >>> import jax.numpy as jnp, jaxnorm
    >>> y = jaxnorm.gated_rms_norm(jnp.ones((2, 4)), jnp.zeros((2, 4)), jnp.ones(4))
    >>> float(y.sum())  # silu(0) = 0
    0.0
  """
  cfg = _prepare(x, z, scale, epsilon=epsilon, group_size=group_size,
                 norm_before_gate=norm_before_gate, dtype=dtype, impl=impl,
                 backend_config=backend_config, pallas=pallas)
  return _gated(cfg, x, z, scale)
