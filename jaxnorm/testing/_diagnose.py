"""Why a check failed: what :func:`jaxnorm.testing.check_rule` adds to a failure's report.

Contract: nothing here changes a passing check. For a failed comparison :func:`explain` looks at
the elements over their budget and returns the outcome's cause and the words its message adds:

* ``"nondifferentiable"``: every such element sits where the reference is not differentiable
  (its float64 derivative jumps within a relative ``1e-9`` of the input: a tie in ``maximum``,
  ``relu`` at 0, repeated eigenvalues) and the rule's result lies between the one-sided values,
  where the reference evaluated in the compute dtype is right;
* ``"outside_domain"``: at some of them, and at every one not explained by the above, the
  reference's own graph, evaluated in
  the compute dtype (float32 for float32 and 16-bit rules), misses the float64 oracle by more
  than the budget too (an intermediate overflows, ``sin`` of a huge argument): the input is
  outside the function's float domain, and no rule computing in that dtype could do better;
* ``"fail"``: a wrong result.

It also names the intermediates that overflow or underflow (below the dtype's normal range) in
either graph, and says when the rule computes in its 16-bit input dtype, with the declaration
(``Tolerance(compute_dtype=...)``) that accepts a rule doing so by design.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._jax_compat import Literal, enable_x64

# Operations whose result can underflow from nonzero operands, and the arithmetic ones (a rule
# "computes in" the dtype of their operands); layout and conversion operations are neither.
_UNDERFLOW = frozenset({"mul", "div", "exp", "exp2", "logistic", "integer_pow", "pow", "square",
                        "erfc", "dot_general"})
_ARITH = _UNDERFLOW | {"add", "sub", "add_any", "log", "log1p", "expm1", "tanh", "sin", "cos",
                       "tan", "sqrt", "rsqrt", "cbrt", "erf", "erf_inv", "atan2", "reduce_sum",
                       "cumsum", "lgamma", "digamma"}
_NARROW = (jnp.float16, jnp.bfloat16)
# Parameters holding a call's body, walked rather than bound whole.
_BODIES = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _bind(eqn, invals):
  bound = eqn.primitive.get_bind_params(eqn.params)
  subfuns, params = bound if isinstance(bound, tuple) and len(bound) == 2 else ((), bound)
  outs = eqn.primitive.bind(*subfuns, *invals, **params)
  return list(outs) if eqn.primitive.multiple_results else [outs]


def _body(eqn):
  """The closed body of a call-like equation (jit, custom_jvp/vjp call, checkpoint), or None."""
  if eqn.primitive.name in ("scan", "while", "cond"):
    return None
  for name in _BODIES:
    b = eqn.params.get(name)
    if b is not None and hasattr(b, "eqns"):
      return b, []
    if b is not None and hasattr(b, "jaxpr") and hasattr(b.jaxpr, "eqns"):
      return b.jaxpr, list(b.consts)
  return None


def _record(name, invals, outs, found):
  floats = [np.asarray(a) for a in invals if hasattr(a, "dtype") and
            jnp.issubdtype(a.dtype, jnp.floating)]
  if name in _ARITH:
    for a in floats:
      if any(a.dtype == np.dtype(d) for d in _NARROW):
        found["narrow"][a.dtype.name] += 1
        break
  finite_in = all(bool(np.all(np.isfinite(a))) for a in floats)
  for o in outs:
    o = np.asarray(o)
    if o.dtype.kind != "f" or not o.size:
      continue
    if finite_in:
      n = int(np.sum(np.isinf(o)))
      if n:
        found["overflow"][f"{name} ({o.dtype.name})"] += n
    if name in _UNDERFLOW and all(a.shape in ((), o.shape) for a in floats):
      nonzero = np.ones(o.shape, bool)
      for a in floats:
        nonzero &= np.broadcast_to(a != 0, o.shape)
      n = int(np.sum(nonzero & np.isfinite(o) & (np.abs(o.astype(np.float64)) <
                                                  float(jnp.finfo(o.dtype).tiny))))
      if n:
        found["underflow"][f"{name} ({o.dtype.name})"] += n


def _walk(jaxpr, consts, args, found):
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  read = lambda v: v.val if isinstance(v, Literal) else env[v]  # noqa: E731
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    body = _body(eqn)
    if body is not None and len(body[0].invars) == len(invals):
      outs = _walk(body[0], body[1], invals, found)
    else:
      outs = _bind(eqn, invals)
      _record(eqn.primitive.name, invals, outs, found)
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def scan_graph(fn, z) -> dict:
  """``{"overflow"|"underflow"|"narrow": Counter}`` over ``fn(*z)``'s operations, run one by
  one: infinities from finite operands, results below the normal range from nonzero operands,
  and arithmetic on 16-bit operands (by dtype). Empty counters where ``fn`` cannot be traced."""
  found = {k: collections.Counter() for k in ("overflow", "underflow", "narrow")}
  try:
    closed = jax.make_jaxpr(fn)(*z)
    _walk(closed.jaxpr, list(closed.consts), list(z), found)
  except Exception:  # noqa: BLE001 (a diagnosis never replaces the check's own verdict)
    pass
  return found


def _counts(counter) -> str:
  return ", ".join(f"{k} at {n} element{'s' if n > 1 else ''}" for k, n in counter.most_common(4))


def describe(rule_found: dict, ref_found: dict, ref_dtype, tol_dtype) -> list:
  """The sentences a failure's message adds about its intermediates."""
  words = []
  for who, found in (("the rule's graph", rule_found), (f"the reference's {ref_dtype} graph",
                                                          ref_found)):
    if found["overflow"]:
      words.append(f"overflow to inf in {who}: {_counts(found['overflow'])}")
    if found["underflow"]:
      words.append(f"underflow below the normal range in {who}: {_counts(found['underflow'])}")
  narrow = rule_found["narrow"]
  if narrow:
    dt, n = narrow.most_common(1)[0]
    if tol_dtype is None or jnp.dtype(tol_dtype) != jnp.dtype(dt):
      words.append(f"the rule computes in its 16-bit input dtype ({n} arithmetic operations on "
                   f"{dt} operands); a rule that does so by design declares "
                   f"Tolerance(compute_dtype=jnp.{dt})")
  return words


