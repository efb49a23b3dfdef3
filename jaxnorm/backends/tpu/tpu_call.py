"""Internal API: the TPU kernels behind a primitive of their own, differentiable to any order.

The TPU backend's ``launch``, built as the Triton backend's kernel-call primitive is (see
:mod:`jaxnorm.backends.triton.kernel_call` for why a primitive and not a ``custom_jvp``), with
its own platform:

* value and lowering: ``fn`` on the kernels (``cfg.impl == "tpu"``), lowered per platform: the
  Mosaic kernels (``tpu_custom_call``) for ``tpu``; elsewhere the kernels in TPU interpret mode
  (``TpuConfig(interpret=True)``), or the XLA path of the same function where ``impl="auto"``'s
  TPU branch is lowered for another platform (``elsewhere="xla"``), or a ``ValueError`` naming
  the platform (``impl="tpu"``);
* JVP: the value from the primitive again, the tangent from ``jax.jvp`` of ``fn`` on the XLA
  path (:func:`jaxnorm._rules.jvp_by_formula`);
* batching: a batch axis of any operand becomes a leading group axis of all of them, mapped
  with ``jax.vmap`` over the kernels (one more grid axis of the ``pallas_call``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import _jax_compat as jc
from jaxnorm import _validation as v
from jaxnorm._rules import jvp_by_formula

__all__ = ["PLATFORMS", "tpu_call"]

#: The lowering platforms the kernels compile for.
PLATFORMS = ("tpu",)

tpu_call_p = jc.Primitive("jaxnorm_tpu_kernels")
tpu_call_p.multiple_results = True


def _flat_fn(cfg, fn, tree, groups: int):
  """``fn(cfg, *args)`` on flat leaves, mapped over ``groups`` leading axes."""

  def f(*leaves):
    return jax.tree.leaves(fn(cfg, *jax.tree.unflatten(tree, leaves)))

  for _ in range(groups):
    f = jax.vmap(f)
  return f


def _xla(cfg):
  return dataclasses.replace(cfg, impl="xla")


def _run(*leaves, cfg, fn, tree, groups, elsewhere):
  """Lowering for a TPU: the kernels (interpret mode too where the config asks for it)."""
  del elsewhere
  if cfg.backend_config.interpret:
    return _interpreted(cfg, fn, tree, groups, leaves)
  return _flat_fn(cfg, fn, tree, groups)(*leaves)


@functools.lru_cache(maxsize=256)
def _interpreter(cfg, fn, tree, groups: int, in_types):
  """The interpret-mode program of the kernels, compiled for the host once per signature, on
  its first run (lowering it inside the caller's lowering fails on jax 0.8.1: the interpreter's
  ordered effects meet the caller's lowering context)."""
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in in_types]
  return jax.jit(_flat_fn(cfg, fn, tree, groups)).lower(*structs).compile()


def _interpreted(cfg, fn, tree, groups: int, leaves):
  """The kernels in TPU interpret mode, each launch a program of its own run from a host
  callback. Interpret mode (``pltpu.InterpretParams``) simulates the TPU's memory with ordered
  host callbacks, effects which ``jax.checkpoint`` and a primitive's lowering cannot carry; run
  as their own program, they leave the caller's program pure (``jax.pure_callback``), so every
  transformation of the op works on the interpreted kernels as on the compiled ones."""
  in_types = tuple((tuple(a.shape), a.dtype) for a in leaves)
  _, outs = _out_types(cfg, fn, tree, groups, in_types)
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in outs]

  def host(*arrays):
    return [np.asarray(o) for o in _interpreter(cfg, fn, tree, groups, in_types)(*arrays)]

  return jax.pure_callback(host, structs, *leaves)


def _run_elsewhere(*leaves, cfg, fn, tree, groups, elsewhere, platforms):
  """Lowering for another platform: interpret mode, the XLA path ("auto"), or the error."""
  if cfg.backend_config.interpret:
    return _interpreted(cfg, fn, tree, groups, leaves)
  if elsewhere == "xla":
    return _flat_fn(_xla(cfg), fn, tree, groups)(*leaves)
  other = next(p for p in platforms if p not in PLATFORMS)
  raise ValueError(v.backend_refusal("tpu", (
      f"the TPU kernels compile for a TPU only, and the program is lowered for {other!r}; run "
      f"them in TPU interpret mode elsewhere (slowly, for testing): "
      f"backend_config=jaxnorm.backends.tpu.TpuConfig(interpret=True)")))


