"""Spellings that differ across the JAX versions the package declares (``pyproject.toml``).

CI runs the core tests on the oldest declared jax/flax (``ci/floor.txt``) as well as on the
newest, so a test that needs an API renamed inside that range takes it from here.
"""

from __future__ import annotations

import jax

try:
  # jax >= 0.8: the context manager lives at the top level.
  enable_x64 = jax.enable_x64
except AttributeError:
  # Older jax: only under jax.experimental.
  from jax.experimental import enable_x64  # noqa: F401
