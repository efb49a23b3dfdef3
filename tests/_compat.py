"""Spellings that differ across the JAX and Flax versions the package declares.

CI runs the core tests on the oldest declared versions (``.ci/floor.txt``, equal to the floors
in ``pyproject.toml``) as well as on the newest, so a test that needs an API that was added or
moved inside that range takes it from here.
"""

from __future__ import annotations

from collections.abc import Iterator

import flax
import jax.extend.core

_FLAX = tuple(int(part) for part in flax.__version__.split(".")[:3])

# The nnx.Param metadata key that names a parameter's mesh axes (Flax 0.12.4 renamed it).
SHARDING_METADATA = "out_sharding" if _FLAX >= (0, 12, 4) else "sharding_names"


def jaxprs_in_params(params: dict) -> Iterator[jax.extend.core.Jaxpr]:
  """The sub-jaxprs held in an equation's parameters (``jit``'s, ``custom_vjp_call``'s, ...).

  ``jax.extend.core.jaxprs_in_params`` does this from jax 0.10 on; this walks the same values
  (a jaxpr, a closed jaxpr, or a tuple/list of them) on every declared version.
  """
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jax.extend.core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax.extend.core.Jaxpr):
        yield item
