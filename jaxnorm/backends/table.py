"""Internal API: the table of backends, the choice of one for a call, and the dispatch to it.

:data:`BACKENDS` maps a name to an object with the methods of
:class:`jaxnorm.backends.interface.Backend`: ``"xla"`` (:mod:`jaxnorm.backends.xla.backend`, runs
everywhere), ``"triton"`` (:mod:`jaxnorm.backends.triton.backend`, the Triton kernels written in
Pallas, for GPUs; ``impl="pallas"`` is its alias, :data:`ALIASES`) and ``"tpu"``
(:mod:`jaxnorm.backends.tpu.backend`, the Pallas TPU kernels). Each backend declares its lowering
platforms, the platforms ``impl="auto"`` may give it (``auto_platforms``: its platforms, or fewer;
the TPU backend's none until its ``AUTO_ON_TPU`` switch), its config class (what the call's
``backend_config=`` holds for it, checked by :func:`check_config` and :func:`call_config`) and
what it supports. :data:`PREFERENCE` is the order ``impl="auto"`` tries them in;
:data:`PLATFORM_BACKENDS`, the ``{platform: backend}`` map the per-platform choice is built
from, is read from it and the backends' ``auto_platforms``. Adding a backend is its own
subpackage implementing the interface, plus its entry in :data:`BACKENDS` and its place in
:data:`PREFERENCE` (``docs/ops.md``), or :func:`register_backend` (``auto=True`` for a place in
"auto"'s choice).

A call's ``impl`` is resolved once, when it is prepared (:func:`resolve_impl`): a backend's
name, or "per_platform" (``impl="auto"``: each platform's backend that takes the call where the
program is lowered for its platform, XLA elsewhere). The call carries one config per backend it
runs on (:func:`call_config`: sorted ``(name, config)`` pairs). :func:`run` then looks the call's
``(op, role)`` up in the tables of the backends it may run on (the one dispatch, for every op),
binds them into one :class:`~jaxnorm.backends.interface.Entry` and runs it: XLA's directly, a
kernel backend's through its ``launch`` with its own config (the Triton backend's is the
primitive that lowers the kernels per platform,
:func:`jaxnorm.backends.triton.kernel_call.kernel_call`). :func:`formula` gives the XLA formulas
the differentiation layer runs whatever the backend. The ops' and layers' docstrings list the
``impl=`` choices of this table (:func:`documented`). The functions below are what the
differentiation layers (:mod:`jaxnorm.ops.norm.rules`, :mod:`jaxnorm.ops.gated.rules`) and the
tests call.
"""

from __future__ import annotations

import collections.abc
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
from jaxnorm.backends import configs as _configs
from jaxnorm.backends.interface import Entry
from jaxnorm.backends.tpu.backend import TPU
from jaxnorm.backends.triton.backend import TRITON
from jaxnorm.backends.xla.backend import XLA

__all__ = ["ALIASES", "BACKENDS", "IMPLS", "IMPL_TOKEN", "PER_PLATFORM", "PLATFORM_BACKENDS",
           "PREFERENCE", "add_backward", "add_forward", "add_forward_only", "backward",
           "call_config", "check_config", "documented", "formula", "forward", "forward_only",
           "host_platform", "impl_choices", "param_cotangents", "register_backend",
           "resolve_add_impl", "resolve_impl", "run", "unregister_backend"]

_BACKENDS = {XLA.name: XLA, TRITON.name: TRITON, TPU.name: TPU}
BACKENDS = types.MappingProxyType(_BACKENDS)  # register_backend adds to it
ALIASES = types.MappingProxyType({"pallas": "triton"})  # accepted names of a backend
# The library's own order; register_backend(..., auto=True) puts a backend before its last.
_LIBRARY = ("triton", "tpu", "xla")
# impl="auto": the backends in the order tried; the last runs every call on every platform.
PREFERENCE = _LIBRARY