def _impl(*leaves, cfg, fn, tree, groups, elsewhere):
  """Eager: the primitive compiled on its own (under ``jax.disable_jit``: op by op, for the
  default backend)."""
  params = dict(cfg=cfg, fn=fn, tree=tree, groups=groups, elsewhere=elsewhere)
  if jax.config.jax_disable_jit:
    backend = jax.default_backend()
    if backend in PLATFORMS:
      return _run(*leaves, **params)
    return _run_elsewhere(*leaves, platforms=(backend,), **params)
  return _compiled(cfg, fn, tree, groups, elsewhere)(*leaves)


@functools.lru_cache(maxsize=256)
def _compiled(cfg, fn, tree, groups: int, elsewhere: str):
  return jax.jit(functools.partial(tpu_call_p.bind, cfg=cfg, fn=fn, tree=tree, groups=groups,
                                   elsewhere=elsewhere))


@functools.lru_cache(maxsize=4096)
def _out_types(cfg, fn, tree, groups: int, in_types):
  """``(out_tree, [(shape, dtype), ...])`` of ``fn`` on the XLA path (the same function)."""
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in in_types]

  def f(*leaves):
    return fn(_xla(cfg), *jax.tree.unflatten(tree, leaves))

  for _ in range(groups):
    f = jax.vmap(f)
  outs = jax.eval_shape(f, *structs)
  return jax.tree.structure(outs), tuple((o.shape, o.dtype) for o in jax.tree.leaves(outs))


def _abstract_eval(*avals, cfg, fn, tree, groups, elsewhere):
  del elsewhere
  in_types = tuple((tuple(a.shape), a.dtype) for a in avals)
  _, outs = _out_types(cfg, fn, tree, groups, in_types)
  axes = frozenset().union(*(jc.aval_varying_axes(a) for a in avals))
  base = max(avals, key=lambda a: len(a.shape))
  return [jc.with_varying_axes(base.update(shape=shape, dtype=dtype, weak_type=False), axes)
          for shape, dtype in outs]


def _jvp(primals, tangents, *, cfg, fn, tree, groups, elsewhere):
  params = dict(cfg=cfg, fn=fn, tree=tree, groups=groups, elsewhere=elsewhere)
  return jvp_by_formula(tpu_call_p, primals, tangents, params,
                        _flat_fn(_xla(cfg), fn, tree, groups))


def _batch(args, dims, *, vmap_axis_name, vmap_axis_size, cfg, fn, tree, groups, elsewhere):
  del vmap_axis_name, vmap_axis_size
  params = dict(cfg=cfg, fn=fn, tree=tree, elsewhere=elsewhere)
  if all(dm is None for dm in dims):
    out = tpu_call_p.bind(*args, groups=groups, **params)
    return out, [None] * len(out)
  size = next(a.shape[dm] for a, dm in zip(args, dims) if dm is not None)
  new = [jnp.broadcast_to(a, (size,) + a.shape) if dm is None else jnp.moveaxis(a, dm, 0)
         for a, dm in zip(args, dims)]
  out = tpu_call_p.bind(*new, groups=groups + 1, **params)
  return out, [0] * len(out)


tpu_call_p.def_impl(_impl)
tpu_call_p.def_abstract_eval(_abstract_eval)
for _platform in PLATFORMS:
  jc.register_lowering(tpu_call_p, _run, platform=_platform)
jc.register_lowering(tpu_call_p, _run_elsewhere, with_platforms=True)
jc.register_jvp(tpu_call_p, _jvp)
jc.register_batching(tpu_call_p, _batch)


def tpu_call(cfg, fn, *args, elsewhere: str = "raise", check=lambda cfg, *args: None):
  """``fn(cfg, *args)`` on the TPU kernels (``cfg.impl == "tpu"``), behind ``tpu_call_p``: the
  TPU backend's ``launch``. ``fn``: hashable, the config first (the dispatcher's
  :class:`~jaxnorm.backends.interface.Entry`); ``args`` may hold None. ``elsewhere``: what
  lowering for a platform other than a TPU gives (interpret mode aside), "raise" or "xla".
  ``check(cfg, *args)``: raises, where the call is traced, what the kernels cannot take (their
  own trace runs where the program is lowered)."""
  check(cfg, *args)
  leaves, tree = jax.tree.flatten(args)
  in_types = tuple((tuple(jnp.shape(a)), jnp.result_type(a)) for a in leaves)
  out_tree, _ = _out_types(cfg, fn, tree, 0, in_types)
  out = tpu_call_p.bind(*leaves, cfg=cfg, fn=fn, tree=tree, groups=0, elsewhere=elsewhere)
  return jax.tree.unflatten(out_tree, out)
