"""Internal API: the table of backends, the choice of one for a call, and the dispatch to it.

:data:`BACKENDS` maps a name to an object with the methods of
:class:`jaxnorm.backends.interface.Backend`: ``"xla"`` (:mod:`jaxnorm.backends.xla.backend`, runs
everywhere) and ``"triton"`` (:mod:`jaxnorm.backends.triton.backend`, the Triton kernels written in
Pallas; ``impl="pallas"`` is its alias, :data:`ALIASES`). Each backend declares its lowering
platforms, its config class (what the call's ``backend_config=`` must be, checked by
:func:`check_config` and :func:`call_config`) and what it supports. :data:`PREFERENCE` is the
order ``impl="auto"`` tries them in; :data:`PLATFORM_BACKENDS`, the ``{platform: backend}`` map
the per-platform choice is built from, is derived from it and the backends' platforms. Adding a
backend is its own subpackage implementing the interface, plus its entry in :data:`BACKENDS` and
its place in :data:`PREFERENCE` (``docs/ops.md``), or :func:`register_backend`.

A call's ``impl`` is resolved once, when it is prepared (:func:`resolve_impl`): a backend's
name, or "per_platform" (``impl="auto"`` on a call a platform's preferred backend takes: that
backend where the program is lowered for its platform, XLA elsewhere). :func:`run` then looks
the call's ``(op, role)`` up in the tables of the backends it may run on (the one dispatch, for
every op), binds them into one :class:`~jaxnorm.backends.interface.Entry` and runs it: XLA's
directly, a kernel backend's through its ``launch`` (the Triton backend's is the primitive that
lowers the kernels per platform, :func:`jaxnorm.backends.triton.kernel_call.kernel_call`).
:func:`formula` gives the XLA formulas the differentiation layer runs whatever the backend. The
functions below are what the differentiation layers (:mod:`jaxnorm.ops.norm.rules`,
:mod:`jaxnorm.ops.gated.rules`) and the tests call.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import warnings

import jax.numpy as jnp
from jax import lax

from jaxnorm import _jax_compat
from jaxnorm import _validation as v
from jaxnorm._xla_rows import match_vma
from jaxnorm._norm_config import NormConfig
from jaxnorm.backends.interface import Entry
from jaxnorm.backends.triton.backend import TRITON
from jaxnorm.backends.xla.backend import XLA

__all__ = ["ALIASES", "BACKENDS", "IMPLS", "PER_PLATFORM", "PLATFORM_BACKENDS", "PREFERENCE",
           "add_backward", "add_forward", "add_forward_only", "backward", "formula", "forward",
           "forward_only", "param_cotangents", "resolve_add_impl", "resolve_impl",
           "run", "call_config", "check_config", "host_platform", "register_backend",
           "unregister_backend"]

_BACKENDS = {XLA.name: XLA, TRITON.name: TRITON}
BACKENDS = types.MappingProxyType(_BACKENDS)  # register_backend adds to it
ALIASES = types.MappingProxyType({"pallas": "triton"})  # accepted names of a backend
# impl="auto": the backends in the order tried; the last runs every call on every platform.
PREFERENCE = ("triton", "xla")
# The per-platform choice: each platform's first backend in PREFERENCE that lowers for it (a
# backend with platforms=None, XLA, is the default branch of every platform not listed).
PLATFORM_BACKENDS = types.MappingProxyType({
    platform: name for name in reversed(PREFERENCE)
    for platform in (BACKENDS[name].platforms or ())})
# The accepted values of ``impl=``: "auto", every backend's name and every alias.
IMPLS = ("auto",) + tuple(BACKENDS) + tuple(ALIASES)


def register_backend(backend) -> None:
  """Adds ``backend`` (a :class:`~jaxnorm.backends.interface.Backend` with its table filled) to
  :data:`BACKENDS`: a call reaches it with ``impl=backend.name`` and its config (an instance of
  ``backend.config_class``) as ``backend_config=``. ``impl="auto"`` keeps :data:`PREFERENCE`, the
  library's own order. A name already taken is a ``ValueError``."""
  global IMPLS
  if backend.name in IMPLS:
    raise ValueError(f"impl={backend.name!r} is taken: {IMPLS}")
  _BACKENDS[backend.name] = backend
  IMPLS = IMPLS + (backend.name,)


