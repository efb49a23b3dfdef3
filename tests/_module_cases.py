"""The case grid and input helpers shared by the NNX and Linen module tests (test_nnx, test_linen).

Both check jaxnorm's layers against Flax's on the same small input over the same grid of
(layer, input dtype, param dtype, mask, axes, use_scale, use_bias), so the grid lives here once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from _numerics import assert_allclose, loosest

SHAPE = (2, 3, 4)
# (reduction_axes, feature_axes): trailing, several trailing, a non-trailing axis (moved to
# the end and back), features narrower than the reduction (affine map outside the op), and
# both non-trailing and different.
AXES = [(-1, -1), ((1, 2), (1, 2)), (1, 1), ((1, 2), -1), ((0, 2), 1)]
AXES_IDS = ["last", "last2", "mid", "last2-feat-last", "outer-feat-mid"]

# The grid: every (input dtype, param dtype, axes) triple for each layer, with the mask and the
# use_scale/use_bias flags cycled so that every axes configuration and every dtype pair meets
# both masks and every flag combination (a covering design; the full product costs ~4x the
# compile time for no new code path).
DTYPES = ["float32", "float16", "bfloat16"]
PARAM_DTYPES = ["float32", "float16"]
FLAGS = {"LayerNorm": [(True, True), (True, False), (False, True), (False, False)],
         "RMSNorm": [(True, False), (False, False)]}
GRID = [
    (name, dt, pdt, (i + j + k) % 2 == 1, axes, *FLAGS[name][(2 * i + j + k) % len(FLAGS[name])])
    for name in ("LayerNorm", "RMSNorm")
    for i, dt in enumerate(DTYPES)
    for j, pdt in enumerate(PARAM_DTYPES)
    for k, axes in enumerate(AXES)
]


def grid_id(case) -> str:
  """The pytest id of one :data:`GRID` case."""
  name, dt, pdt, m, axes, us, ub = case
  return "-".join([name, dt, "p" + pdt, "mask" if m else "nomask", AXES_IDS[AXES.index(axes)],
                   "scale" if us else "noscale", "bias" if ub else "nobias"])


def partial_mask(shape=SHAPE):
  """A partial mask that keeps 2 of every 3 elements, in a pattern that differs per group.

  Every reduced group of 3 or more elements of SHAPE keeps at least 2 (a group with a single
  element has zero variance and a gradient of order 1/sqrt(epsilon): a useless comparison).
  """
  return jnp.asarray(np.indices(shape).sum(0) % 3 != 0)


def randomize(tree, seed=1):
  """Replaces every parameter with random values (scale = 1 would hide a misplaced scale)."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  new = [1.0 + 0.5 * jax.random.normal(k, l.shape, jnp.float32) for k, l in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, [n.astype(l.dtype) for n, l in zip(new, leaves)])


def assert_same_params(ours, theirs):
  """The same parameter tree as Flax's: structure, shapes, dtypes and initial values."""
  assert jax.tree.structure(ours) == jax.tree.structure(theirs)
  # Leaf by leaf: older Flax NNX states hold Variable objects, which compare by identity.
  ours, theirs = jax.tree.leaves(ours), jax.tree.leaves(theirs)
  assert [(a.shape, a.dtype) for a in ours] == [(a.shape, a.dtype) for a in theirs]
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)


def assert_matches_flax(x, ours, theirs):
  """``ours`` and ``theirs`` are ``(y, dparams, dx)`` of jaxnorm's and Flax's layer on ``x``.

  Same dtypes and shapes; ``y`` and ``dx`` within the tolerance of the less precise of ``x``'s
  and ``y``'s dtype; parameter cotangents (sums over rows) relative to their magnitude.
  """
  y1, dp1, dx1 = ours
  y2, dp2, dx2 = theirs
  assert y1.dtype == y2.dtype and y1.shape == y2.shape
  assert dx1.dtype == dx2.dtype == x.dtype
  tol = loosest(x.dtype, y1.dtype)  # e.g. dtype=bfloat16 rounds a float32 x first
  assert_allclose(y1, y2, tol)
  assert_allclose(dx1, dx2, tol)
  assert jax.tree.structure(dp1) == jax.tree.structure(dp2)
  for a, b in zip(jax.tree.leaves(dp1), jax.tree.leaves(dp2)):
    assert a.dtype == b.dtype
    scale = max(1.0, float(jnp.max(jnp.abs(b.astype(jnp.float32)))))
    assert_allclose(a / scale, b / scale, loosest(tol, a.dtype))
