"""Internal API: how a call's backend configs are checked and routed, one per backend.

A call's public ``backend_config=`` is one backend's config (an instance of that backend's
``config_class``) or a tuple or list of configs of distinct backends; ``pallas=`` is the
documented alias for the Triton backend's config only. :func:`check` refuses what configures no
backend before the backend is chosen; :func:`route` gives, once the call's ``impl`` is resolved,
the sorted ``(name, config)`` pairs the call carries (``cfg.backend_config``), one for each
backend it runs on besides XLA, refusing a config the call cannot use rather than dropping it.
The table (:mod:`jaxnorm.backends.table`, ``check_config`` and ``call_config``) calls them with
its own ``BACKENDS``, ``PREFERENCE`` and ``ALIASES``; nothing here imports a backend.
"""

from __future__ import annotations

from jaxnorm import _validation as v

__all__ = ["check", "owner", "route"]


def owner(config, backends, order):
  """The backend of ``backends`` whose ``config_class`` ``config`` is an instance of (those
  named in ``order`` first, in its order), or None."""
  names = list(order) + [n for n in backends if n not in order]
  return next((backends[n] for n in names if backends[n].config_class is not None
               and isinstance(config, backends[n].config_class)), None)


def check(backend_config, pallas, backends, order, triton):
  """``(configs, argument)``: the call's backend configs, a tuple, and the name they were passed
  under, from ``backend_config=`` and its alias ``pallas=`` (at most one of them; ``((),
  "backend_config")`` when neither is given). ``triton``: the backend ``pallas=`` configures.

  Both given is a ``ValueError`` naming both, two configs of one backend a ``ValueError``; a
  value that is no backend's config a ``TypeError`` naming the argument as spelled (checked
  before the backend is chosen, so a wrong type is refused whatever ``impl`` is)."""
  if pallas is not None:
    if backend_config is not None:
      raise ValueError(f"backend_config= and its alias pallas= were both given "
                       f"({type(backend_config).__name__} and {type(pallas).__name__}); pass "
                       f"the backend config once, as backend_config=.")
    return (v.check_instance("pallas", pallas, triton.config_class, triton.config_example),
            ), "pallas"
  if backend_config is None:
    return (), "backend_config"
  several = isinstance(backend_config, (tuple, list))
  configs = tuple(backend_config) if several else (backend_config,)
  seen = {}
  for config in configs:
    mine = owner(config, backends, order)
    if mine is None:
      classes = ", ".join(dict.fromkeys(b.config_class.__name__ for b in backends.values()
                                        if b.config_class is not None))
      got = f"{type(config).__name__} {config!r}" + (" in a tuple" if several else "")
      raise TypeError(f"backend_config must be a backend's config ({classes}), a tuple of "
                      f"configs of distinct backends, or None, got {got}; e.g. "
                      f"backend_config={triton.config_example}.")
    if mine.name in seen:
      raise ValueError(f"backend_config= holds two configs of the {mine.name!r} backend "
                       f"({type(seen[mine.name]).__name__} and {type(config).__name__}); "
                       f"pass one config per backend.")
    seen[mine.name] = config
  return configs, "backend_config"


def route(configs, names, impl_arg: str, argument: str, backends, order, aliases):
  """The backend configs the call carries (its config's ``backend_config`` field): sorted
  ``(name, config)`` pairs, one for each backend of ``names`` (what the table resolved the
  call's ``impl_arg`` to run besides XLA), each the given config of that backend (``configs``,
  from :func:`check`) or its class's default (None for a backend without a config class).
  Hashable: part of the op's static configuration; the dispatch gives each backend its own.

  A config is not dropped silently: under a named ``impl_arg`` (or its alias, ``aliases``) a
  config of another backend is a ``TypeError`` naming the backend ``impl_arg`` runs
  (``argument``: the config's argument as spelled); under "auto", one of a backend that "auto"
  never runs (not in ``order``, the table's ``PREFERENCE``). A config of a backend in ``order``
  is carried where that backend runs; on a host where "auto" runs XLA it is unused, as that
  rule says.
  """
  configs = tuple(configs)
  if impl_arg == "auto":
    for config in configs:
      mine = owner(config, backends, order)
      if mine.name not in order:
        raise TypeError(f"{argument}= holds a {type(config).__name__}, which configures the "
                        f"{mine.name!r} backend, which impl='auto' does not run (it chooses "
                        f"among {tuple(order)}); pass impl={mine.name!r} to run it, or leave "
                        f"its config out.")
  else:
    backend = backends[aliases.get(impl_arg, impl_arg)]
    for config in configs:
      if backend.config_class is None or not isinstance(config, backend.config_class):
        takes = ("it takes no config: pass None" if backend.config_class is None else
                 f"pass a {backend.config_class.__name__} or None")
        raise TypeError(f"{argument}= is a {type(config).__name__}, which does not configure "
                        f"the {backend.name!r} backend that impl={impl_arg!r} runs ("
                        f"{type(config).__name__} configures the "
                        f"{owner(config, backends, order).name!r} backend); {takes}.")
  return tuple((name, _own(configs, backends[name])) for name in sorted(names))


def _own(configs, backend):
  """The config of ``configs`` that configures ``backend``, or its class's default (None for a
  backend without a config class)."""
  cls = backend.config_class
  if cls is None:
    return None
  given = next((c for c in configs if isinstance(c, cls)), None)
  return cls() if given is None else given