def unregister_backend(name: str) -> None:
  """Removes a backend :func:`register_backend` added (the library's own stay)."""
  global IMPLS
  if name in PREFERENCE or name not in BACKENDS:
    raise ValueError(f"{name!r} is not a registered backend of its own")
  del _BACKENDS[name]
  IMPLS = tuple(n for n in IMPLS if n != name)
PER_PLATFORM = "per_platform"  # cfg.impl of impl="auto" where a platform's backend takes it
_FALLBACK = PREFERENCE[-1]


# ---------------------------------------------------------------------------------------------
# Choosing a backend (once, when a call is prepared).


def resolve_impl(impl: str, x2_shape, dtype, mask, axis_name, op, options=()) -> str:
  """Resolves ``impl`` (:data:`IMPLS`) to a backend's name or
  :data:`PER_PLATFORM`.

  "auto" on a host whose default platform (:func:`host_platform`) no kernel backend of
  :data:`PLATFORM_BACKENDS` runs on (a CPU or TPU host today) is "xla": nothing else could run
  there, and a program ``jax.export`` lowers takes the XLA path anyway. On a host where one
  does (a GPU), "auto" on a call that every platform's backend supports (their
  :meth:`~jaxnorm.backends.interface.Backend.refusal` has no objection) is "per_platform":
  each backend where the program is lowered for its platform and XLA elsewhere, decided per
  lowering platform (:func:`run`); any other call
  is "xla", as is every call where this JAX cannot run one of those backends
  (:meth:`~jaxnorm.backends.interface.Backend.unavailable`, e.g. a JAX whose Pallas has no
  Triton backend; a ``RuntimeWarning`` says so once). It never fails where "xla" works. A
  backend named (or its alias) raises a ``ValueError`` saying why when this JAX cannot run it
  or it cannot take the call (``op``, a
  :class:`~jaxnorm._norm_ops.NormOp`, with its ``options``, the ``(name, value)`` pairs of
  :attr:`NormConfig.options`); whether the platform can compile the kernels is asked where the
  program is lowered (:mod:`jaxnorm.backends.triton.kernel_call`), for each platform it is lowered
  for.
  """
  v.check_choice("impl", impl, IMPLS)
  call = (x2_shape, dtype, mask, axis_name, op, options)
  if impl == "auto":
    if host_platform() not in PLATFORM_BACKENDS:
      # No kernel backend runs on this host's default platform: its programs take the XLA
      # path (so does any export, kernel_call), and tracing pays for one branch, not a switch.
      return _FALLBACK
    # Every platform's backend must take the call (one config serves every branch of run()).
    kernels = set(PLATFORM_BACKENDS.values())
    takes = kernels and not any([_absent(n) for n in sorted(kernels)]) and all(
        BACKENDS[n].refusal(*call) is None for n in kernels)
    return PER_PLATFORM if takes else _FALLBACK
  name = ALIASES.get(impl, impl)
  why_not = BACKENDS[name].unavailable() or BACKENDS[name].refusal(*call)
  if why_not is not None:
    raise ValueError(v.backend_refusal(impl, why_not))
  return name


def host_platform() -> str:
  """The platform of JAX's default backend (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``): where
  ``impl="auto"`` decides whether a kernel backend may run at all (:func:`resolve_impl`). The
  tests replace it to stand for a GPU host."""
  return _jax_compat.default_platform()


def check_config(backend_config, pallas=None):
  """``(config, argument)``: the call's backend config and the name it was passed under, from its
  public ``backend_config=`` and the documented alias ``pallas=`` (at most one; ``(None,
  "backend_config")`` when neither is given). Both given is a ``ValueError`` naming both; a
  config that is no backend's ``config_class`` a ``TypeError`` naming the argument as spelled
  (checked before the backend is chosen, so a wrong type is refused whatever ``impl`` is)."""
  config, argument = backend_config, "backend_config"
  if pallas is not None:
    if backend_config is not None:
      raise ValueError(f"backend_config= and its alias pallas= were both given "
                       f"({type(backend_config).__name__} and {type(pallas).__name__}); pass "
                       f"the backend config once, as backend_config=.")
    config, argument = pallas, "pallas"
  if config is not None:
    owners = _configured()
    if not isinstance(config, tuple(b.config_class for b in owners)):
      v.check_instance(argument, config, owners[0].config_class, owners[0].config_example)
  return config, argument