class _PlatformBackends(collections.abc.Mapping):
  """The per-platform choice of ``impl="auto"``, ``{platform: backend name}``: each platform's
  first backend in :data:`PREFERENCE` whose ``auto_platforms`` hold it (a backend with None,
  XLA, is the default branch of every platform not listed). Read from the backends'
  declarations each time it is asked, so a declaration's switch (the TPU backend's
  ``auto_on_tpu``) and :func:`register_backend` take effect at once."""

  def _map(self) -> dict:
    out = {}
    for name in reversed(PREFERENCE):
      for platform in BACKENDS[name].auto_platforms or ():
        out[platform] = name
    return out

  def __getitem__(self, platform):
    return self._map()[platform]

  def __iter__(self):
    return iter(self._map())

  def __len__(self):
    return len(self._map())

  def __repr__(self):
    return f"PLATFORM_BACKENDS({self._map()!r})"


PLATFORM_BACKENDS = _PlatformBackends()
# The accepted values of ``impl=``: "auto", every backend's name and every alias.
IMPLS = ("auto",) + tuple(BACKENDS) + tuple(ALIASES)


def impl_choices(impls=None) -> str:
  """The accepted values of ``impl=`` (default :data:`IMPLS`, the library's at import) as the
  docstrings list them: ``"auto"``, ``"xla"``, ``"triton"``, ``"tpu"`` or ``"pallas"`` (the alias
  of ``"triton"``). The ops' and layers' docstrings are formatted with it, so
  their lists are the table's."""
  impls = IMPLS if impls is None else impls
  words = [f'``"{i}"``' + (f' (the alias of ``"{ALIASES[i]}"``)' if i in ALIASES else "")
           for i in impls]
  return ", ".join(words[:-1]) + " or " + words[-1]


#: The token a docstring writes where :func:`documented` puts :func:`impl_choices`.
IMPL_TOKEN = "IMPL_CHOICES"


def documented(obj):
  """``obj`` (a function or class; or a module's docstring, a ``str``) with :data:`IMPL_TOKEN`
  in its docstring replaced by :func:`impl_choices`: the ops and layers list the ``impl=``
  values of this table, not a copy of them. Returns ``obj`` (or the new string)."""
  if isinstance(obj, str) or obj is None:
    return None if obj is None else obj.replace(IMPL_TOKEN, impl_choices())
  if obj.__doc__:
    obj.__doc__ = obj.__doc__.replace(IMPL_TOKEN, impl_choices())
  return obj


def register_backend(backend, *, auto: bool = False) -> None:
  """Adds ``backend`` (a :class:`~jaxnorm.backends.interface.Backend` with its table filled) to
  :data:`BACKENDS`: a call reaches it with ``impl=backend.name`` and its config (an instance of
  ``backend.config_class``) as ``backend_config=``. With ``auto``, ``impl="auto"`` gives it the
  platforms of its ``auto_platforms`` that no backend before it in :data:`PREFERENCE` holds (it
  goes in just before XLA); without, "auto" keeps its order. A name already taken is a
  ``ValueError``, as is ``auto`` for a backend without ``auto_platforms``."""
  global IMPLS, PREFERENCE
  if backend.name in IMPLS:
    raise ValueError(f"impl={backend.name!r} is taken: {IMPLS}")
  if auto and backend.auto_platforms is None:
    raise ValueError(f"register_backend(auto=True) needs the platforms impl='auto' may give "
                     f"the {backend.name!r} backend (its auto_platforms), got None")
  _BACKENDS[backend.name] = backend
  IMPLS = IMPLS + (backend.name,)
  if auto:
    PREFERENCE = PREFERENCE[:-1] + (backend.name, PREFERENCE[-1])


def unregister_backend(name: str) -> None:
  """Removes a backend :func:`register_backend` added (the library's own stay)."""
  global IMPLS, PREFERENCE
  if name in _LIBRARY or name not in BACKENDS:
    raise ValueError(f"{name!r} is not a registered backend of its own")
  del _BACKENDS[name]
  IMPLS = tuple(n for n in IMPLS if n != name)
  PREFERENCE = tuple(n for n in PREFERENCE if n != name)


PER_PLATFORM = "per_platform"  # cfg.impl of impl="auto" where a platform's backend takes it
_FALLBACK = _LIBRARY[-1]


