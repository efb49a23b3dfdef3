r"""The condition magnitude :math:`M`: how much rounding can move each element of a result.

The standard model of floating-point rounding has every operation return its exact value times
:math:`(1 + \delta)`, :math:`|\delta| \le \varepsilon`. :func:`magnitude` applies it to the
reference's float64 computation (its jaxpr, autodiff included): every input, every result and
every operand of a sum (``reduce_sum``, ``dot_general``, ``cumsum``: a sum rounds once per term,
so a cancelling sum of large terms is as uncertain as its terms, not as its result) is
multiplied by :math:`1 + \epsilon r` with random signs :math:`r = \pm 1`, and :math:`M_i` is the
largest :math:`|\partial\,\mathrm{out}_i / \partial \epsilon|` at :math:`\epsilon = 0` over a
few sign draws. :math:`\varepsilon M_i` is then the first-order rounding error of a stable
evaluation of the reference in a precision :math:`\varepsilon`: large where the result is a
difference of large intermediates (LayerNorm's input gradient at ``d = 2``) or the inputs are
ill-conditioned (a row with a large mean/std ratio), small where neither happens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._jax_compat import Literal

__all__ = ["magnitude"]

# Operations whose operands are perturbed too (sums: each term is rounded once).
_SUMS = frozenset({"reduce_sum", "dot_general", "cumsum"})
# Call primitives whose body is interpreted (perturbed inside) rather than bound whole.
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"})


def _is_float(a) -> bool:
  return jnp.issubdtype(jnp.result_type(a), jnp.floating)


@jax.custom_jvp
def _site(a, r, eps):
  """``a * (1 + eps . r)`` to first order: the value ``a`` itself (exactly, infinities too), the
  tangent ``da + (deps . r) a`` (``r``: one sign array per direction, stacked)."""
  del r, eps
  return a


@_site.defjvp
def _site_jvp(primals, tangents):
  a, r, _ = primals
  da, _, deps = tangents
  return a, da + jnp.tensordot(deps, r, axes=1) * a


class _Perturb:
  """Marks each value it is called on as a rounding site: a fresh random sign array per call
  and direction ``k`` (from direction ``k``'s own generator, fixed at trace)."""

  def __init__(self, eps, seed, directions):
    self.eps = eps
    self.rngs = [np.random.default_rng(seed * 1000 + k) for k in range(directions)]

  def __call__(self, a):
    if not _is_float(a):
      return a
    dt = np.dtype(jnp.result_type(a))
    r = np.stack([g.choice([-1.0, 1.0], size=np.shape(a)).astype(dt) for g in self.rngs])
    return _site(a, r, self.eps.astype(dt))


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
    if name in _SUMS:
      invals = [perturb(a) for a in invals]
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


def magnitude(fn, z, *, directions: int = 3, seed: int = 0):
  """``(values, M)`` of ``fn(*z)`` (a list of arrays), traced: call it inside ``jax.jit``.

  Args:
    fn: a function of the arrays ``z`` returning a list of arrays (no custom rules needed).
    z: its arguments (perturbed too: the inputs' own rounding).
    directions: how many random sign draws :math:`M` is the largest over.
    seed: seeds the signs.

  Returns:
    ``fn(*z)`` and, per output, :math:`M` (the same shape), as lists.
  """
  closed = jax.make_jaxpr(fn)(*z)

  def run(eps):
    perturb = _Perturb(eps, seed, directions)
    return _eval(closed.jaxpr, closed.consts, [perturb(a) for a in z], perturb)

  # The derivative along each direction's unit vector, batched: the evaluation itself (the
  # values, unperturbed) runs once and only the tangents are per direction.
  zero = jnp.zeros((directions,), jnp.result_type(float))
  values, tangents = jax.vmap(lambda t: jax.jvp(run, (zero,), (t,)), out_axes=(None, 0))(
      jnp.eye(directions, dtype=zero.dtype))
  return list(values), [jnp.max(jnp.abs(t), axis=0) for t in tangents]
