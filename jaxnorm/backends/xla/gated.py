r"""Internal API: gated RMSNorm in XLA ops, the XLA backend's entries for the op (one home).

The forward (its statistic, one ``rstd`` per group and row, included), the tangent and the
derived backward of :data:`jaxnorm._gated_op.GATED_RMS_NORM` on ``(..., d)`` arrays, each
taking the call's :class:`~jaxnorm._gated_op.GatedConfig` first and trusting it (checked once,
in :mod:`jaxnorm.ops.gated.rules`). :data:`ROLES` is what the XLA backend registers under the
op's name (:mod:`jaxnorm.backends.xla.backend`); the differentiation rules reach these
functions only through the backend table (:func:`jaxnorm.backends.table.run` and
:func:`~jaxnorm.backends.table.formula`). With :math:`g = \operatorname{silu}(z)`,
:math:`r` the group's reciprocal root mean square of :math:`u` (``x``, or ``x * g`` gate
first) and :math:`\hat u = u\,r`:

.. math::

   y = \mathrm{rd}_O(p\,g) \ (\text{gate last}), \quad y = \mathrm{rd}_O(p) \ (\text{gate first}),
   \qquad p = \mathrm{rd}_P(\mathrm{rd}_A(\hat u)\,\gamma),

where the casting mode (``cfg.cast``, :mod:`jaxnorm._casting`) sets the dtypes :math:`A` and
:math:`P`; without one nothing rounds before ``y`` (:math:`p = \hat u\,\gamma`) and the
arithmetic runs in ``cfg.compute_dtype``. Derivations: ``docs/derivations.md``, "Gated
RMSNorm"; the backward rounds each cotangent where the forward rounded the value, as the norm
family's casting modes do (:meth:`jaxnorm._casting.CastPlan.cotangents`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm import _math
from jaxnorm._gated_op import GatedConfig

__all__ = ["ROLES", "backward", "forward", "forward_only", "tangent"]


def _gamma(cfg: GatedConfig, scale, ndim: int):
  """``scale`` (``(d,)`` or None) in the compute dtype in the grouped view, with leading size-1
  axes to its rank (its value is the scale's own: the casting modes form gamma in the scale's
  dtype, where ``scale`` already is)."""
  if scale is None:
    return None
  g = cfg.grouped(scale, cfg.compute_dtype)
  rank = ndim if g.ndim == 1 else ndim + 1
  return g.reshape((1,) * (rank - g.ndim) + g.shape)


def _gate(z):
  r"""``(silu(z), silu'(z))`` with :math:`\operatorname{silu}'(z) = s(1 + z(1 - s))`,
  :math:`s = \sigma(z)`."""
  s = jax.nn.sigmoid(z)
  return z * s, s * (1.0 + z * (1.0 - s))


def _group_mean(a):
  return jnp.mean(a, axis=-1, keepdims=True)


def _times(a, b):
  return a if b is None else a * b


def _affine(cfg: GatedConfig, uh, gamma):
  """``(u, p)`` in the compute dtype: ``u_hat`` as the affine stage reads it (rounded to A) and
  ``p = u * gamma`` (rounded to P); without a casting plan, ``(u_hat, u_hat * gamma)``."""
  if cfg.cast is None:
    return uh, _times(uh, gamma)
  return cfg.cast.affine_of(uh, gamma, None)


def _from_residuals(cfg: GatedConfig, x, z, scale, rstd):
  """What the tangent and the backward recompute from the residuals, in the grouped view and the
  compute dtype: ``(x, silu(z), silu'(z), r, u_hat, gamma)``, ``r`` broadcastable."""
  ct = cfg.compute_dtype
  xg, zg = cfg.grouped(x, ct), cfg.grouped(z, ct)
  g, dg = _gate(zg)
  r = rstd.astype(ct)
  r = r if x.shape[-1] == cfg.group_size else r[..., None]
  u = xg if cfg.norm_before_gate else xg * g
  return xg, g, dg, r, u * r, _gamma(cfg, scale, x.ndim)


def forward(cfg: GatedConfig, x, z, scale):
  """``(y, rstd)``: ``y`` in ``cfg.out_dtype``, ``rstd: (..., groups)`` in the compute dtype."""
  ct = cfg.compute_dtype
  xg, zg = cfg.grouped(x, ct), cfg.grouped(z, ct)
  g, _ = _gate(zg)
  u = xg if cfg.norm_before_gate else xg * g
  rstd = _math.rstd(_group_mean(jnp.square(u)), cfg.epsilon, False)
  _, y = _affine(cfg, u * rstd, _gamma(cfg, scale, x.ndim))
  if cfg.norm_before_gate:
    y = y * g
  rstd = rstd if x.shape[-1] == cfg.group_size else rstd[..., 0]
  return y.reshape(x.shape).astype(cfg.out_dtype), rstd


def forward_only(cfg: GatedConfig, x, z, scale):
  """``y`` alone (nothing kept)."""
  return forward(cfg, x, z, scale)[0]


def tangent(cfg: GatedConfig, x, z, scale, rstd, tx, tz, tscale):
  r""":math:`\dot y`, linear in the tangents (None ones are zero), in ``cfg.out_dtype``:
  :math:`\dot p\,g + p\,\dot g` gate last, :math:`\dot p` gate first, with
  :math:`\dot p = \gamma\,\dot{\hat u} + u\,\dot\gamma` (each rounding differentiated straight
  through, at the rounded values), :math:`\dot{\hat u} = r(\dot u - \hat u\,\overline{\hat u
  \dot u})`, :math:`\dot u = \dot x` (gate last) or :math:`\dot x g + x g' \dot z` (gate
  first)."""
  ct = cfg.compute_dtype
  xg, g, dg, r, uh, gamma = _from_residuals(cfg, x, z, scale, rstd)
  u, p = _affine(cfg, uh, gamma)
  txg, tzg = cfg.grouped(tx, ct), cfg.grouped(tz, ct)
  gate_after = g if cfg.norm_before_gate else None
  tgate = None if tzg is None else dg * tzg
  if cfg.norm_before_gate:
    tu = txg
  else:
    parts = [t for t in (None if txg is None else txg * g,
                         None if tgate is None else xg * tgate) if t is not None]
    tu = None if not parts else sum(parts[1:], parts[0])
  out = jnp.zeros(uh.shape, ct)
  if tu is not None:
    out = out + _times(_times(r * (tu - uh * _group_mean(uh * tu)), gamma), gate_after)
  if cfg.norm_before_gate and tgate is not None:
    out = out + p * tgate
  if tscale is not None:
    out = out + _times(u * _gamma(cfg, tscale, x.ndim), gate_after)
  return out.reshape(x.shape).astype(cfg.out_dtype)


def backward(cfg: GatedConfig, x, z, scale, rstd, dy):
  r"""The derived VJP, ``(dx, dz, dscale)``: ``dx``/``dz`` in ``x``'s/``z``'s dtypes, ``dscale``
  summed over the rows in the compute dtype (None without a scale). With
  :math:`a` the cotangent of :math:`\hat u` (:math:`\bar y \gamma g` gate last,
  :math:`\bar y \gamma` gate first) and :math:`\bar u = r(a - \hat u\,\overline{a \hat u})`:
  gate last, :math:`\bar x = \bar u`, :math:`\bar z = \bar y \gamma \hat u g'`,
  :math:`\bar\gamma = \Sigma\,\bar y \hat u g`; gate first, :math:`\bar x = \bar u g`,
  :math:`\bar z = \bar u x g'`, :math:`\bar\gamma = \Sigma\,\bar y \hat u`. Under a casting
  plan: :func:`_backward_cast`."""
  if cfg.cast is not None:
    return _backward_cast(cfg, x, z, scale, rstd, dy)
  xg, g, dg, r, uh, gamma = _from_residuals(cfg, x, z, scale, rstd)
  dyg = cfg.grouped(dy, cfg.compute_dtype)
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


def _backward_cast(cfg: GatedConfig, x, z, scale, rstd, dy):
  r""":func:`backward` under the casting plan ``cfg.cast``: each cast's transpose rounds the
  cotangent. The cotangent of :math:`p` (:math:`\bar y g` gate last, :math:`\bar y` gate first)
  is rounded to P (:math:`\bar p`), that of :math:`\hat u` is
  :math:`a = \mathrm{rd}_A(\mathrm{rd}_P(\bar p\,\gamma))`;
  :math:`\bar\gamma = \Sigma\,\bar p\,u` with :math:`u = \mathrm{rd}_A(\hat u)`, and gate last
  :math:`\bar z = \bar y\,p\,g'` at the rounded :math:`p`."""
  xg, g, dg, r, uh, gamma = _from_residuals(cfg, x, z, scale, rstd)
  u, p = _affine(cfg, uh, gamma)
  dyg = cfg.grouped(dy, cfg.compute_dtype)
  _, dp, a = cfg.cast.cotangents(dyg * g if cfg.norm_before_gate else dyg, gamma)
  du = r * (a - uh * _group_mean(a * uh))
  if cfg.norm_before_gate:
    dx, dz = du, dyg * p * dg
  else:
    dx, dz = du * g, du * xg * dg
  dscale = None
  if scale is not None:
    dscale = jnp.sum((dp * u).reshape(x.shape), axis=tuple(range(x.ndim - 1)))
  return dx.reshape(x.shape).astype(x.dtype), dz.reshape(z.shape).astype(z.dtype), dscale


ROLES = dict(forward_only=forward_only, forward=forward, backward=backward, tangent=tangent)
"""The op's roles in the XLA backend's table (``tangent``: what the differentiation rules'
tangent primitive evaluates, on this backend, the one every call can fall back to)."""