# ---------------------------------------------------------------------------------------------
# Choosing a backend (once, when a call is prepared).


def resolve_impl(impl: str, x2_shape, dtype, mask, axis_name, op, options=()):
  """``(resolved, names)``: ``impl`` (:data:`IMPLS`) resolved to a backend's name or
  :data:`PER_PLATFORM`, and the backends the call runs on besides XLA (sorted; ``()`` for
  XLA).

  "auto" on a host whose default platform (:func:`host_platform`) no kernel backend of
  :data:`PLATFORM_BACKENDS` runs on (a CPU host, or a TPU host while the TPU backend's
  ``auto_on_tpu`` switch is off) is "xla": nothing else could run there, and a program
  ``jax.export`` lowers takes the XLA path anyway. Elsewhere "auto" decides per platform: each
  backend of :data:`PLATFORM_BACKENDS` that takes the call (its
  :meth:`~jaxnorm.backends.interface.Backend.refusal` has no objection) and that this JAX can
  run (:meth:`~jaxnorm.backends.interface.Backend.unavailable`; a ``RuntimeWarning`` says so
  once where it cannot) keeps its platforms; the others' platforms run XLA. The result is
  "per_platform" with those backends (each where the program is lowered for its platform, XLA
  elsewhere: :func:`run`) when the host's own platform's backend is among them, else "xla". It
  never fails where "xla" works. A backend named (or its alias) raises a ``ValueError`` saying
  why when this JAX cannot run it or it cannot take the call (``op``, a
  :class:`~jaxnorm._norm_ops.NormOp`, with its ``options``, the ``(name, value)`` pairs of
  :attr:`NormConfig.options`); whether the platform can compile the kernels is asked where the
  program is lowered (the backend's ``launch``), for each platform it is lowered for.
  """
  v.check_choice("impl", impl, IMPLS)
  call = (x2_shape, dtype, mask, axis_name, op, options)
  if impl == "auto":
    if host_platform() not in PLATFORM_BACKENDS:
      # No kernel backend runs on this host's default platform: its programs take the XLA
      # path (so does any export, kernel_call), and tracing pays for one branch, not a switch.
      return _FALLBACK, ()
    kernels = sorted(set(PLATFORM_BACKENDS.values()))
    present = [n for n in kernels if not _absent(n)]
    return _per_platform(tuple(n for n in present if BACKENDS[n].refusal(*call) is None))
  name = ALIASES.get(impl, impl)
  why_not = BACKENDS[name].unavailable() or BACKENDS[name].refusal(*call)
  if why_not is not None:
    raise ValueError(v.backend_refusal(impl, why_not))
  return name, (() if name == _FALLBACK else (name,))


def _per_platform(names):
  """``(PER_PLATFORM, names)`` where the host's own platform runs one of ``names`` (the kernel
  backends that take an "auto" call), ``("xla", ())`` otherwise."""
  if PLATFORM_BACKENDS.get(host_platform()) in names:
    return PER_PLATFORM, tuple(names)
  return _FALLBACK, ()


def host_platform() -> str:
  """The platform of JAX's default backend (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``): where
  ``impl="auto"`` decides whether a kernel backend may run at all (:func:`resolve_impl`). The
  tests replace it to stand for a GPU host."""
  return _jax_compat.default_platform()


def check_config(backend_config, pallas=None):
  """``(configs, argument)``: the call's backend configs (a tuple) and the name they were passed
  under (``backend_config=`` one backend's config or a tuple of distinct backends'; ``pallas=``
  the Triton config only): :func:`jaxnorm.backends.configs.check` on this table."""
  return _configs.check(backend_config, pallas, BACKENDS, PREFERENCE, TRITON)


