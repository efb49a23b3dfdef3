"""Units of work and the time budget: the probe-setting cache and :class:`OutOfBudget`.

Every piece of work an experiment does that costs more than its analysis is a *unit*: one
training run (:meth:`experiments.suite.runs.RunsMixin.train`, cached under
``<root>/runs/<label>-<hash>/``) or one probe setting (:meth:`UnitsMixin.cached`, cached under
``<root>/cache/<experiment>/<label>-<hash>.json``), keyed by a hash of everything that
determines its result. A unit computed once is loaded on every later invocation, so a cut run
loses at most the unit in progress. With a time budget (``deadline``), a unit that is not
cached is started only if it is expected to finish in time (expected: the longest unit of this
invocation so far); otherwise :class:`OutOfBudget` is raised and the suite stops, to be
continued by the same command.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable

from experiments.suite.registry import read_json, to_jsonable, write_json

__all__ = ["OutOfBudget", "UnitsMixin", "unit_hash"]

UNIT_CACHE_VERSION = 1


class OutOfBudget(Exception):
  """The next uncached unit would not finish before the invocation's deadline."""


def unit_hash(obj: Any) -> str:
  """The first 10 hex digits of the SHA-256 of ``obj`` as sorted JSON (the cache key of a unit)."""
  src = json.dumps(to_jsonable(obj), sort_keys=True)
  return hashlib.sha256(src.encode()).hexdigest()[:10]


class UnitsMixin:
  """The unit bookkeeping of :class:`~experiments.suite.context.Context`: ``root``,
  ``exp_name``, ``deadline``, ``longest_unit_s`` and ``units_computed`` are set by its
  ``__init__``."""

  def _start_unit(self, label: str) -> float:
    """Raises :class:`OutOfBudget` if a unit of the expected length would end past the deadline."""
    now = time.monotonic()
    if self.deadline is not None and now + self.longest_unit_s > self.deadline:
      raise OutOfBudget(f"{label}: expected {self.longest_unit_s:z.0f} s, "
                        f"{max(self.deadline - now, 0.0):z.0f} s of the budget left")
    return now

  def _end_unit(self, t0: float) -> float:
    wall = time.monotonic() - t0
    self.longest_unit_s = max(self.longest_unit_s, wall)
    self.units_computed += 1
    return wall

  def cached(self, label: str, key: Any, compute: Callable[[], Any]) -> Any:
    """The result of ``compute()`` for ``key``, computed once and cached as JSON.

    The cache file is ``<root>/cache/<experiment>/<label>-<hash of key>.json``; ``key`` must
    hold everything the result depends on (the model config, sizes, seed, preset data). The
    result goes through JSON either way (:func:`to_jsonable`), so a cached and a fresh result
    look the same to the caller.
    """
    digest = unit_hash({"v": UNIT_CACHE_VERSION, "key": key})
    path = self.root / "cache" / (self.exp_name or "suite") / f"{label.replace('/', '_')}-{digest}.json"
    if path.exists():
      return read_json(path)["result"]
    t0 = self._start_unit(label)
    result = to_jsonable(compute())
    wall = self._end_unit(t0)
    write_json(path, {"label": label, "key": key, "wall_s": wall, "result": result})
    return result
