"""Internal API: the primitive a kernel backend runs its kernels behind, written once.

Both kernel backends (:mod:`jaxnorm.backends.triton.kernel_call`,
:mod:`jaxnorm.backends.tpu.tpu_call`) run ``fn(cfg, *args)`` behind a primitive of their own
(the Triton module says why a primitive and not a ``custom_jvp``). What is the same for both is
here, as :class:`KernelPrimitive`; a backend subclasses it and says only how its kernels lower:

* :meth:`KernelPrimitive.run`: the lowering for the backend's own platforms (default: ``fn`` on
  the kernels);
* :meth:`KernelPrimitive.interpreted`: the kernels in interpret mode, where the config asks for
  it on another platform (default: ``fn`` on the kernels, traced in place);
* :meth:`KernelPrimitive.refusal_elsewhere`: the ``ValueError`` message where the program is
  lowered for a platform the kernels do not compile for and the call named the backend.

The rest is shared: eager evaluation (the primitive compiled on its own; under
``jax.disable_jit`` the lowering chosen for the default backend, op by op), abstract evaluation
(the XLA path's result types, varying over the union of the operands' mesh axes), the JVP (the
value from the primitive again, the tangent by autodiff of ``fn`` on the XLA path:
:func:`jaxnorm._rules.jvp_by_formula`), batching (a batch axis of any operand becomes a leading
group axis of all of them, mapped with ``jax.vmap`` over the kernels: one more grid axis of the
``pallas_call``) and the call (:meth:`KernelPrimitive.call`). The XLA path of the same function
is ``fn`` with ``cfg.impl`` swapped to ``"xla"`` (:class:`jaxnorm.backends.interface.Entry`).
Imports no backend.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxnorm import _jax_compat as jc
from jaxnorm._rules import jvp_by_formula

__all__ = ["KernelPrimitive", "flat_fn", "on_xla", "out_types"]


def flat_fn(cfg, fn, tree, groups: int):
  """``fn(cfg, *args)`` on flat leaves (``tree``: the arguments' structure), returning flat
  leaves, mapped with ``jax.vmap`` over ``groups`` leading axes of every leaf."""

  def f(*leaves):
    return jax.tree.leaves(fn(cfg, *jax.tree.unflatten(tree, leaves)))

  for _ in range(groups):
    f = jax.vmap(f)
  return f


def on_xla(cfg):
  """``cfg`` with ``impl="xla"``: the same function on the XLA path."""
  return dataclasses.replace(cfg, impl="xla")


@functools.lru_cache(maxsize=4096)
def out_types(cfg, fn, tree, groups: int, in_types):
  """``(out_tree, ((shape, dtype), ...))`` of ``fn`` on the XLA path (the same function) for
  leaves of ``in_types``, ``((shape, dtype), ...)``; tracing the kernels for it would build a
  ``pallas_call``, which ``shard_map`` refuses to type without the kernels' vma. Cached."""
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in in_types]
  xla = on_xla(cfg)

  def f(*leaves):
    return fn(xla, *jax.tree.unflatten(tree, leaves))

  for _ in range(groups):
    f = jax.vmap(f)
  outs = jax.eval_shape(f, *structs)
  return jax.tree.structure(outs), tuple((o.shape, o.dtype) for o in jax.tree.leaves(outs))


def _types(avals) -> tuple:
  return tuple((tuple(a.shape), a.dtype) for a in avals)