def call_config(config, impl: str, impl_arg: str, argument: str = "backend_config"):
  """The backend config the call carries (its config's ``backend_config`` field), for the
  resolved ``impl`` (``impl_arg`` and ``argument``: the call's own spellings of ``impl`` and of
  the config's argument, for the message).

  A backend's config applies where that backend runs: a call resolved to a backend with a
  config class (or to :data:`PER_PLATFORM`, for its platforms' backends) carries ``config``,
  which must be that class's (a ``TypeError`` otherwise), or that class's default for None. A
  call resolved to XLA, which has none, carries the first configured backend's default, so that
  its static configuration does not depend on an argument it does not use.
  """
  if impl == _FALLBACK:
    return _configured()[0].config_class()
  names = sorted(set(PLATFORM_BACKENDS.values())) if impl == PER_PLATFORM else [impl]
  (owner,) = [BACKENDS[n] for n in names if BACKENDS[n].config_class is not None]
  if config is None:
    return owner.config_class()
  if not isinstance(config, owner.config_class):
    raise TypeError(f"{argument}= is a {type(config).__name__}, which does not configure the "
                    f"{owner.name!r} backend that impl={impl_arg!r} runs; pass a "
                    f"{owner.config_class.__name__} or None.")
  return config


def _configured():
  """The backends with a config class, those of :data:`PREFERENCE` first, in its order."""
  names = list(PREFERENCE) + [n for n in BACKENDS if n not in PREFERENCE]
  return [BACKENDS[n] for n in names if BACKENDS[n].config_class is not None]


_WARNED: set[str] = set()  # the backends impl="auto" has warned it runs without


def _absent(name: str) -> bool:
  """Whether this JAX cannot run the backend ``name``; the first time, for ``impl="auto"``, a
  warning says so and that "auto" runs XLA where it would have run it."""
  why = BACKENDS[name].unavailable()
  if why is not None and name not in _WARNED:
    _WARNED.add(name)
    warnings.warn(f"impl='auto' runs XLA where it would run the {name!r} backend: {why}. "
                  f"Pass impl='xla' to silence this warning.", RuntimeWarning, stacklevel=2)
  return why is not None


def resolve_add_impl(cfg: NormConfig, dtypes, impl: str) -> NormConfig:
  """``cfg`` with impl="xla" where the add + norm kernels cannot take one of ``dtypes`` ("auto");
  a ``ValueError`` where the backend was named."""
  if cfg.impl == _FALLBACK:
    return cfg
  names = set(PLATFORM_BACKENDS.values()) if cfg.impl == PER_PLATFORM else {cfg.impl}
  reason = next(filter(None, (BACKENDS[n].add_refusal(dtypes) for n in sorted(names))), None)
  if reason is None:
    return cfg
  if impl == "auto":
    return dataclasses.replace(cfg, impl=_FALLBACK)
  raise ValueError(v.backend_refusal(impl, reason))


# ---------------------------------------------------------------------------------------------
# Dispatch.


def run(cfg, name: str, *args, **static):
  """The role ``name`` of the call's op (``cfg.op``) on the resolved ``cfg.impl``: the entry
  ``(cfg.op.name, name)`` of that backend's table, on ``args``. ``cfg`` is the op's config (a
  :class:`NormConfig`, or another op's with ``op``, ``impl`` and ``backend_config`` fields).

  :data:`PER_PLATFORM` is decided per lowering platform: a ``lax.platform_dependent`` with one
  branch per platform of :data:`PLATFORM_BACKENDS` (the Triton kernels for cuda and rocm) and
  XLA as the default branch. Only the branch of the platform a program
  is lowered for is compiled, so ``jax.export(..., platforms=["cuda"])`` from a CPU host carries
  the kernels and ``["tpu"]`` the XLA formulas; both branches return the same shapes and
  dtypes. A kernel backend runs its kernels through its own ``launch`` (the Triton backend's
  kernel-call primitive), so every branch can be differentiated again.
  """
  names = sorted(set(PLATFORM_BACKENDS.values())) if cfg.impl == PER_PLATFORM else [cfg.impl]
  # Every entry also carries the fallback's function: a kernel backend's primitive types,
  # differentiates and (elsewhere="xla") lowers the call with it.
  key = (cfg.op.name, name)
  fns = tuple((n, BACKENDS[n].table[key]) for n in dict.fromkeys(names + [_FALLBACK]))
  return _dispatch(cfg, Entry(fns, tuple(sorted(static.items()))), *args)


