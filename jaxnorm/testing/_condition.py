r"""The condition magnitude :math:`M`: how much rounding can move each element of a result.

The standard model of floating-point rounding has every operation return its exact value times
:math:`(1 + \delta)`, :math:`|\delta| \le \varepsilon`. :func:`magnitude` applies it to the
reference's float64 computation (its jaxpr, autodiff included): every input, every result and
every operand of a sum, an addition or a subtraction (``reduce_sum``, ``dot_general``,
``cumsum``, ``add``, ``sub``, ``add_any``: a sum rounds once per term, and a difference of two
computed values is as uncertain as they are even where the reference's own graph cancels them
exactly, e.g. log_softmax's Hessian at ``d = 1``) is multiplied by :math:`1 + \epsilon r`, and
:math:`M_i` is the largest :math:`|\partial\,\mathrm{out}_i / \partial \epsilon|` at
:math:`\epsilon = 0` over a few directions. The multipliers :math:`r \in \pm[0.5, 1)` are
hashes of each element's own value, its site and the direction (:func:`multipliers`), never of
its position: an elementwise function's element gets the same :math:`M` alone and in any
batch, and two equal contributions cannot cancel exactly (random signs :math:`\pm 1` did, one
time in 16 per element). :math:`\varepsilon M_i` is then the first-order rounding error of a
stable evaluation of the reference in a precision :math:`\varepsilon`: large where the result
is a difference of large intermediates (LayerNorm's input gradient at ``d = 2``) or the inputs
are ill-conditioned (a row with a large mean/std ratio), small where neither happens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._jax_compat import Literal

__all__ = ["magnitude", "multipliers", "sites"]

# Operations whose operands are perturbed too: sums (each term is rounded once) and additions
# and subtractions (a difference of two computed values is as uncertain as they are, however
# exactly it cancels in the reference's own graph: a rule computes them along other paths).
_SUMS = frozenset({"reduce_sum", "dot_general", "cumsum", "add", "sub", "add_any"})
# Call primitives whose body is interpreted (perturbed inside) rather than bound whole.
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"})


def _is_float(a) -> bool:
  return jnp.issubdtype(jnp.result_type(a), jnp.floating)


@jax.custom_jvp
def _site(a, r, eps):
  """``a * (1 + eps r)`` to first order: the value ``a`` itself (exactly, infinities too), the
  tangent ``da + (deps r) a`` (``r``: one direction's multipliers, ``a``'s shape; the
  directions are a ``vmap`` over ``r``, which leaves the value unbatched)."""
  del r, eps
  return a


@_site.defjvp
def _site_jvp(primals, tangents):
  a, r, _ = primals
  da, _, deps = tangents
  return a, da + (deps * r) * a


def _mix(h: np.ndarray) -> np.ndarray:
  """A 32-bit integer hash (MurmurHash3's finalizer) of each element of the uint32 array ``h``."""
  h = h ^ (h >> np.uint32(16))
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> np.uint32(13))
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> np.uint32(16))


def multipliers(values, seed: int, directions: int) -> list:
  """Per rounding site (``values``: each site's float64 value, in site order) the
  ``(directions, *shape)`` multipliers ``+-[0.5, 1)``: hashes of the element's value (read in
  float32, its last 4 bits dropped), the site's index, the seed and the direction. The same
  value at the same site gets the same multipliers wherever it sits and whatever surrounds it,
  so an elementwise function's budget never depends on the element's neighbours."""
  out = []
  with np.errstate(over="ignore", invalid="ignore"):
    for n, v in enumerate(values):
      v = np.asarray(v)
      bits = np.asarray(v, np.float32).view(np.uint32) >> np.uint32(4)
      key = np.uint32((n * 0x27D4EB2F + seed * 0x165667B1 + 1) % 2 ** 32)
      h0 = _mix(bits ^ key)
      rows = []
      for k in range(directions):
        h = _mix(h0 + np.uint32((0x9E3779B9 * (k + 1)) % 2 ** 32))
        size = 0.5 + (h & np.uint32(0xFFFFFF)).astype(v.dtype) * (0.5 / 2 ** 24)
        rows.append(np.where((h >> np.uint32(31)) == 1, -size, size))
      out.append((np.stack(rows) if rows else np.zeros((0, *v.shape))).astype(v.dtype))
  return out