def call_config(configs, names, impl_arg: str, argument: str = "backend_config"):
  """The sorted ``(name, config)`` pairs a call carries, one for each backend of ``names`` (what
  :func:`resolve_impl` resolved ``impl_arg`` to run besides XLA), a config given or the
  class's default; a config the call cannot use is a ``TypeError``, not dropped:
  :func:`jaxnorm.backends.configs.route` on this table."""
  return _configs.route(configs, names, impl_arg, argument, BACKENDS, PREFERENCE, ALIASES)


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
  """``cfg`` without the backends whose add + norm code cannot take one of ``dtypes`` (the
  residual add's ``(name, dtype)`` pairs; their platforms then run XLA) for "auto", "xla"
  where none is left that runs on the host (:func:`resolve_impl`'s rule); a ``ValueError``
  where the backend was named."""
  if cfg.impl == _FALLBACK:
    return cfg
  why = {n: BACKENDS[n].add_refusal(dtypes) for n, _ in cfg.backend_config}
  if cfg.impl != PER_PLATFORM:
    if why[cfg.impl] is None:
      return cfg
    raise ValueError(v.backend_refusal(impl, why[cfg.impl]))
  kept = tuple((n, c) for n, c in cfg.backend_config if why[n] is None)
  if kept == cfg.backend_config:
    return cfg
  resolved, names = _per_platform(tuple(n for n, _ in kept))
  return dataclasses.replace(cfg, impl=resolved, backend_config=kept if names else ())


# ---------------------------------------------------------------------------------------------
# Dispatch.


def run(cfg, name: str, *args, **static):
  """The role ``name`` of the call's op (``cfg.op``) on the resolved ``cfg.impl``: the entry
  ``(cfg.op.name, name)`` of that backend's table, on ``args``. ``cfg`` is the op's config (a
  :class:`NormConfig`, or another op's with ``op``, ``impl`` and ``backend_config`` fields; the
  latter the ``(name, config)`` pairs of :func:`call_config`).

  :data:`PER_PLATFORM` is decided per lowering platform: a ``lax.platform_dependent`` with one
  branch per platform of :data:`PLATFORM_BACKENDS` whose backend takes the call (those of
  ``cfg.backend_config``: the Triton kernels for cuda and rocm) and XLA as the default branch.
  Only the branch of the platform a program is lowered for is compiled, so ``jax.export(...,
  platforms=["cuda"])`` from a GPU host carries the kernels and ``["tpu"]`` the XLA formulas
  (while the TPU backend's switch is off); every branch returns the same shapes and dtypes. A
  kernel backend runs its kernels through its own ``launch`` (the Triton backend's kernel-call
  primitive), so every branch can be differentiated again. Each backend sees its own config as
  ``cfg.backend_config``.
  """
  names = [n for n, _ in cfg.backend_config] if cfg.impl == PER_PLATFORM else [cfg.impl]
  # Every entry also carries the fallback's function: a kernel backend's primitive types,
  # differentiates and (elsewhere="xla") lowers the call with it.
  key = (cfg.op.name, name)
  fns = tuple((n, BACKENDS[n].table[key]) for n in dict.fromkeys(names + [_FALLBACK]))
  return _dispatch(cfg, Entry(fns, tuple(sorted(static.items()))), *args)


def _dispatch(cfg, fn, *args):
  """``fn(cfg, *args)`` on ``cfg.impl``, through the backend's ``launch`` with its own config
  as ``backend_config`` (the fallback runs it directly); per lowering platform for
  :data:`PER_PLATFORM`."""
  if cfg.impl == _FALLBACK:
    return fn(cfg, *args)
  configs = dict(cfg.backend_config)
  if cfg.impl != PER_PLATFORM:
    own = dataclasses.replace(cfg, backend_config=configs[cfg.impl])
    return BACKENDS[cfg.impl].launch(own, fn, *args)
  fallback = dataclasses.replace(cfg, impl=_FALLBACK)
  # A program lowered for several platforms lowers every branch for each of them: a kernels'
  # branch then lowers to the XLA path where the kernels do not compile (elsewhere="xla").
  # One branch per backend, shared by its platforms (platform_dependent merges equal branches).
  per_backend = {name: functools.partial(
      BACKENDS[name].launch, dataclasses.replace(cfg, impl=name, backend_config=config), fn,
      elsewhere="xla") for name, config in configs.items()}
  branches = {platform: per_backend[name] for platform, name in PLATFORM_BACKENDS.items()
              if name in per_backend}
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
