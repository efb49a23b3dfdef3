r"""Internal API: the one factory of derived rules, shared by every op family.

An op with hand-derived rules is a ``jax.custom_jvp`` whose tangent is a *tangent primitive*:
a primitive linear in the tangent operands, whose transpose rule is the derived backward. So
``jax.jvp`` runs the derived tangent, ``jax.grad`` linearizes the JVP rule (the forward runs once,
its residuals are kept) and transposes the primitive into the derived VJP, and both
differentiate again. A family (the norms of :mod:`jaxnorm.ops.norm.rules`, the pointwise ops of
:mod:`jaxnorm.ops.pointwise.rules`, gated RMSNorm of :mod:`jaxnorm.ops.gated.rules`) declares only
its math, as a
:class:`Family`:

* the names of the primitive's operands: ``residuals`` (what reverse mode keeps) then
  ``tangents`` (what the map is linear in), with ``params`` those shaped like a parameter;
* ``formula``: the tangent of one group, from the named operands (XLA ops);
* ``backward``: the derived VJP of one group, a cotangent per tangent operand;
* ``out_types``: the outputs' shapes and dtypes;
* how batching may add rows (``rows_batch``), which ``jax.vmap`` axes split the features
  (``split_axes``) and how the tangent of the tangent is taken (``second_order``).

:class:`TangentRule` builds from it everything JAX asks of the primitive (value and lowering
from the formula, abstract evaluation varying over the union of the operands' mesh axes,
transposition by the backward with each cotangent summed over the mesh axes its operand is
replicated on, a JVP of its own, batching that keeps the derived rules for batched parameters)
and the ``custom_jvp`` op (:meth:`TangentRule.op`), whose residuals it tags with the remat names
the family declares. :func:`jvp_by_formula` is the rule shared by every primitive whose
derivative is autodiff of an XLA formula of the same value (the tangent primitives' own JVP,
the kernel-call primitive's).

Batching (``groups``): a batch axis of the row-like operands only is more rows
(``rows_batch``); a batch axis of a parameter, or a ``jax.vmap`` axis the call's
``axis_name`` names, becomes a *group* axis: a static count of leading axes along which every
operand has its own values, over which the formula and the backward are mapped with
``jax.vmap`` (named after the vmap axis in the second case, so that the rules' collectives sum
over it). The transpose is still the derived backward, never autodiff of the formula.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from jaxnorm import _jax_compat as jc

__all__ = ["Family", "TangentRule", "jvp_by_formula", "over_groups", "plain_tangent", "rows_of"]


def plain_tangent(fn, primals, tangents, out):
  """The tangent of ``fn`` at ``primals`` along ``tangents`` (``jax.jvp``), in ``out``'s shapes
  and dtypes."""
  _, t = jax.jvp(fn, primals, tangents)
  return jax.tree_util.tree_map(lambda t, o: t.reshape(o.shape).astype(o.dtype), t, out)


def jvp_by_formula(prim, primals, tangents, params: dict, formula, tangent=plain_tangent):
  """A primitive's JVP rule: the value from ``prim`` again (so a higher order meets this rule
  too), the tangent from ``tangent`` (:func:`plain_tangent` or
  :func:`jaxnorm._wide.wide_tangent`) of ``formula(*args)``, a function of the same value in
  differentiable ops, along the non-zero tangents."""
  out = prim.bind(*primals, **params)
  live = [i for i, t in enumerate(tangents) if not isinstance(t, jc.Zero)]

  def f(*vals):
    args = list(primals)
    for i, val in zip(live, vals):
      args[i] = val
    return formula(*args)

  return out, tangent(f, [primals[i] for i in live], [tangents[i] for i in live], out)


def over_groups(fn, groups: int, names: tuple = ()):
  """``fn`` mapped over ``groups`` leading axes of every argument and result (``jax.vmap``).

  ``names``: the ``jax.vmap`` axis name of each group axis (axis 0 first; None or absent:
  unnamed). A named group is a ``jax.vmap`` axis that the call's ``axis_name`` names: the
  collectives inside ``fn`` then sum over that group, as they did over the user's axis.
  """
  names = tuple(names) + (None,) * (groups - len(names))
  for name in reversed(names):  # the last wrap is the outermost: group axis 0
    fn = jax.vmap(fn, axis_name=name)
  return fn


def rows_of(params: frozenset):
  """A :attr:`Family.rows_batch` for families whose row-like operands (every operand not in
  ``params``) share their leading axes: with no parameter batched, the batch axis of the
  row-like operands is more rows, placed right after the ``groups`` leading group axes
  (unbatched ones are broadcast); with a parameter batched, None (a group axis)."""

  def rows_batch(operand_names, args, dims, groups: int, size: int):
    if any(dm is not None for k, dm in zip(operand_names, dims) if k in params):
      return None
    new = []
    for k, a, dm in zip(operand_names, args, dims):
      if k not in params:
        if dm is None:
          a = jnp.broadcast_to(jnp.expand_dims(a, groups),
                               a.shape[:groups] + (size,) + a.shape[groups:])
        else:
          a = jnp.moveaxis(a, dm, groups)
      new.append(a)
    return new, groups

  return rows_batch


def _no_split(cfg) -> tuple:
  del cfg
  return ()


@dataclasses.dataclass(frozen=True)
class Family:
  """What a family declares; :class:`TangentRule` builds the rest.

  Attributes:
    name: the primitive is ``jaxnorm_<name>_tangent``.
    residuals: operand names reverse mode keeps, in operand order (absent ones are left out).
    tangents: operand names the map is linear in, after the residuals.
    params: the operands shaped like a parameter (a batch axis of one is a group axis).
    formula: ``(cfg, a) -> [outputs]``: one group's tangent, ``a`` every operand name mapped to
      its value or None.
    backward: ``(cfg, a, cts, wanted) -> {tangent name: cotangent}``: one group's derived VJP;
      ``cts`` the outputs' cotangents (None for a zero), ``wanted`` the present tangent
      operands' ``(shape, dtype)`` within one group (static).
    out_types: ``(cfg, a) -> [(shape, dtype)]``: the outputs, ``a`` the named avals (whole
      arrays, group axes included).
    rows_batch: ``(operand_names, args, dims, groups, size) -> (args, out_dim)`` where a batch
      axis can be absorbed without a group axis, else None; None: never.
    split_axes: ``cfg -> names``: the ``jax.vmap`` axis names that split the features (a group
      axis named after them).
    second_order: the tangent of the formula in the primitive's own JVP
      (:func:`plain_tangent` or :func:`jaxnorm._wide.wide_tangent`).
    remat_names: ``(operand, name)`` pairs: the residuals :meth:`TangentRule.op` tags with
      ``jax.ad_checkpoint.checkpoint_name`` (the public names of :mod:`jaxnorm._remat`), so that
      a ``jax.checkpoint`` policy can save or recompute them by name.
    output_residual: a residual that is the op's (single) output where present (e.g. ``y``,
      kept by a memory-saving backward): the op returns the tagged array, one buffer for both.
  """

  name: str
  residuals: tuple[str, ...]
  tangents: tuple[str, ...]
  params: frozenset
  formula: Callable
  backward: Callable
  out_types: Callable
  rows_batch: Callable | None = None
  split_axes: Callable = _no_split
  second_order: Callable = plain_tangent
  remat_names: tuple = ()
  output_residual: str | None = None

  @property
  def operands(self) -> tuple[str, ...]:
    return self.residuals + self.tangents


def _aval(a):
  return a.aval if jc.is_undefined_primal(a) else jax.typeof(a)


class TangentRule:
  """The tangent primitive of a :class:`Family`, its rules, and its ``custom_jvp`` ops.

  The primitive's parameters: ``cfg`` (the family's static config), ``operand_names`` (the
  present operands, in :attr:`Family.operands` order), ``groups`` and ``group_names``.
  """

  def __init__(self, family: Family):
    self.family = family
    p = jc.Primitive(f"jaxnorm_{family.name}_tangent")
    p.multiple_results = True
    p.def_impl(self._formula)
    p.def_abstract_eval(self._abstract_eval)
    jc.register_lowering(p, self._formula)
    jc.register_transpose(p, self._transpose)
    jc.register_jvp(p, self._jvp)
    jc.register_batching(p, self._batch)
    self.primitive = p

  # -- operands -------------------------------------------------------------------------------

  def named(self, operand_names, args) -> dict:
    """Every operand name of the family mapped to its value in ``args``, or None."""
    named = dict.fromkeys(self.family.operands)
    named.update(zip(operand_names, args))
    return named

  def bind(self, cfg, **named) -> list:
    """The primitive on keyword operands (None ones left out), ungrouped: its outputs."""
    names = tuple(k for k in self.family.operands if named.get(k) is not None)
    return self.primitive.bind(*(named[k] for k in names), cfg=cfg, operand_names=names,
                               groups=0, group_names=())

  # -- rules ----------------------------------------------------------------------------------

  def _formula(self, *args, cfg, operand_names, groups, group_names=()):
    def one(*args):
      return self.family.formula(cfg, self.named(operand_names, args))

    return over_groups(one, groups, group_names)(*args)

  def _abstract_eval(self, *avals, cfg, operand_names, groups, group_names=()):
    del groups, group_names
    axes = frozenset().union(*(jc.aval_varying_axes(av) for av in avals))
    base = avals[0]
    return [jc.with_varying_axes(base.update(shape=shape, dtype=dtype, weak_type=False), axes)
            for shape, dtype in self.family.out_types(cfg, self.named(operand_names, avals))]

  def _transpose(self, cts, *args, cfg, operand_names, groups, group_names=()):
    a = self.named(operand_names, args)
    for k in self.family.residuals:
      if a[k] is not None and jc.is_undefined_primal(a[k]):
        raise ValueError(f"jaxnorm's {self.family.name} tangent map is linear in the tangents "
                         f"only, not in {k!r}.")
    if all(isinstance(ct, jc.Zero) for ct in cts):
      return [None] * len(args)
    cts = [None if isinstance(ct, jc.Zero) else ct for ct in cts]
    wanted = {}
    for k in self.family.tangents:
      if a[k] is not None:
        av = _aval(a[k])
        wanted[k] = (tuple(av.shape[groups:]), av.dtype)
    residuals = [a[k] for k in self.family.residuals]

    def one(residuals, cts):
      named = dict(zip(self.family.residuals, residuals))
      return self.family.backward(cfg, named, cts, wanted)

    d = over_groups(one, groups, group_names)(residuals, cts)
    out = []
    for k in operand_names:
      c = d.get(k) if k in wanted else None
      if c is not None:  # summed over the mesh axes its operand is replicated on
        extra = jc.varying_axes(c) - jc.aval_varying_axes(_aval(a[k]))
        if extra:
          c = lax.psum(c, tuple(sorted(extra, key=str)))
      out.append(c)
    return out

  def _jvp(self, primals, tangents, *, cfg, operand_names, groups, group_names=()):
    params = dict(cfg=cfg, operand_names=operand_names, groups=groups, group_names=group_names)
    return jvp_by_formula(self.primitive, primals, tangents, params,
                          functools.partial(self._formula, **params),
                          self.family.second_order)

  def _batch(self, args, dims, *, vmap_axis_name, vmap_axis_size, cfg, operand_names, groups,
             group_names=()):
    bind = functools.partial(self.primitive.bind, cfg=cfg, operand_names=operand_names)
    split = vmap_axis_name is not None and vmap_axis_name in self.family.split_axes(cfg)
    if all(dm is None for dm in dims) and not split:  # nothing batched here
      out = bind(*args, groups=groups, group_names=group_names)
      return out, [None] * len(out)
    size = next((a.shape[dm] for a, dm in zip(args, dims) if dm is not None), vmap_axis_size)
    rows = None
    if not split and self.family.rows_batch is not None:
      rows = self.family.rows_batch(operand_names, args, dims, groups, size)
    if rows is not None:
      new, out_dim = rows
      out = bind(*new, groups=groups, group_names=group_names)
      return out, [out_dim] * len(out)
    new = [jnp.broadcast_to(a, (size,) + a.shape) if dm is None else jnp.moveaxis(a, dm, 0)
           for a, dm in zip(args, dims)]
    inner = tuple(group_names) + (None,) * (groups - len(group_names))
    out = bind(*new, groups=groups + 1,
               group_names=((vmap_axis_name if split else None),) + inner)
    return out, [0] * len(out)

  # -- the custom_jvp op ----------------------------------------------------------------------

  def op(self, value: Callable, forward: Callable, tangent_names: tuple, name: str):
    """The ``custom_jvp`` op ``f(cfg, *primals)``.

    ``value(cfg, *primals)``: the undifferentiated value (nothing kept). ``forward(cfg,
    *primals) -> (out, residuals)``: the value (an array or a tuple) and the residual operands
    by name, the parameters the rule reads included; those :attr:`Family.remat_names` names are
    tagged here.
    ``tangent_names``: per primal, the tangent operand its tangent becomes (None: not
    differentiated, e.g. a mask). A call with no live tangent returns zero tangents. ``name``:
    the ``custom_jvp``'s name in a jaxpr (``custom_jvp_call[name=...]``).
    """
    def named_value(cfg, *primals):
      return value(cfg, *primals)

    named_value.__name__ = named_value.__qualname__ = name
    f = jax.custom_jvp(named_value, nondiff_argnums=(0,))

    tags = dict(self.family.remat_names)
    kept_out = self.family.output_residual

    def rule(cfg, primals, tangents):
      out, residuals = forward(cfg, *primals)
      residuals = {k: a if a is None or k not in tags else checkpoint_name(a, tags[k])
                   for k, a in residuals.items()}
      if kept_out is not None and residuals.get(kept_out) is not None:
        out = residuals[kept_out]
      live = {n: t for n, t in zip(tangent_names, tangents)
              if n is not None and t is not None and not jc.is_symbolic_zero(t)}
      single = not isinstance(out, tuple)
      outs = (out,) if single else out
      if not live:
        zeros = tuple(jnp.zeros(o.shape, o.dtype) for o in outs)
        return out, zeros[0] if single else zeros
      t = self.bind(cfg, **residuals, **live)
      return out, t[0] if single else tuple(t)

    f.defjvp(rule, symbolic_zeros=True)
    return f
