"""Internal API: derivatives of the derived rules' own programs taken in float32 (second order).

Moved out of :mod:`jaxnorm.ops.norm.rules`, which uses them for the forward that keeps the
statistics, the backward and the tangent primitive's own JVP (``docs/derivations.md``, "Second
order in 16 bits").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["upcast", "wide_jvp", "wide_tangent"]


def upcast(tree):
  """``tree`` with every 16-bit floating array converted to float32 (None and others kept)."""
  def up(a):
    if a is not None and jnp.issubdtype(a.dtype, jnp.floating) and jnp.finfo(a.dtype).bits < 32:
      return a.astype(jnp.float32)
    return a
  return jax.tree_util.tree_map(up, tree)


def wide_tangent(fn, primals, tangents, out):
  """The tangent of ``fn`` at ``primals`` along ``tangents``, by autodiff on float32 copies of
  the 16-bit ones (each converted once), rounded once to the dtypes of ``out`` (``fn``'s value).

  Second order differentiates the derived rules' own programs (the forward that keeps the
  statistics, the backward, the tangent map). They read a 16-bit input through several views,
  each converted to float32 apart; autodiff's transpose of each convert rounds that use's
  cotangent to 16 bits, and the uses are then summed in 16 bits, where they may cancel
  (``docs/derivations.md``, "Second order in 16 bits"). Converted once, at entry, the uses are
  summed in float32 and rounded once.
  """
  _, t = jax.jvp(fn, upcast(primals), upcast(tangents))
  return jax.tree_util.tree_map(lambda t, o: t.astype(o.dtype), t, out)


def wide_jvp(fn, tangent_fn=None):
  """``fn`` (arrays and None in, a pytree of arrays and None out) with its own value, and a JVP
  that is :func:`wide_tangent` of ``tangent_fn(*primals)`` (default: ``fn`` itself). First
  order never differentiates these programs, so its programs are unchanged."""
  wrapped = jax.custom_jvp(fn)

  def rule(primals, tangents):
    out = wrapped(*primals)
    f = fn if tangent_fn is None else tangent_fn(*primals)
    return out, wide_tangent(f, primals, tangents, out)

  wrapped.defjvp(rule)
  return wrapped