class _Perturb:
  """Marks each value it is called on as a rounding site (the ``n``-th call is site ``n``,
  fixed at trace). Collecting (``mults`` None): records each site's value and returns it
  unchanged. Perturbing: multiplies it by ``1 + eps . r`` with the site's multipliers ``r``."""

  def __init__(self, eps, mults):
    self.eps, self.mults, self.values = eps, mults, []

  def __call__(self, a):
    if not _is_float(a):
      return a
    if self.mults is None:
      self.values.append(a)
      return a
    r = self.mults[len(self.values)]
    self.values.append(None)
    return _site(a, r, self.eps.astype(jnp.result_type(a)))


def _bind_params(eqn):
  """``(subfuns, params)`` to bind ``eqn``'s primitive with: jax >= 0.9 returns the params
  alone from ``get_bind_params``, earlier versions a pair."""
  bound = eqn.primitive.get_bind_params(eqn.params)
  if isinstance(bound, tuple) and len(bound) == 2 and isinstance(bound[1], dict):
    return bound
  return (), bound


def _eval(jaxpr, consts, args, perturb):
  env = {}

  def read(v):
    return v.val if isinstance(v, Literal) else env[v]

  for v, a in zip(jaxpr.constvars, consts):
    env[v] = a
  for v, a in zip(jaxpr.invars, args):
    env[v] = a
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    if name in _SUMS:  # each operand's own rounding (a literal constant is exact)
      invals = [a if isinstance(v, Literal) else perturb(a) for v, a in zip(eqn.invars, invals)]
    if name in _CALLS and "jaxpr" in eqn.params and hasattr(eqn.params["jaxpr"], "jaxpr"):
      sub = eqn.params["jaxpr"]
      outs = _eval(sub.jaxpr, sub.consts, invals, perturb)
    else:
      subfuns, params = _bind_params(eqn)
      outs = eqn.primitive.bind(*subfuns, *invals, **params)
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, o in zip(eqn.outvars, outs):
      env[v] = perturb(o)
  return [read(v) for v in jaxpr.outvars]


def sites(fn, z) -> list:
  """The value of every rounding site of ``fn(*z)``, in site order (traced: inside ``jax.jit``).
  :func:`multipliers` turns them into :func:`magnitude`'s ``mults``."""
  closed = jax.make_jaxpr(fn)(*z)
  perturb = _Perturb(None, None)
  _eval(closed.jaxpr, closed.consts, [perturb(a) for a in z], perturb)
  return perturb.values


def magnitude(fn, z, mults):
  """``(values, M)`` of ``fn(*z)`` (a list of arrays), traced: call it inside ``jax.jit``.

  Args:
    fn: a function of the arrays ``z`` returning a list of arrays (no custom rules needed).
    z: its arguments (perturbed too: the inputs' own rounding).
    mults: per rounding site, its ``(directions, *shape)`` multipliers (:func:`multipliers`
      of :func:`sites`); :math:`M` is the largest over the directions.

  Returns:
    ``fn(*z)`` and, per output, :math:`M` (the same shape), as lists.
  """
  closed = jax.make_jaxpr(fn)(*z)
  directions = int(mults[0].shape[0]) if mults else 1

  def run(eps, mults_d):
    perturb = _Perturb(eps, mults_d)
    return _eval(closed.jaxpr, closed.consts, [perturb(a) for a in z], perturb)

  # The derivative in eps along one direction's multipliers, batched over the directions (a
  # vmap over the multipliers): the evaluation itself (the values, unperturbed) runs once and
  # only the tangents are per direction; each site's tangent is elementwise (r_d a), with no
  # contraction over the directions.
  zero, one = jnp.zeros((), jnp.result_type(float)), jnp.ones((), jnp.result_type(float))
  values, tangents = jax.vmap(lambda m: jax.jvp(lambda e: run(e, m), (zero,), (one,)),
                              out_axes=(None, 0), axis_size=directions)(list(mults))
  return list(values), [jnp.max(jnp.abs(t), axis=0) for t in tangents]