def _dispatch(cfg, fn, *args):
  """``fn(cfg, *args)`` on ``cfg.impl``, through the backend's ``launch`` (the fallback runs it
  directly); per lowering platform for :data:`PER_PLATFORM`."""
  if cfg.impl == _FALLBACK:
    return fn(cfg, *args)
  if cfg.impl != PER_PLATFORM:
    return BACKENDS[cfg.impl].launch(cfg, fn, *args)
  fallback = dataclasses.replace(cfg, impl=_FALLBACK)
  # A program lowered for several platforms lowers every branch for each of them: a kernels'
  # branch then lowers to the XLA path where the kernels do not compile (elsewhere="xla").
  # One branch per backend, shared by its platforms (platform_dependent merges equal branches).
  per_backend = {name: functools.partial(BACKENDS[name].launch, dataclasses.replace(cfg, impl=name),
                                         fn, elsewhere="xla")
                 for name in set(PLATFORM_BACKENDS.values())}
  branches = {platform: per_backend[name] for platform, name in PLATFORM_BACKENDS.items()}
  return lax.platform_dependent(*args, default=functools.partial(fn, fallback), **branches)


def formula(cfg: NormConfig, name: str):
  """The role ``name`` of ``cfg.op`` on the backend every call can fall back to (XLA's closed
  forms), bound to ``cfg``: the formulas the differentiation layer runs in XLA ops whatever the
  call's backend (the tangent map, the statistics it recomputes for second order, the
  Jacobian's normalized row: :data:`jaxnorm.backends.xla.backend.FORMULA_ROLES`) and what it
  differentiates again where a backend's own derivative rule has none
  (:func:`jaxnorm.ops.norm.rules._wide_backward`). The way the op layer reaches XLA's arithmetic
  without importing a backend."""
  return functools.partial(BACKENDS[_FALLBACK].table[(cfg.op.name, name)], cfg)


def param_cotangents(cfg: NormConfig, scale, dscale, dbias):
  """``dscale``/``dbias`` in their primals' shapes and dtypes, summed over replicated mesh axes."""
  if dscale is not None:
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
    dscale = match_vma(dscale, _jax_compat.varying_axes(scale))
  if dbias is not None:
    dbias = dbias.reshape(cfg.bias_shape).astype(cfg.bias_dtype)
    dbias = match_vma(dbias, cfg.bias_vma)
  return dscale, dbias


def forward_only(cfg: NormConfig, x, scale, bias, mask):
  """``y`` of ``x: (..., d)``, nothing kept: the value of an undifferentiated call."""
  return run(cfg, "forward_only", x, scale, bias, mask)


def forward(cfg: NormConfig, x, scale, bias, mask):
  """``(y, stats)`` of ``x: (..., d)``: the value and what reverse mode keeps."""
  return run(cfg, "forward", x, scale, bias, mask)


def backward(cfg: NormConfig, x, scale, mask, stats, dy, dx_dtype=None):
  """``(dx, dscale, dbias)``: the derived VJP; ``dx`` in ``dx_dtype`` (default ``x.dtype``).

  ``dscale``/``dbias`` come back unreduced over mesh axes: see :func:`param_cotangents`.
  """
  dx_dtype = None if dx_dtype is None else jnp.dtype(dx_dtype)
  return run(cfg, "backward", x, scale, mask, stats, dy, dx_dtype=dx_dtype)


def add_forward_only(cfg: NormConfig, x, residual, scale, bias, mask):
  """``(y, h)`` of the residual add + norm, nothing kept."""
  return run(cfg, "add_forward_only", x, residual, scale, bias, mask)


def add_forward(cfg: NormConfig, x, residual, scale, bias, mask):
  """``(y, h, stats)`` of the residual add + norm (stats: the plain op's at ``h``)."""
  return run(cfg, "add_forward", x, residual, scale, bias, mask)


def add_backward(cfg: NormConfig, h, scale, mask, stats, dy, dh):
  """``(dx, dresidual, dscale, dbias)``, each in its primal's dtype, summed over the mesh axes
  its primal is replicated on. ``dh`` None: ``h`` unused downstream (nothing added)."""
  dx, dres, dscale, dbias = run(cfg, "add_backward", h, scale, mask, stats, dy, dh)
  dscale, dbias = param_cotangents(cfg, scale, dscale, dbias)
  add = cfg.add
  dx = match_vma(dx, add.x_vma)
  dres = match_vma(dres, add.residual_vma)
  return dx, dres, dscale, dbias
