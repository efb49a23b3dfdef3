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

__all__ = ["magnitude", "multipliers", "scale", "sites"]

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


def multipliers(values, seed, directions: int) -> list:
  """Per rounding site (``values``: each site's float64 value, in site order) the
  ``(directions, *shape)`` multipliers ``+-[0.5, 1)``: hashes of the element's value (read in
  float32, its last 4 bits dropped), the site's index, the seed and the direction. The same
  value at the same site gets the same multipliers wherever it sits and whatever surrounds it,
  so an elementwise function's budget never depends on the element's neighbours.
  Traced or eager (``seed`` a uint32 scalar, an argument of the oracle's program): the hashes
  run on the device, no round trip to NumPy; a float32 subnormal value may read as 0 where the
  device flushes subnormals (its multiplier then another value's, as valid)."""
  seed = jnp.asarray(seed, jnp.uint32)
  steps = np.asarray([(0x9E3779B9 * (k + 1)) % 2 ** 32 for k in range(directions)], np.uint32)
  if not values:
    return []
  # Every site's elements hashed in one flat vector (the site index a per-element constant),
  # then split: one hash in the program instead of one per site (a hash per site made the
  # oracle's program 3.5x as slow to compile: docs/perf-notes.md, "Test-suite time").
  sizes = [int(np.prod(v.shape, dtype=np.int64)) for v in values]
  bits = jnp.concatenate([jnp.ravel(v.astype(jnp.float32)) for v in values])
  bits = jax.lax.bitcast_convert_type(bits, jnp.uint32) >> np.uint32(4)
  site_keys = np.repeat(np.asarray([(n * 0x27D4EB2F + 1) % 2 ** 32 for n in range(len(values))],
                                   np.uint32), sizes)
  h0 = _mix(bits ^ (site_keys + seed * np.uint32(0x165667B1)))
  h = _mix(h0[None] + jnp.asarray(steps)[:, None])
  wide = jnp.result_type(*[v.dtype for v in values])
  size = 0.5 + (h & np.uint32(0xFFFFFF)).astype(wide) * (0.5 / 2 ** 24)
  signed = jnp.where((h >> np.uint32(31)) == 1, -size, size)
  out, start = [], 0
  for v, n in zip(values, sizes):
    out.append(signed[:, start:start + n].reshape((directions,) + v.shape).astype(v.dtype))
    start += n
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


# The scale A (:func:`scale`): operations whose result's scale is the same operation of their
# operands' scales (linear in each floating operand, or a rearrangement of it), all >= 0.
_SCALE_SAME = frozenset({
    "reduce_sum", "cumsum", "dot_general", "mul", "integer_pow", "square", "reshape",
    "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice", "rev",
    "copy", "copy_p", "concatenate", "pad", "select_n", "gather", "convert_element_type",
    "reduce_max", "reduce_min", "max", "min", "dynamic_update_slice", "reduce_precision",
    "scatter-add", "scatter_add", "cumlogsumexp", "cummax", "cummin"})
# Sums and differences: the scale of a + b and of a - b is A(a) + A(b).
_SCALE_ADD = frozenset({"add", "sub", "add_any"})
_SCALE_ABS = frozenset({"neg", "abs", "sign", "stop_gradient"})


def _eval_scale(jaxpr, consts, args, scales):
  """Values and scales of ``jaxpr`` (:func:`scale`); ``scales[i]`` is None for a non-float."""
  env = {}

  def read(v):
    if isinstance(v, Literal):
      return v.val, (jnp.abs(v.val) if _is_float(v.val) else None)
    return env[v]

  for v, a in zip(jaxpr.constvars, consts):
    env[v] = (a, jnp.abs(a) if _is_float(a) else None)
  for v, a, sc in zip(jaxpr.invars, args, scales):
    env[v] = (a, sc)
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    vals = [a for a, _ in ins]
    name = eqn.primitive.name
    if name in _CALLS and "jaxpr" in eqn.params and hasattr(eqn.params["jaxpr"], "jaxpr"):
      sub = eqn.params["jaxpr"]
      pairs = _eval_scale(sub.jaxpr, sub.consts, vals, [s for _, s in ins])
      for v, pr in zip(eqn.outvars, pairs):
        env[v] = pr
      continue
    subfuns, params = _bind_params(eqn)
    outs = eqn.primitive.bind(*subfuns, *vals, **params)
    outs = list(outs) if eqn.primitive.multiple_results else [outs]
    floats = [s for _, s in ins if s is not None]
    if name in _SCALE_ADD and len(floats) == 2:
      out_scales = [floats[0] + floats[1]]
    elif name == "div" and ins[0][1] is not None:
      out_scales = [ins[0][1] / jnp.abs(vals[1])]
    elif name in _SCALE_ABS and ins[0][1] is not None:
      out_scales = [ins[0][1]]
    elif name in _SCALE_SAME and floats:
      try:
        sc = eqn.primitive.bind(*subfuns, *[a if s is None else s for a, s in ins], **params)
        out_scales = list(sc) if eqn.primitive.multiple_results else [sc]
      except Exception:  # noqa: BLE001 (an operand the rule cannot take as a scale)
        out_scales = [jnp.abs(o) for o in outs]
    else:  # a nonlinear function (exp, log, tanh, a custom rule...): its value's own magnitude
      out_scales = [jnp.abs(o) for o in outs]
    for v, o, sc in zip(eqn.outvars, outs, out_scales):
      env[v] = (o, jnp.maximum(jnp.abs(sc), jnp.abs(o)) if _is_float(o) else None)
  return [read(v) for v in jaxpr.outvars]


def scale(fn, z) -> list:
  r"""The scale :math:`A` of each element of ``fn(*z)``: the quantities it is built from
  evaluated with absolute values (traced: call it inside ``jax.jit``).

  Every floating input and constant counts as its magnitude; a sum or a difference as the sum
  of its operands' scales (``a - b`` is as large as ``|a| + |b|`` for rounding, however exactly
  it cancels), a product, a dot product and every rearrangement (reshape, broadcast, slice,
  select, ...) as the same operation of the scales, a quotient as the numerator's scale over
  the denominator's magnitude, and any other function (``exp``, ``log``, a custom rule) as the
  magnitude of its value. ``A >= |fn(*z)|`` elementwise. Where an exact result is 0 (or far
  below :math:`\varepsilon_C A`) the first-order magnitude :math:`M` can be 0 too (a product
  of two factors that both cancel is second order in the roundings), while a rule computing
  the same value along another path errs by a rounding of its building blocks:
  :math:`\varepsilon_C A` is that scale (``jaxnorm.testing.Tolerance``).
  """
  closed = jax.make_jaxpr(fn)(*z)
  pairs = _eval_scale(closed.jaxpr, closed.consts, list(z),
                      [jnp.abs(a) if _is_float(a) else None for a in z])
  return [sc for _, sc in pairs]
