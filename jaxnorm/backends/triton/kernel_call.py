"""Internal API: the kernels behind a primitive of their own, differentiable to any order.

A ``pallas_call`` has no derivative here, and none is needed for the first order: the kernels
*are* the derivative rules (:mod:`jaxnorm.ops.norm.rules`). But a program may differentiate them
again (the forward inside a second-order ``jax.jvp``, the backward inside a forward-over-reverse
Hessian-vector product), and with ``impl="auto"`` every program traces the GPU branch, even
on a CPU host where it is never compiled. A ``jax.custom_jvp`` wrapper would not do: partial
evaluation inlines a ``custom_jvp`` whose inputs are known, so after one linearization the
bare ``pallas_call`` is left. ``kernel_call_p`` is never inlined:

* value and lowering: ``fn`` on the kernels (``cfg.impl == "triton"``), lowered per platform:
  the Triton kernels for cuda/rocm (but for ``impl="auto"`` in a program ``jax.export``
  lowers, which takes the XLA path there too: the kernels' custom call is not
  export-stable); elsewhere the kernels in interpret mode, or the op's
  ``impl='pallas'`` error (raised where the program is lowered, so a program traced on a CPU
  host lowers for a GPU), or, in ``impl="auto"``'s GPU branch, the XLA path (a program lowered
  for several platforms lowers that branch for all of them);
* JVP: the value from the primitive again (so that a higher order meets this rule too), the
  tangent from ``jax.jvp`` of the same ``fn`` on the XLA path, which computes the same values;
* batching: a batch axis of any operand becomes a leading group axis of all of them, mapped
  with ``jax.vmap`` over the kernels (a ``pallas_call`` under ``vmap`` is one launch with one
  more grid axis).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxnorm import _jax_compat as jc
from jaxnorm import _validation as v
from jaxnorm.backends.triton.config import GPU_BACKENDS, kernel_problem
from jaxnorm.backends.triton.config import GPU_PLATFORMS as PLATFORMS
from jaxnorm._norm_config import NormConfig
from jaxnorm._rules import jvp_by_formula

__all__ = ["kernel_call"]

kernel_call_p = jc.Primitive("jaxnorm_kernels")
kernel_call_p.multiple_results = True


def _flat_fn(cfg: NormConfig, fn, tree, groups: int):
  """``fn(cfg, *args)`` on flat leaves, mapped over ``groups`` leading axes."""

  def f(*leaves):
    return jax.tree.leaves(fn(cfg, *jax.tree.unflatten(tree, leaves)))

  for _ in range(groups):
    f = jax.vmap(f)
  return f


def _run(*leaves, cfg, fn, tree, groups, elsewhere, for_export=False):
  """What the primitive lowers to for a GPU: ``fn`` on the kernels, on flat leaves; in
  ``impl="auto"``'s GPU branch (``elsewhere="xla"``) of a program ``jax.export`` lowers, the
  XLA path instead: the Triton kernels' custom call has no compatibility guarantee, so JAX
  refuses to serialize it, and ``auto`` exports wherever the XLA path does (a call that names
  ``impl="triton"`` exports its kernels, with the safety check disabled by the caller)."""
  if for_export and elsewhere == "xla":
    return _flat_fn(dataclasses.replace(cfg, impl="xla"), fn, tree, groups)(*leaves)
  return _flat_fn(cfg, fn, tree, groups)(*leaves)


def _run_elsewhere(*leaves, cfg, fn, tree, groups, elsewhere, platforms):
  """What the primitive lowers to for a platform the Triton kernels do not compile for.

  The kernels in interpret mode (``cfg.backend_config.interpret``); otherwise, for the GPU branch of
  ``impl="auto"`` (``elsewhere="xla"``: a program lowered for several platforms lowers every
  branch for every one of them, though each runs only where it belongs) the XLA path of the
  same function; for ``impl="pallas"`` (``elsewhere="raise"``) the op's own error, raised
  where the program is lowered, not from the tracing host's backend.
  """
  if cfg.backend_config.interpret:
    return _flat_fn(cfg, fn, tree, groups)(*leaves)
  if elsewhere == "xla":
    return _flat_fn(dataclasses.replace(cfg, impl="xla"), fn, tree, groups)(*leaves)
  other = next(p for p in platforms if p not in PLATFORMS)
  # The config does not carry the spelling the call used ("triton" or its alias "pallas"), so the
  # message names both.
  raise ValueError(v.backend_refusal("triton", kernel_problem(backend=other)).replace(
      "impl='triton'", "impl='triton' (alias 'pallas')", 1))


def _impl(*leaves, cfg, fn, tree, groups, elsewhere):
  """Eager evaluation: the primitive compiled on its own, like any jitted call (so that it
  meets the same per-platform lowering as in a jitted program); under ``jax.disable_jit`` the
  same choice, made for the default backend, runs op by op."""
  params = dict(cfg=cfg, fn=fn, tree=tree, groups=groups, elsewhere=elsewhere)
  if jax.config.jax_disable_jit:
    backend = jax.default_backend()
    if backend in GPU_BACKENDS:
      return _run(*leaves, **params)
    return _run_elsewhere(*leaves, platforms=(backend,), **params)
  return _compiled(cfg, fn, tree, groups, elsewhere)(*leaves)


@functools.lru_cache(maxsize=256)
def _compiled(cfg: NormConfig, fn, tree, groups: int, elsewhere: str):
  return jax.jit(functools.partial(kernel_call_p.bind, cfg=cfg, fn=fn, tree=tree, groups=groups,
                                   elsewhere=elsewhere))


@functools.lru_cache(maxsize=4096)
def _out_types(cfg: NormConfig, fn, tree, groups: int, in_types):
  """``(out_tree, [(shape, dtype), ...])`` of ``fn`` on the XLA path (the same function)."""
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in in_types]
  xla = dataclasses.replace(cfg, impl="xla")

  def f(*leaves):
    return fn(xla, *jax.tree.unflatten(tree, leaves))

  for _ in range(groups):
    f = jax.vmap(f)
  outs = jax.eval_shape(f, *structs)
  return jax.tree.structure(outs), tuple((o.shape, o.dtype) for o in jax.tree.leaves(outs))


def _abstract_eval(*avals, cfg, fn, tree, groups, elsewhere):
  del elsewhere
  in_types = tuple((tuple(a.shape), a.dtype) for a in avals)
  _, outs = _out_types(cfg, fn, tree, groups, in_types)
  axes = frozenset().union(*(jc.aval_varying_axes(a) for a in avals))
  base = max(avals, key=lambda a: len(a.shape))  # carries the trace's mesh, if any
  return [jc.with_varying_axes(base.update(shape=shape, dtype=dtype, weak_type=False), axes)
          for shape, dtype in outs]


def _jvp(primals, tangents, *, cfg, fn, tree, groups, elsewhere):
  """The value from the primitive again, the tangent by autodiff of ``fn`` on the XLA path (the
  rule factory's :func:`jaxnorm._rules.jvp_by_formula`)."""
  params = dict(cfg=cfg, fn=fn, tree=tree, groups=groups, elsewhere=elsewhere)
  xla = _flat_fn(dataclasses.replace(cfg, impl="xla"), fn, tree, groups)
  return jvp_by_formula(kernel_call_p, primals, tangents, params, xla)


def _batch(args, dims, *, vmap_axis_name, vmap_axis_size, cfg, fn, tree, groups, elsewhere):
  del vmap_axis_name, vmap_axis_size  # the kernels take no axis_name
  params = dict(cfg=cfg, fn=fn, tree=tree, elsewhere=elsewhere)
  if all(dm is None for dm in dims):  # nothing batched here (e.g. only a closed-over value)
    out = kernel_call_p.bind(*args, groups=groups, **params)
    return out, [None] * len(out)
  size = next(a.shape[dm] for a, dm in zip(args, dims) if dm is not None)
  new = [jnp.broadcast_to(a, (size,) + a.shape) if dm is None else jnp.moveaxis(a, dm, 0)
         for a, dm in zip(args, dims)]
  out = kernel_call_p.bind(*new, groups=groups + 1, **params)
  return out, [0] * len(out)


kernel_call_p.def_impl(_impl)
kernel_call_p.def_abstract_eval(_abstract_eval)
for _platform in PLATFORMS:
  jc.register_lowering(kernel_call_p, _run, platform=_platform, with_export=True)
jc.register_lowering(kernel_call_p, _run_elsewhere, with_platforms=True)
jc.register_jvp(kernel_call_p, _jvp)
jc.register_batching(kernel_call_p, _batch)


def kernel_call(cfg: NormConfig, fn, *args, elsewhere: str = "raise"):
  """``fn(cfg, *args)`` on the kernels (``cfg.impl == "triton"``), behind ``kernel_call_p``.

  ``fn`` takes the config first and is hashable (it is a primitive parameter): the dispatcher
  passes one entry of the backends' tables (:class:`jaxnorm.backends.interface.Entry`, a frozen
  dataclass that runs ``cfg.impl``'s function, XLA's where this module swaps in
  ``impl="xla"``); ``args`` may hold None. The Triton backend's ``launch``. ``elsewhere``: what
  lowering for a platform the kernels do not compile for gives (interpret mode aside): "raise"
  (``impl="pallas"``) or "xla" (the GPU branch of ``impl="auto"``). Returns what ``fn`` returns.
  """
  leaves, tree = jax.tree.flatten(args)
  # The result's structure from the XLA path (the same function; tracing the kernels for it
  # would build a pallas_call, which shard_map refuses to type without the kernels' vma).
  in_types = tuple((tuple(jnp.shape(a)), jnp.result_type(a)) for a in leaves)
  out_tree, _ = _out_types(cfg, fn, tree, 0, in_types)
  out = kernel_call_p.bind(*leaves, cfg=cfg, fn=fn, tree=tree, groups=0, elsewhere=elsewhere)
  return jax.tree.unflatten(out_tree, out)
