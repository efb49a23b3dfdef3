r"""The one differentiation layer: each public op is one ``jax.custom_jvp`` over a linear primitive.

Reverse mode *is* the derived custom VJP. Each op is a ``jax.custom_jvp`` function (``jax.jvp``
needs one: JAX refuses forward mode through a ``jax.custom_vjp``) whose JVP rule returns the
primal from the forward that keeps the statistics (:func:`jaxnorm._backends.forward`, on the
call's backend) and the tangent from ``norm_tangent_p``, a primitive that is *linear* in the
tangents and whose transpose rule is the hand-derived backward
(:func:`jaxnorm._backends.backward` / :func:`jaxnorm._backends.add_backward`, the Pallas
backward kernels included). ``jax.grad`` linearizes the JVP rule (the forward runs once, its
residuals ``x, scale, mask, stats`` are kept) and transposes the primitive: exactly the pair
``jax.custom_vjp(fwd, bwd)`` with ``fwd`` = :func:`jaxnorm._backends.forward` and ``bwd`` =
:func:`jaxnorm._backends.backward`, which ``tests/test_one_ad_layer.py`` builds and compares
bitwise, program included. An undifferentiated call runs :func:`jaxnorm._backends.forward_only`
(one pass, nothing kept).

The tangent (derived in ``docs/derivations.md``, "Forward mode"), per row, with
:math:`\dot x_c = \dot x - m\text{-mean}(\dot x)` (LayerNorm; :math:`\dot x_c = \dot x` for
RMSNorm), :math:`\overline{\,\cdot\,}` the masked mean, psum'd over ``axis_name``:

.. math::

   \dot y = \gamma \odot r\big(\dot x_c - c\, \hat x\, \overline{\hat x \dot x}\big)
            + \hat x \odot \dot s + \dot\beta,

with :math:`c` the variance-path factor (1 "inside"); for the fused op
:math:`\dot h = \dot x + \alpha \dot r` and :math:`\dot y` the same map at ``h`` applied to
:math:`\dot h`. The tangent is computed by XLA ops on every path.

The primitive has every rule JAX asks of one (registered through :mod:`jaxnorm._jax_compat`):
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

import jax
import jax.numpy as jnp

from jaxnorm import _backends
from jaxnorm import _jax_compat as jc
from jaxnorm import _math
from jaxnorm import _xla
from jaxnorm._memory_efficient import kept, recovered
from jaxnorm._wide import wide_jvp, wide_tangent
from jaxnorm._remat import name_residuals
from jaxnorm._norm_config import NormConfig

__all__ = ["add_norm", "apply", "norm_tangent_p"]

# Operand names of the primitive. Residuals first (``x`` is the normalized input: ``h`` for
# the fused op), then the tangents it is linear in. Absent ones (no scale, no mask, RMSNorm's
# shift/delta, a symbolic-zero tangent) are left out; ``operand_names`` lists the present ones in
# order. ``y`` and ``bias`` stand in for ``x``, ``shift`` and ``delta`` with memory_efficient.
_RESIDUALS = ("x", "y", "scale", "bias", "mask", "shift", "delta", "rstd")
_TANGENTS = ("tx", "tr", "tscale", "tbias")
_PARAMS = frozenset({"scale", "bias", "tscale", "tbias"})  # shape (groups..., d)


def _named(operand_names, args) -> dict:
  named = dict.fromkeys(_RESIDUALS + _TANGENTS)
  named.update(zip(operand_names, args))
  return named


def _pack(**named):
  """``(operand_names, args)`` for the primitive from keyword operands; None ones are left out."""
  operand_names = tuple(k for k in _RESIDUALS + _TANGENTS if named.get(k) is not None)
  return operand_names, [named[k] for k in operand_names]


def _wide_backward(cfg: NormConfig, fn, xla_fn):
  """The derived backward ``fn(x, scale, mask, stats, *cotangents)`` (on the call's backend),
  with a JVP (second order) that :func:`jaxnorm._wide.wide_tangent` takes of the same backward
  in XLA ops, ``xla_fn`` (:func:`jaxnorm._backends.formula`'s), with the statistics recomputed
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
    fresh_stats = _xla.statistics(cfg, x, stats_mask)
    kept = tuple(None if a is None else b for a, b in zip(stats, fresh_stats))
    c = (_math.variance_path_factor_of_std(_xla.row_std(cfg, x, mask, fresh_stats),
                                           cfg.epsilon) if outside else None)
    return xla_fn(x, scale, mask, kept, *cts, c=c)

  def tangent_fn(x, scale, mask, stats, *cts):
    # Differentiated in x, scale and the cotangents; the mask is fixed, the statistics' incoming
    # tangents are not read (recomputed inside).
    return lambda x, scale, mask_, stats_, *cts: of_x(x, scale, mask, stats, *cts)

  return wide_jvp(fn, tangent_fn)


def _over_groups(fn, groups: int, names: tuple = ()):
  """``fn`` mapped over ``groups`` leading axes of every argument and result (``jax.vmap``).

  ``names``: the ``jax.vmap`` axis name of each group axis (axis 0 first; None: unnamed, and
  absent names are None). A named group is a ``jax.vmap`` axis that ``cfg.axis_name`` names:
  the collectives inside ``fn`` then sum over that group, as they did over the user's axis.
  """
  names = tuple(names) + (None,) * (groups - len(names))
  for name in reversed(names):  # the last wrap is the outermost: group axis 0
    fn = jax.vmap(fn, axis_name=name)
  return fn


# ---------------------------------------------------------------------------------------------
# The tangent formula (XLA ops: :func:`jaxnorm._xla.tangent`).


def _formula_one(*args, cfg: NormConfig, operand_names):
  """One group's value: ``[dot y]`` (plain op) or ``[dot y, dot h]`` (fused op)."""
  a = recovered(cfg, _named(operand_names, args))
  stats = (a["shift"], a["delta"], a["rstd"])
  if not cfg.has_add:
    return [_xla.tangent(cfg, a["x"], a["scale"], a["mask"], stats, a["tx"], a["tscale"],
                         a["tbias"])]
  h = a["x"]
  th = None
  if a["tx"] is not None or a["tr"] is not None:
    ct = _xla.compute_dtype(h.dtype)
    th = jnp.zeros(h.shape, ct)
    if a["tx"] is not None:
      th = th + a["tx"].astype(ct)
    if a["tr"] is not None:
      th = th + cfg.residual_scale * a["tr"].astype(ct)
  ty = _xla.tangent(cfg, h, a["scale"], a["mask"], stats, th, a["tscale"], a["tbias"])
  th = jnp.zeros(h.shape, cfg.h_dtype) if th is None else th.astype(cfg.h_dtype)
  return [ty, th]


def _formula(*args, cfg, operand_names, groups, group_names=()):
  return _over_groups(functools.partial(_formula_one, cfg=cfg, operand_names=operand_names), groups,
                      group_names)(*args)


# ---------------------------------------------------------------------------------------------
# The primitive and its rules.

norm_tangent_p = jc.Primitive("jaxnorm_norm_tangent")
norm_tangent_p.multiple_results = True
norm_tangent_p.def_impl(_formula)
jc.register_lowering(norm_tangent_p, _formula)


def _abstract_eval(*avals, cfg, operand_names, groups, group_names=()):
  """Outputs shaped like ``x``, varying over the union of every operand's mesh axes."""
  del groups, group_names
  axes = frozenset().union(*(jc.aval_varying_axes(av) for av in avals))
  named = _named(operand_names, avals)
  base = jc.with_varying_axes(named["x"] if named["x"] is not None else named["y"], axes)
  dtypes = [cfg.out_dtype] + ([cfg.h_dtype] if cfg.has_add else [])
  return [base.update(dtype=dt, weak_type=False) for dt in dtypes]


norm_tangent_p.def_abstract_eval(_abstract_eval)


def _cotangents_one(x, scale, mask, shift, delta, rstd, dy, dh, *, cfg: NormConfig, operand_names,
                    dx_dtype=None):
  """One group's derived VJP: a dict of the tangent operands' cotangents (``dx`` in
  ``dx_dtype``, None: ``x``'s)."""
  stats = (shift, delta, rstd)
  if not cfg.has_add:
    kw = {} if dx_dtype is None else {"dx_dtype": dx_dtype}
    dx, dscale, dbias = _wide_backward(cfg, functools.partial(_backends.backward, cfg, **kw),
                                       functools.partial(_backends.formula(cfg, "backward"),
                                                         **kw))(
        x, scale, mask, stats, dy)
    return dict(zip(("tx", "tscale", "tbias"),
                    (dx, *_backends.param_cotangents(cfg, scale, dscale, dbias))))
  return dict(zip(("tx", "tr", "tscale", "tbias"),
                  _wide_backward(cfg, functools.partial(_backends.add_backward, cfg),
                                 _backends.formula(cfg, "add_backward"))(
                      x, scale, mask, stats, dy, dh)))


def _transpose(cts, *args, cfg: NormConfig, operand_names, groups, group_names=()):
  """The hand-derived VJP (:func:`jaxnorm._backends.backward`, fused: ``add_backward``)."""
  a = _named(operand_names, args)
  for k in _RESIDUALS:
    if jc.is_undefined_primal(a[k]):
      raise ValueError(f"jaxnorm's tangent map is linear in the tangents only, not in {k!r}.")
  if all(isinstance(ct, jc.Zero) for ct in cts):
    return [None] * len(args)
  if "tbias" not in operand_names and cfg.bias_dtype is not None:
    cfg = _replace_bias(cfg)  # no dbias wanted
  # With memory_efficient, x is recovered from y in x's compute dtype: dx is cast to tx's dtype.
  dx_dtype = None if a["x"] is not None or a["tx"] is None else a["tx"].aval.dtype
  a = recovered(cfg, a)
  x = a["x"]
  dy = cts[0]
  dy = jnp.zeros(x.shape, cfg.out_dtype) if isinstance(dy, jc.Zero) else dy
  dh = None if not cfg.has_add or isinstance(cts[1], jc.Zero) else cts[1]  # h unused: skipped
  body = functools.partial(_cotangents_one, cfg=cfg, operand_names=operand_names,
                           dx_dtype=dx_dtype)
  d = _over_groups(body, groups, group_names)(x, a["scale"], a["mask"], a["shift"], a["delta"],
                                              a["rstd"], dy, dh)
  return [d.get(k) if k in _TANGENTS else None for k in operand_names]


def _replace_bias(cfg: NormConfig) -> NormConfig:
  return dataclasses.replace(cfg, bias_dtype=None, bias_shape=None)


jc.register_transpose(norm_tangent_p, _transpose)


def _jvp(primals, tangents, *, cfg, operand_names, groups, group_names=()):
  """Second order: the primitive again for the value, autodiff of the formula for the tangent."""
  live = [i for i, t in enumerate(tangents) if not isinstance(t, jc.Zero)]

  def f(*vals):
    args = list(primals)
    for i, val in zip(live, vals):
      args[i] = val
    return _formula(*args, cfg=cfg, operand_names=operand_names, groups=groups,
                    group_names=group_names)

  out = norm_tangent_p.bind(*primals, cfg=cfg, operand_names=operand_names, groups=groups,
                            group_names=group_names)
  return out, wide_tangent(f, [primals[i] for i in live], [tangents[i] for i in live], out)


jc.register_jvp(norm_tangent_p, _jvp)


def _batch(args, dims, *, vmap_axis_name, vmap_axis_size, cfg, operand_names, groups,
           group_names=()):
  """Batching that keeps the primitive (and so the derived transpose) for every operand.

  No parameter batched: the batch axis of the row-like operands is more rows, placed right
  after the ``groups`` leading group axes. A parameter batched, or a ``jax.vmap`` axis that
  ``cfg.axis_name`` names (the normalized features split over the vmap axis, as over a mesh
  axis in ``shard_map``): the batch axis becomes a new leading group axis of every operand
  (unbatched ones are broadcast along it; all of them when none is mapped over a named axis:
  every slice then holds the same values, as JAX's ``psum`` of an unmapped value assumes),
  named after the vmap axis in the second case, so that the rules' collectives over
  ``axis_name`` sum over it.
  """
  names = cfg.axis_name if isinstance(cfg.axis_name, tuple) else (cfg.axis_name,)
  split = vmap_axis_name is not None and vmap_axis_name in names
  if all(dm is None for dm in dims) and not split:  # nothing batched here
    out = norm_tangent_p.bind(*args, cfg=cfg, operand_names=operand_names, groups=groups,
                              group_names=group_names)
    return out, [None] * len(out)
  size = next((a.shape[dm] for a, dm in zip(args, dims) if dm is not None), vmap_axis_size)
  if not split and not any(dm is not None for k, dm in zip(operand_names, dims) if k in _PARAMS):
    new = []
    for k, a, dm in zip(operand_names, args, dims):
      if k not in _PARAMS:
        if dm is None:
          a = jnp.broadcast_to(jnp.expand_dims(a, groups),
                               a.shape[:groups] + (size,) + a.shape[groups:])
        else:
          a = jnp.moveaxis(a, dm, groups)
      new.append(a)
    out = norm_tangent_p.bind(*new, cfg=cfg, operand_names=operand_names, groups=groups,
                              group_names=group_names)
    return out, [groups] * len(out)
  new = [jnp.broadcast_to(a, (size,) + a.shape) if dm is None else jnp.moveaxis(a, dm, 0)
         for a, dm in zip(args, dims)]
  inner = tuple(group_names) + (None,) * (groups - len(group_names))
  out = norm_tangent_p.bind(*new, cfg=cfg, operand_names=operand_names, groups=groups + 1,
                            group_names=((vmap_axis_name if split else None),) + inner)
  return out, [0] * len(out)


jc.register_batching(norm_tangent_p, _batch)


# ---------------------------------------------------------------------------------------------
# The custom_jvp ops.


def _live(tangents):
  return tuple(None if jc.is_symbolic_zero(t) else t for t in tangents)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _norm(cfg: NormConfig, x, scale, bias, mask):
  return _backends.forward_only(cfg, x, scale, bias, mask)


def _norm_jvp(cfg: NormConfig, primals, tangents):
  x, scale, bias, mask = primals
  tx, tscale, tbias, _ = _live(tangents)
  y, stats = wide_jvp(functools.partial(_backends.forward, cfg))(x, scale, bias, mask)
  if tx is None and tscale is None and tbias is None:
    return y, jnp.zeros(y.shape, y.dtype)
  # What reverse mode saves (x and the statistics, or y and rstd), tagged with the remat names.
  residuals, y = kept(cfg, x, y, bias, stats)
  operand_names, args = _pack(**residuals, scale=scale, mask=mask, tx=tx, tscale=tscale,
                              tbias=tbias)
  (ty,) = norm_tangent_p.bind(*args, cfg=cfg, operand_names=operand_names, groups=0)
  return y, ty


_norm.defjvp(_norm_jvp, symbolic_zeros=True)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _add_norm(cfg: NormConfig, x, residual, scale, bias, mask):
  return _backends.add_forward_only(cfg, x, residual, scale, bias, mask)


def _add_norm_jvp(cfg: NormConfig, primals, tangents):
  x, residual, scale, bias, mask = primals
  tx, tr, tscale, tbias, _ = _live(tangents)
  y, h, stats = wide_jvp(functools.partial(_backends.add_forward, cfg))(
      x, residual, scale, bias, mask)
  if tx is None and tr is None and tscale is None and tbias is None:
    return (y, h), (jnp.zeros(y.shape, y.dtype), jnp.zeros(h.shape, h.dtype))
  h_saved, stats = name_residuals(h, stats)  # what reverse mode saves carries the remat names
  operand_names, args = _pack(x=h_saved, scale=scale, mask=mask, shift=stats[0], delta=stats[1],
                     rstd=stats[2], tx=tx, tr=tr, tscale=tscale, tbias=tbias)
  ty, th = norm_tangent_p.bind(*args, cfg=cfg, operand_names=operand_names, groups=0)
  return (y, h), (ty, th)


_add_norm.defjvp(_add_norm_jvp, symbolic_zeros=True)


def apply(cfg: NormConfig, x2, scale, bias, mask2):
  r"""The plain op on prepared arguments, differentiable in both modes.

  .. math::

     y = \gamma \odot \hat x + \beta, \qquad
     \dot y = \gamma \odot r\big(\dot x_c - c\,\hat x\,\overline{\hat x \dot x}\big)
              + \hat x \odot \dot s + \dot\beta

  (see the module docstring); reverse mode transposes :math:`\dot y` into the derived VJP.
  """
  return _norm(cfg, x2, scale, bias, mask2)


def add_norm(cfg: NormConfig, x2, r2, scale, bias, mask2):
  r"""The fused op on prepared arguments, ``(y, h)``, differentiable in both modes.

  .. math::

     \dot h = \dot x + \alpha\,\dot r, \qquad \dot y = \dot{\mathrm{Norm}}(h)[\dot h, \dot s,
     \dot\beta]

  (the plain op's tangent at ``h``); reverse mode transposes it into the fused backward.
  """
  return _add_norm(cfg, x2, r2, scale, bias, mask2)