def jumps(expected, nearby, budget) -> np.ndarray:
  """Where the float64 oracle jumps by more than ``budget`` between ``expected`` and the oracles
  at nearby inputs ``nearby`` (a list): the reference is not differentiable there."""
  jump = np.zeros(expected.shape, bool)
  for e in nearby:
    with np.errstate(invalid="ignore"):
      jump |= ~(np.abs(e - expected) <= budget)
  return jump


def between(got, expected, nearby, budget) -> np.ndarray:
  """Whether ``got`` lies between the oracle's values at and near the input (within budget)."""
  stack = np.stack([expected, *nearby])
  lo, hi = np.nanmin(stack, 0) - budget, np.nanmax(stack, 0) + budget
  return (got >= lo) & (got <= hi)


def _native(p, ref_fn, z, in_axes):
  """The reference's function ``ref_fn`` evaluated with its floating leaves (and ``z``) in the
  compute dtype rather than float64: ``(values or None, its graph's findings, the dtype)``."""
  c = p.compute_dtype(z)
  zc = [jnp.asarray(a, c) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a
        for a in z]
  fn = ref_fn if in_axes is None else jax.vmap(ref_fn, in_axes=in_axes)
  p.native = c
  try:
    with p.context() if c != jnp.float64 else _x64():
      values = [np.asarray(a, np.float64) for a in jax.jit(lambda *a: fn(*a))(*zc)]
      return values, scan_graph(fn, zc), c.name
  except Exception:  # noqa: BLE001 (a reference that cannot run in that dtype: no verdict)
    return None, scan_graph(lambda: [], []), c.name
  finally:
    p.native = None


def _x64():
  return enable_x64()


def _nearby(p, ref_fn, z, in_axes, seed):
  """The float64 oracle at two inputs a relative ``1e-9`` (``1e-12`` for float64 rules) from
  ``z``, on either side along one random direction (every element moved, zeros too)."""
  rng = np.random.default_rng(seed)
  delta = 1e-12 if p.x64 else 1e-9
  shifts = []
  for a in z:
    a64 = np.asarray(a).astype(np.float64)
    scale = np.abs(a64) + 1e-30  # each element's own: a zero moves too
    shifts.append(delta * scale * rng.choice([-1.0, 1.0], size=a64.shape))
  try:
    return [p.oracle(ref_fn, [np.asarray(a).astype(np.float64) + sign * s
                              for a, s in zip(z, shifts)], in_axes, seed=seed)[0]
            for sign in (1.0, -1.0)]
  except Exception:  # noqa: BLE001
    return None


def explain(p, outcome, rule, entry, got, budgets, bads):
  """``outcome`` (a failed comparison) with its cause and diagnosis (module docstring).

  Args:
    p: the :class:`~jaxnorm.testing._problem._Problem`.
    outcome: the failed :class:`~jaxnorm.testing.Outcome`.
    rule: ``(function of the rule as run, its inputs)``.
    entry: the oracle's cache entry ``(expected, magnitude, (ref_fn, z, in_axes, seed,
      offset))``; ``offset``: where these results start among ``ref_fn``'s outputs.
    got, budgets, bads: the rule's results, their budgets and the elements over them.
  """
  import dataclasses

  expected, _, (ref_fn, z, in_axes, seed, off) = entry
  near = _nearby(p, ref_fn, z, in_axes, seed)
  native, ref_found, cname = _native(p, ref_fn, z, in_axes)
  n_bad = n_kink = n_out = 0
  for j, (a, e, b, bad) in enumerate(zip(got, expected, budgets, bads)):
    a64 = np.asarray(a).astype(np.float64)
    n_bad += int(bad.sum())
    out = np.zeros_like(bad)
    if native is not None:
      with np.errstate(invalid="ignore"):
        out = bad & ~(np.abs(native[off + j] - e) <= b)
    n_out += int(out.sum())
    if near is not None:
      others = [nb[off + j] for nb in near]
      n_kink += int(np.sum(bad & ~out & jumps(e, others, b) & between(a64, e, others, b)))
  words = describe(scan_graph(*rule), ref_found, cname, p.tol.compute_dtype)
  if n_kink == n_bad:  # where the reference in the compute dtype is right, and no other
    status = "nondifferentiable"
    words.insert(0, f"the reference is not differentiable at {'all' if n_bad > 1 else 'the'} "
                    f"{n_bad} failing element{'s' if n_bad > 1 else ''} (its float64 derivative "
                    "jumps within a relative 1e-9 of the input) and the rule's result lies "
                    "between its one-sided values")
  elif n_out and n_out + n_kink == n_bad:
    status = "outside_domain"
    words.insert(0, f"outside the function's {cname} domain: the reference itself, evaluated in "
                    f"{cname}, misses the float64 oracle beyond the budget at "
                    f"{n_out} of the {n_bad} failing elements")
  else:
    status = "fail"
    if n_kink:
      words.append(f"{n_kink} of the failing elements sit where the reference is not "
                   "differentiable")
  detail = outcome.detail + ("; " + "; ".join(words) if words else "")
  return dataclasses.replace(outcome, status=status, detail=detail)
