r"""The tail check of a pointwise op (any entry of ``jaxnorm.OPS`` of the pointwise family): its
derivatives, far out and at its dtype's limits, against its oracle's, evaluated without rounding.

The op is :math:`y = \gamma\varphi(u) + \beta`, :math:`u = \alpha x + s`. Each parameter here
has ``x``'s shape, so every derivative is elementwise: the derived VJP (cotangent ones), the
derived JVP (one tangent of ones per argument) and the Jacobian's diagonal give, element by
element, :math:`\partial y/\partial x = \alpha\gamma\varphi'(u)`, :math:`\partial y/\partial\alpha
= x\gamma\varphi'(u)`, :math:`\partial y/\partial s = \gamma\varphi'(u)`,
:math:`\partial y/\partial\gamma = \varphi(u)` and :math:`\partial y/\partial\beta = 1`.

**The oracle** is the op's float64 oracle (``op.reference``, which differentiates its own
:math:`\varphi` by autodiff, never the library's slope): its ``jax.jvp`` program, traced once
at float64 scalars, run by an interpreter of the program's primitives in mpmath at 192 and at
384 bits. In float64 the oracle's own tails cancel (``1 - tanh^2`` is 0 past :math:`|u| \approx
19`, while the float32 value is representable up to 44), so float64 alone cannot judge them;
the two precisions must agree far inside the tolerance, or the check stops and says so.

**The points**, per dtype: :math:`|u|` on a grid from 0 to 1e4; the :math:`u` where the true
slope crosses 1e-3, the dtype's epsilon, 1e-12, 1e-20, 1e-30 and a few times the smallest
normal (found by bisection on the oracle's slope, so a new op gets its own tail points); and the
dtype's limits (:math:`x` at the largest finite value, at the smallest normal, :math:`\alpha` at
the smallest normal). Each :math:`u` is reached with :math:`\alpha` of 1, 1/64 (so :math:`x` is
large) and 4, with a shift where the op has one, and the scale 1 or -1.5. Every value is rounded
to the dtype first; the oracle sees the rounded values. Points whose true derivatives overflow
the dtype are left out.

**The tolerance** of a derivative :math:`D` at a point:

- the bracket: :math:`D` must lie within the oracle's values at :math:`u \pm \delta u`,
  :math:`\delta u = 2\epsilon_c(|\alpha x| + |u|)`, with :math:`\epsilon_c` the compute dtype's
  epsilon (float32 for float32, bfloat16 and float16 inputs). A computation in the compute dtype
  rounds :math:`\alpha x` and :math:`+ s` (half an epsilon each) and, inside the slope, the
  quantities built from :math:`u` (``u*u`` in erf's): it cannot be closer than the oracle at a
  :math:`u` moved by that much, and where :math:`\varphi'` is steep (:math:`e^{-u^2}` at
  :math:`u = 9`) that is most of the error;
- widened by :math:`8\epsilon_c + \epsilon_o` relative (8 ulps of the compute dtype for XLA's
  ``tanh``/``erf``/``exp``, measured at most 5: ``docs/derivations.md``; :math:`\epsilon_o`,
  the output dtype's epsilon, for the rounding of the result);
- and by an absolute floor from the smallest normals: :math:`\text{tiny}_c\,|c| +
  \text{tiny}_o`, where :math:`c` is the factor a slope is multiplied by (:math:`\alpha\gamma`,
  :math:`x\gamma`, :math:`\gamma`; 0 for :math:`\gamma` and :math:`\beta`). A slope below the
  compute dtype's smallest normal may be flushed to 0 (XLA:CPU flushes subnormals), and a result
  below the output's smallest normal may be too; anything above must be right. So a derivative
  that is exactly 0 where the true one is a representable normal fails.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import mpmath
import numpy as np

from jaxnorm._jax_compat import enable_x64

DTYPES = ("float32", "bfloat16", "float16")
PRECISIONS = (192, 384)  # bits of the two oracle evaluations that must agree
ULPS = 8.0  # relative tolerance in ulps of the compute dtype (on top of the u-bracket)

# ---------------------------------------------------------------------------------------------
# The oracle: the float64 oracle's JVP program, interpreted in mpmath.

_UNARY = {
    "neg": lambda a: -a, "abs": abs, "sign": mpmath.sign, "square": lambda a: a * a,
    "exp": mpmath.exp, "exp2": lambda a: mpmath.power(2, a), "log": mpmath.log,
    "log1p": mpmath.log1p, "expm1": mpmath.expm1, "sqrt": mpmath.sqrt,
    "rsqrt": lambda a: 1 / mpmath.sqrt(a), "cbrt": mpmath.cbrt, "tanh": mpmath.tanh,
    "sinh": mpmath.sinh, "cosh": mpmath.cosh, "asinh": mpmath.asinh, "sin": mpmath.sin,
    "cos": mpmath.cos, "tan": mpmath.tan, "atan": mpmath.atan, "erf": mpmath.erf,
    "erfc": mpmath.erfc, "erf_inv": mpmath.erfinv, "logistic": lambda a: 1 / (1 + mpmath.exp(-a)),
    "floor": mpmath.floor, "ceil": mpmath.ceil,
}
_BINARY = {
    "add": lambda a, b: a + b, "add_any": lambda a, b: a + b, "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "max": max, "min": min,
    "pow": mpmath.power, "atan2": mpmath.atan2, "gt": lambda a, b: a > b,
    "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b, "le": lambda a, b: a <= b,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "and": lambda a, b: a and b, "or": lambda a, b: a or b,
}
# Shapes and dtypes only: every value here is one element.
_SAME = {"convert_element_type", "reshape", "broadcast_in_dim", "squeeze", "expand_dims",
         "copy", "copy_p", "reduce_sum", "reduce_max", "reduce_min", "stop_gradient",
         "optimization_barrier", "reduce_precision"}


def _mp(value):
  value = np.asarray(value)
  if value.dtype == np.bool_:
    return bool(value)
  if value.size != 1:
    raise ValueError(f"the oracle interpreter takes one element per value, got a {value.shape} "
                     "constant")
  return mpmath.mpf(float(value.reshape(())))


def _sub_jaxpr(params):
  """The program a call-like primitive (jit, pjit, closed_call, remat, ...) runs, or None."""
  for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
    sub = params.get(key)
    if sub is not None:
      return (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
  return None


def _read(env, v):
  return _mp(v.val) if hasattr(v, "val") else env[v]


def _eval(eqns, env):
  """Runs ``eqns`` on the values in ``env`` (``{var: mpf or bool}``), adding their outputs."""
  for eqn in eqns:
    name, ins = eqn.primitive.name, [_read(env, v) for v in eqn.invars]
    if name in _UNARY:
      outs = [_UNARY[name](ins[0])]
    elif name in _BINARY:
      outs = [_BINARY[name](*ins)]
    elif name in _SAME:
      outs = [ins[0]]
    elif name == "integer_pow":
      outs = [ins[0] ** eqn.params["y"]]
    elif name == "select_n":
      outs = [ins[1 + int(ins[0])]]
    elif _sub_jaxpr(eqn.params) is not None:
      outs = _run(*_sub_jaxpr(eqn.params), ins)
    else:
      raise NotImplementedError(
          f"the tail oracle's interpreter (tests/_pointwise_tails.py) has no rule for the "
          f"primitive {name!r} of the oracle's program; add it to _UNARY/_BINARY there")
    env.update(zip(eqn.outvars, outs))


def _run(jaxpr, consts, args):
  env = {var: _mp(val) for var, val in zip(jaxpr.constvars, consts)}
  env.update(zip(jaxpr.invars, args))
  _eval(jaxpr.eqns, env)
  return [_read(env, v) for v in jaxpr.outvars]


class Oracle:
  """The exact partials of ``op.reference`` at one point, from its float64 JVP program.

  The program is ``jax.jvp(op.reference, primals, tangents)``'s tangent with both as inputs;
  its equations that do not read a tangent (the primal's) run once per point, the others once
  per argument, with that argument's tangent 1 and the others 0.
  """

  def __init__(self, op):
    self.op = op
    self.names = ("x",) + tuple(op.params)
    n = len(self.names)

    def tangent(*a):
      return jax.jvp(op.reference, a[:n], a[n:])[1]

    with enable_x64():
      closed = jax.make_jaxpr(tangent)(*[np.float64(0.5)] * (2 * n))
    jaxpr = closed.jaxpr
    reads = set(jaxpr.invars[n:])
    self._primal, self._tangent = [], []
    for eqn in jaxpr.eqns:
      if any(v in reads for v in eqn.invars if not hasattr(v, "val")):
        reads.update(eqn.outvars)
        self._tangent.append(eqn)
      else:
        self._primal.append(eqn)
    self._jaxpr, self._consts, self._n = jaxpr, closed.consts, n

  def partials(self, point: dict, bits: int, names=None) -> list:
    """``[dy/d name for name in names]`` (default ``self.names``) at ``point``
    (``{name: float}``), as mpf."""
    jaxpr, n = self._jaxpr, self._n
    with mpmath.workprec(bits):
      env = {var: _mp(val) for var, val in zip(jaxpr.constvars, self._consts)}
      env.update((v, mpmath.mpf(point[k])) for v, k in zip(jaxpr.invars[:n], self.names))
      _eval(self._primal, env)
      out = []
      for name in names or self.names:
        own = dict(env)
        own.update((v, mpmath.mpf(int(k == name))) for v, k in zip(jaxpr.invars[n:], self.names))
        _eval(self._tangent, own)
        out.append(_read(own, jaxpr.outvars[0]))
      return out

  def slope(self, u, bits: int = PRECISIONS[0]):
    """:math:`\\varphi'(u)` (``x = u``, ``alpha = 1``, no shift, unit scale)."""
    point = dict(x=u, alpha=1.0, shift=0.0, scale=1.0, bias=0.0)
    return self.partials(point, bits, ("x",))[0]


@functools.lru_cache(maxsize=None)
def oracle(op) -> Oracle:
  return Oracle(op)


@functools.lru_cache(maxsize=None)
def _crossing(op, target: float, sign: float):
  """A ``u`` of ``sign`` with ``|u|`` in ``[1, float32 max]`` where the slope crosses
  ``target`` (bisection on ``log|u|``), or None where it does not cross it there."""
  orc = oracle(op)
  lo_l, hi_l = 0.0, math.log(float(jnp.finfo(jnp.float32).max))

  def above(log_u):
    return abs(orc.slope(sign * math.exp(log_u))) > target

  if not above(lo_l) or above(hi_l):
    return None
  for _ in range(24):
    mid = 0.5 * (lo_l + hi_l)
    lo_l, hi_l = (mid, hi_l) if above(mid) else (lo_l, mid)
  return sign * math.exp(lo_l)


# ---------------------------------------------------------------------------------------------
# The points.


def _limits(dtype):
  out, comp = jnp.finfo(dtype), jnp.finfo(jnp.promote_types(dtype, jnp.float32))
  return out, comp


def points(op, dtype) -> dict:
  """``{name: float64 array}`` of the tail points for ``op`` in ``dtype``, each value exactly
  representable in ``dtype``."""
  orc = oracle(op)
  out, comp = _limits(dtype)
  big, tiny = float(out.max), float(out.tiny)
  targets = [1e-3, float(out.eps), float(comp.eps), 1e-12, 1e-20, 1e-30,
             4 * float(comp.tiny), 1.5 * float(comp.tiny), 1.05 * float(comp.tiny), 4 * tiny,
             1.5 * tiny, 1.05 * tiny]
  us = [0.0, 0.5, 1.0, 3.0, 9.0, 20.0, 44.0, 100.0, 1e3, 1e4]
  crossings = {_crossing(op, t, s) for t in sorted(set(targets)) for s in (1.0, -1.0)}
  us = [s * u for u in us for s in (1.0, -1.0)] + sorted(
      c for c in crossings if c is not None and abs(c) <= big)
  has_shift = "shift" in op.params
  rows = []
  for i, u in enumerate(us):
    for alpha in (1.0, 2.0 ** -6, 4.0):
      shift = 0.75 if has_shift and alpha != 1.0 else 0.0
      rows.append(((u - shift) / alpha, alpha, shift, (1.0, -1.5)[i % 2], 0.25))
  rows += [(s * big, a, 0.0, 1.0, 0.25) for s in (1.0, -1.0) for a in (1.0, 0.5, tiny)]
  rows += [(s * tiny, 1.0, 0.0, 1.0, 0.25) for s in (1.0, -1.0)] + [(1.0, tiny, 0.0, 1.0, 0.25)]
  table = np.array([r for r in rows if abs(r[0]) <= big], np.float64)
  table = np.asarray(jnp.asarray(table, dtype), np.float64)  # the values the op gets
  cols = dict(zip(("x", "alpha", "shift", "scale", "bias"), table.T))
  return {name: cols[name] for name in orc.names}


# ---------------------------------------------------------------------------------------------
# The op's derivatives (one jit per op and dtype) and the comparison.


def derivatives(op, args: tuple) -> dict:
  """``{(how, name): array}``: the derived VJP (``("vjp", name)``), JVP (``("jvp", name)``) and,
  where the op exports one, the Jacobian's diagonal (``("jacobian", "x")``), elementwise."""
  names = ("x",) + tuple(op.params)

  @jax.jit
  def run(*args):
    y, pullback = jax.vjp(op.fn, *args)
    out = {("vjp", n): g for n, g in zip(names, pullback(jnp.ones_like(y)))}
    for k, n in enumerate(names):
      tangents = tuple(jnp.ones_like(a) if i == k else jnp.zeros_like(a)
                       for i, a in enumerate(args))
      out[("jvp", n)] = jax.jvp(op.fn, args, tangents)[1]
    if op.jacobian is not None and names[-1] == "bias":
      out[("jacobian", "x")] = op.jacobian(*args[:-1])
    return out

  return run(*args)


def _cofactor(name, p):
  """The factor the slope is multiplied by in ``dy/d name`` (0 where no slope enters)."""
  return {"x": p["alpha"] * p["scale"], "alpha": p["x"] * p["scale"],
          "shift": p["scale"]}.get(name, 0.0)


def failures(op, dtype) -> list[str]:
  """Every derivative of ``op`` in ``dtype`` outside its tolerance at the tail points, each
  described in one line (empty: all within)."""
  orc = oracle(op)
  pts = points(op, dtype)
  out, comp = _limits(dtype)
  eps_c, tiny_c = float(comp.eps), float(comp.tiny)
  n = len(next(iter(pts.values())))
  rows = [{k: float(v[i]) for k, v in pts.items()} for i in range(n)]
  for r in rows:
    r.setdefault("scale", 1.0)
    r.setdefault("shift", 0.0)
  exact, bracket = [], []
  for r in rows:
    p_hi, p_lo = (orc.partials(r, b) for b in PRECISIONS[::-1])
    u = r["alpha"] * r["x"] + r["shift"]
    du = 2 * eps_c * (abs(r["alpha"] * r["x"]) + abs(u))
    moved = [orc.partials({**r, "x": r["x"] + s * du / r["alpha"]}, PRECISIONS[0])
             for s in (-1.0, 1.0)]
    exact.append((p_hi, p_lo))
    bracket.append(moved)
  keep = [i for i in range(n)
          if all(abs(float(p)) < float(out.max) / 2 for p in exact[i][0] + bracket[i][0]
                 + bracket[i][1])]
  args = tuple(jnp.asarray(pts[k][keep], dtype) for k in orc.names)
  got = {key: np.asarray(v, np.float64) for key, v in derivatives(op, args).items()}
  bad = []
  for j, i in enumerate(keep):
    r = rows[i]
    for (how, name), values in got.items():
      k = orc.names.index(name)
      o_dtype = out if how != "jacobian" else comp
      rtol = ULPS * eps_c + float(o_dtype.eps)
      floor = tiny_c * abs(_cofactor(name, r)) + float(o_dtype.tiny)
      want, check = exact[i][0][k], exact[i][1][k]
      if abs(want - check) > 1e-6 * (rtol * abs(want) + floor):
        raise AssertionError(f"the oracle of {op.name} is not precise enough at {r}: "
                             f"{float(want)!r} at {PRECISIONS[1]} bits, {float(check)!r} at "
                             f"{PRECISIONS[0]}")
      ends = [float(want), float(bracket[i][0][k]), float(bracket[i][1][k])]
      lo, hi = min(ends), max(ends)
      slack = rtol * max(abs(lo), abs(hi)) + floor
      g = float(values[j])
      if not lo - slack <= g <= hi + slack:
        u = r["alpha"] * r["x"] + r["shift"]
        bad.append(f"{op.name} {dtype} {how} d/d{name} at u={u:.9g} ({r}): got {g!r}, want "
                   f"{float(want)!r} (within [{lo - slack:.6g}, {hi + slack:.6g}])")
  return bad
