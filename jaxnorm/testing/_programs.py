"""Internal API of :mod:`jaxnorm.testing`: the compiled programs :func:`check_rule` keeps across
calls (the rule's, by signature and check; the float64 oracle's, by the reference's traced graph)
and the oracle's one program (its values, condition magnitude and scale). Split from
:mod:`jaxnorm.testing._problem`, which builds the checks that use them.
"""

from __future__ import annotations

import collections

import jax
import numpy as np

from jaxnorm._jax_compat import eval_jaxpr
from jaxnorm.testing._condition import magnitude, multipliers, scale, sites

__all__ = ["clear_cache"]

# Random sign draws of the condition magnitude (its tangents are batched: more cost little).
# Two left a masked 1024-wide RMSNorm's input gradient element at 0.02 x its value (a 5.69
# ulp error allowed 3.29 ulp: a false failure); M is then the largest of four.
_DIRECTIONS = 4


# The rule's compiled programs by signature and check (:meth:`_Problem.program`), and the
# oracle's traced graphs with their compiled programs by the reference's signature and check
# (:meth:`_Problem.oracle`), most recent last, bounded in entries (least recently used first).
# A kept program holds its executable: about 9 MB each on XLA:CPU for a small LayerNorm's
# checks (a default check of one signature keeps about 15 of the rule's and 11 of the
# oracle's), so 64 each: a few signatures, about 1 GB at most (clear_cache frees them).
_PROGRAMS = collections.OrderedDict()
_TRACED = collections.OrderedDict()
_PROGRAMS_MAX = 64


class _Graph:
  """A jaxpr and its constants (what :func:`_oracle_entry` reads of a closed jaxpr)."""

  def __init__(self, jaxpr, consts):
    self.jaxpr, self.consts = jaxpr, list(consts)


def clear_cache() -> None:
  """Forgets every program :func:`jaxnorm.testing.check_rule` compiled for a rule.

  ``check_rule`` keeps the rule's compiled programs by the rule (the function object), its
  keyword arguments and the shapes and dtypes of its arguments, so that checking the same rule
  on new values of the same shapes compiles nothing. Call this after changing what the same
  function object computes (registering another JVP or batching rule for a primitive it uses,
  rebinding a global it reads), as ``jax.clear_caches()`` is needed for a ``jax.jit`` function
  then. The float64 oracle's programs are keyed by the reference's traced graph and need no
  clearing; the reference's traced graphs, kept by the reference function alike, go too.
  """
  _PROGRAMS.clear()
  _TRACED.clear()


# Compiled oracles by reference graph (its jaxpr's text, which names every shape and dtype),
# most recent last: a check of the same reference at the same shapes (another dtype of the rule,
# another backend, a repeated configuration, another seed) reuses the programs with its own
# inputs, constants and multipliers. Bounded in entries (the least recently used go first).
_ORACLES = collections.OrderedDict()
_ORACLES_MAX = 64

# The oracle is compiled at XLA's lowest backend optimization level: it runs once or a few times
# per check on small float64 inputs, so its compile time is what a check pays (tanh on a (4, 8)
# input: 5 oracle programs in 5.4 s at the default level, 2.9 s at level 0, the whole first
# check 10.4 -> 6.5 s; docs/perf-notes.md, issue 65). The rule's own programs keep the caller's
# level: they are what is being checked.
_ORACLE_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def _oracle_entry(closed, z64, key):
  """``(oracle_fn, tree)`` of the float64 reference ``closed`` (a jaxpr and its constants),
  kept in :data:`_ORACLES` under ``key`` (its text; None: built afresh, not kept);
  :func:`_runner` makes of it ``run(consts, *z64)``: the reference at ``z64``, its condition
  magnitude and its scale, flattened (``tree`` unflattens them).

  One program, traced once: the values of the reference's rounding sites, their multipliers
  hashed on the device (:func:`~jaxnorm.testing._condition.multipliers`; the seed an
  argument), the magnitude and the scale, compiled with the reference's own constants as
  arguments rather than literals (compiling a 12 x 8200 LayerNorm's oracle took 4.1 s with its
  random signs inside, 1.4 s as arguments; the same graph with other constants is the same
  program). Two programs with the multipliers hashed by NumPy in between cost a later call of
  a small function a third of its time (docs/perf-notes.md, issue 65).
  """
  if key is None or key not in _ORACLES:
    ref = lambda consts, *b: eval_jaxpr(closed.jaxpr, consts, *b)  # noqa: E731

    def oracle_fn(consts, seed, *a):
      f = lambda *b: ref(consts, *b)  # noqa: E731
      mults = multipliers(sites(f, a), seed, _DIRECTIONS)
      return (*magnitude(f, a, mults), scale(f, a))

    shape = jax.eval_shape(lambda *a: ref(list(closed.consts), *a), *z64)
    entry = (jax.jit(oracle_fn, compiler_options=_ORACLE_COMPILER_OPTIONS),
             jax.tree_util.tree_structure((shape, shape, shape)))
    if key is None:
      return entry
    _ORACLES[key] = entry
    while len(_ORACLES) > _ORACLES_MAX:
      _ORACLES.popitem(last=False)
  _ORACLES.move_to_end(key)
  return _ORACLES[key]


def _runner(entry, seed):
  oracle_fn, tree = entry

  def run(consts, *z64):
    values, m, a = oracle_fn(consts, np.uint32(seed), *z64)
    return jax.tree_util.tree_leaves((values, m, a))

  return run, tree