class KernelPrimitive:
  """A kernel backend's primitive ``p`` (multiple results) with every rule JAX asks of it.

  ``name``: the primitive's name (what a jaxpr shows); ``platforms``: the lowering platforms
  the kernels compile for (:meth:`run` is registered for each); ``eager_backends``: the
  ``jax.default_backend()`` names that run :meth:`run` under ``jax.disable_jit`` (None:
  ``platforms``); ``with_export``: :meth:`run` also takes ``for_export=`` (whether
  ``jax.export`` lowers the program). Parameters of ``p``: ``cfg``, ``fn``, ``tree``,
  ``groups`` (leading group axes) and ``elsewhere`` ("raise" or "xla": what lowering for
  another platform gives, interpret mode aside).
  """

  def __init__(self, name: str, platforms: tuple[str, ...], *, eager_backends=None,
               with_export: bool = False):
    self.platforms = tuple(platforms)
    self.eager_backends = self.platforms if eager_backends is None else tuple(eager_backends)
    self.p = jc.Primitive(name)
    self.p.multiple_results = True
    self._compiled = functools.lru_cache(maxsize=256)(self._compile)
    self.p.def_impl(self._impl)
    self.p.def_abstract_eval(self._abstract_eval)
    for platform in self.platforms:
      jc.register_lowering(self.p, self.run, platform=platform, with_export=with_export)
    jc.register_lowering(self.p, self.run_elsewhere, with_platforms=True)
    jc.register_jvp(self.p, self._jvp)
    jc.register_batching(self.p, self._batch)

  def run(self, *leaves, cfg, fn, tree, groups, elsewhere, **lowering):
    """The lowering for the kernels' own platforms: ``fn`` on the kernels, on flat leaves."""
    del elsewhere, lowering
    return flat_fn(cfg, fn, tree, groups)(*leaves)

  def interpreted(self, cfg, fn, tree, groups: int, leaves):
    """The kernels in interpret mode (``cfg.backend_config.interpret``) on flat leaves."""
    return flat_fn(cfg, fn, tree, groups)(*leaves)

  def refusal_elsewhere(self, platform: str) -> str:
    """The message of the ``ValueError`` raised where a call naming the backend is lowered for
    ``platform``, which the kernels do not compile for."""
    raise NotImplementedError

  def run_elsewhere(self, *leaves, cfg, fn, tree, groups, elsewhere, platforms):
    """The lowering for a platform the kernels do not compile for: interpret mode where the
    config asks for it; else the XLA path of the same function for ``elsewhere="xla"`` (a
    program lowered for several platforms lowers every branch of ``impl="auto"`` for all of
    them); else :meth:`refusal_elsewhere`, raised where the program is lowered, not from the
    tracing host's backend."""
    if cfg.backend_config.interpret:
      return self.interpreted(cfg, fn, tree, groups, leaves)
    if elsewhere == "xla":
      return flat_fn(on_xla(cfg), fn, tree, groups)(*leaves)
    other = next(p for p in platforms if p not in self.platforms)
    raise ValueError(self.refusal_elsewhere(other))

  def _impl(self, *leaves, cfg, fn, tree, groups, elsewhere):
    """Eager: the primitive compiled on its own, like any jitted call (so it meets the same
    per-platform lowering); under ``jax.disable_jit`` the same choice, made for the default
    backend, runs op by op."""
    params = dict(cfg=cfg, fn=fn, tree=tree, groups=groups, elsewhere=elsewhere)
    if jax.config.jax_disable_jit:
      backend = jax.default_backend()
      if backend in self.eager_backends:
        return self.run(*leaves, **params)
      return self.run_elsewhere(*leaves, platforms=(backend,), **params)
    return self._compiled(cfg, fn, tree, groups, elsewhere)(*leaves)

  def _compile(self, cfg, fn, tree, groups: int, elsewhere: str):
    return jax.jit(functools.partial(self.p.bind, cfg=cfg, fn=fn, tree=tree, groups=groups,
                                     elsewhere=elsewhere))

  def _abstract_eval(self, *avals, cfg, fn, tree, groups, elsewhere):
    del elsewhere
    _, outs = out_types(cfg, fn, tree, groups, _types(avals))
    axes = frozenset().union(*(jc.aval_varying_axes(a) for a in avals))
    base = max(avals, key=lambda a: len(a.shape))  # carries the trace's mesh, if any
    return [jc.with_varying_axes(base.update(shape=shape, dtype=dtype, weak_type=False), axes)
            for shape, dtype in outs]

  def _jvp(self, primals, tangents, *, cfg, fn, tree, groups, elsewhere):
    params = dict(cfg=cfg, fn=fn, tree=tree, groups=groups, elsewhere=elsewhere)
    return jvp_by_formula(self.p, primals, tangents, params,
                          flat_fn(on_xla(cfg), fn, tree, groups))

  def _batch(self, args, dims, *, vmap_axis_name, vmap_axis_size, cfg, fn, tree, groups,
             elsewhere):
    del vmap_axis_name, vmap_axis_size  # the kernels take no axis_name
    params = dict(cfg=cfg, fn=fn, tree=tree, elsewhere=elsewhere)
    if all(dm is None for dm in dims):  # nothing batched here (e.g. only a closed-over value)
      out = self.p.bind(*args, groups=groups, **params)
      return out, [None] * len(out)
    size = next(a.shape[dm] for a, dm in zip(args, dims) if dm is not None)
    new = [jnp.broadcast_to(a, (size,) + a.shape) if dm is None else jnp.moveaxis(a, dm, 0)
           for a, dm in zip(args, dims)]
    out = self.p.bind(*new, groups=groups + 1, **params)
    return out, [0] * len(out)

  def call(self, cfg, fn, *args, elsewhere: str = "raise"):
    """``fn(cfg, *args)`` behind ``p`` (``args`` may hold None; ``fn`` hashable, the config
    first): the pytree ``fn`` returns, its structure from the XLA path."""
    leaves, tree = jax.tree.flatten(args)
    in_types = tuple((tuple(jnp.shape(a)), jnp.result_type(a)) for a in leaves)
    out_tree, _ = out_types(cfg, fn, tree, 0, in_types)
    out = self.p.bind(*leaves, cfg=cfg, fn=fn, tree=tree, groups=0, elsewhere=elsewhere)
    return jax.tree.unflatten(out_tree, out)
