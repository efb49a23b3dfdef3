r"""``check_rule``: a custom derivative rule against autodiff of a plain float64 reference.

Every check compares a function of the rule (its value, VJP, JVP, under a transformation) with
the same function of the reference, evaluated by JAX's autodiff in float64 on the same input
values (``jax.enable_x64`` scoped to the oracle's evaluation), element by element, within the
budget of :class:`jaxnorm.testing.Tolerance`: ulps of the result's dtype plus the intermediate
roundings scaled by a condition magnitude measured on the oracle. Cotangents and tangents are
random (a plain ``sum()`` would give LayerNorm's input gradient as zero, and accept a backward
that returns zeros).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm.testing._condition import magnitude
from jaxnorm.testing._tolerance import Tolerance, ulp

__all__ = ["MODES", "TRANSFORMS", "Outcome", "Report", "RuleCheckError", "check_rule"]

MODES = ("rev", "fwd")
# The base checks run under jax.jit. eager: the same op by op, without jit. vmap: jax.vmap
# over every argument (batched parameters). vmap_unbatched: over the first argument only.
# grad2: reverse over reverse (and forward over reverse where forward mode exists).
# checkpoint: jax.checkpoint around the rule. scan: the rule as a lax.scan body. zeros:
# symbolic-zero cotangents and tangents (one argument or one output at a time).
TRANSFORMS = ("eager", "vmap", "vmap_unbatched", "grad2", "checkpoint", "scan", "zeros")
_DIRECTIONS = 2  # random sign draws of the condition magnitude
_SMALL = 48  # arrays up to this size are printed whole in a failure message


def _enable_x64():
  """``jax.enable_x64(True)`` (a context manager; jax.experimental's name before 0.8)."""
  enable = getattr(jax, "enable_x64", None)
  if enable is None or not callable(enable):  # pragma: no cover (older JAX)
    from jax.experimental import enable_x64 as enable
  return enable(True)


def _is_float(a) -> bool:
  return hasattr(a, "dtype") and jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating)


class RuleCheckError(AssertionError):
  """A rule failed :func:`check_rule`; the message names each failing check."""


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One check's result.

  Attributes:
    check: what was compared, e.g. ``"vmap(vjp), batched parameters"``.
    status: ``"pass"``, ``"fail"`` or ``"skip"``.
    worst: the largest error / budget ratio over the compared elements (<= 1 passes).
    worst_ulps: the error of that element in ulps of its dtype.
    detail: the worst element (failure) or why the check was skipped.
  """

  check: str
  status: str
  worst: float = 0.0
  worst_ulps: float = 0.0
  detail: str = ""


@dataclasses.dataclass
class Report:
  """Every check's :class:`Outcome`; true when none failed (``assert report, report``)."""

  outcomes: list
  inputs: str

  @property
  def ok(self) -> bool:
    return not self.failures

  @property
  def failures(self) -> list:
    return [o for o in self.outcomes if o.status == "fail"]

  def __bool__(self) -> bool:
    return self.ok

  def __str__(self) -> str:
    lines = [f"{o.status:4}  {o.check}: " + (o.detail if o.status != "pass" else
                                               f"worst {o.worst_ulps:.3g} ulp, "
                                               f"{o.worst:.2g} of the budget")
             for o in self.outcomes]
    return "\n".join(lines + ["inputs:", self.inputs])


def _describe(names, values) -> str:
  out = []
  for name, a in zip(names, values):
    a = np.asarray(a)
    head = f"  {name}: {a.dtype}{list(a.shape)}"
    if a.size <= _SMALL:
      body = np.array2string(a.astype(np.float64) if a.dtype.kind == "f" else a,
                             precision=8, separator=", ", max_line_width=96)
      out.append(head + " = " + body.replace("\n", "\n    "))
    else:
      f = a.astype(np.float64) if a.dtype.kind == "f" else a
      out.append(head + f" (min {np.nanmin(f):.4g}, max {np.nanmax(f):.4g})")
  return "\n".join(out)


def _second(a: np.ndarray) -> np.ndarray:
  """A second example for a batch: ``a`` reversed along every axis, or ``0.75 a`` where that
  changes nothing (a scalar, a palindrome), so a parameter differs between the examples."""
  b = np.flip(a)
  if np.array_equal(b, a, equal_nan=True):
    b = (a.astype(np.float64) * 0.75).astype(a.dtype)
  return np.array(b, copy=True)  # ascontiguousarray would make a 0-d parameter 1-d


class _Problem:
  """The rule, the reference and the arguments, as functions of the differentiable leaves."""

  def __init__(self, rule, reference, args, kwargs, nondiff_argnums, tolerance, nonfinite,
               seed):
    if not callable(rule) or not callable(reference):
      raise TypeError(f"rule and reference must be callables, got {type(rule).__name__} and "
                      f"{type(reference).__name__}.")
    if not isinstance(args, (tuple, list)):
      raise TypeError(f"args must be a tuple of the rule's positional arguments, got "
                      f"{type(args).__name__}; wrap a single argument: args=(x,).")
    nondiff = tuple(nondiff_argnums)
    for i in nondiff:
      if not isinstance(i, int) or not -len(args) <= i < len(args):
        raise ValueError(f"nondiff_argnums must hold indices of args (0 to {len(args) - 1}), "
                         f"got {nondiff_argnums!r}.")
    nondiff = {i % len(args) for i in nondiff}
    if nonfinite not in ("any", "match"):
      raise ValueError(f"nonfinite must be 'any' or 'match', got {nonfinite!r}.")
    self.rule, self.reference = rule, reference
    self.kwargs = dict(kwargs or {})
    self.tol, self.nonfinite = tolerance, nonfinite
    self.rng = np.random.default_rng(seed)
    self.cache = {}
    flat, self.treedef = jax.tree_util.tree_flatten_with_path(tuple(args))
    self.names = ["args" + jax.tree_util.keystr(path) for path, _ in flat]
    self.fixed = [np.asarray(leaf) if hasattr(leaf, "dtype") else leaf for _, leaf in flat]
    self.diff = [i for i, (path, leaf) in enumerate(flat)
                 if path[0].idx not in nondiff and _is_float(leaf)]
    self.arg_of = [flat[i][0][0].idx for i in self.diff]
    if not self.diff:
      raise ValueError("args hold no floating array to differentiate (all leaves are "
                       "non-float or in nondiff_argnums).")
    self.x64 = any(_is_float(v) and jnp.dtype(v.dtype) == jnp.float64 for v in self.fixed)
    self.z0 = [self.fixed[i] for i in self.diff]
    names = []

    def probe(*z):
      names[:], values = self._outputs(rule, z, False, None)
      return values

    with self.context():
      self.out_avals = list(jax.eval_shape(probe, *self.z0))
    self.out_paths = names
    if not self.out_avals:
      raise ValueError("the rule returns no floating array to compare.")

  # ------------------------------------------------------------------ building functions

  def context(self):
    """Where the rule runs: with float64 switched on only if an argument is float64."""
    return _enable_x64() if self.x64 else contextlib.nullcontext()

  def _outputs(self, f, z, f64, subset):
    leaves = list(self.fixed)
    positions = range(len(self.diff)) if subset is None else subset
    for pos, v in zip(positions, z):
      leaves[self.diff[pos]] = v
    leaves = [jnp.asarray(v, jnp.float64) if f64 and _is_float(v) else
              (jnp.asarray(v) if hasattr(v, "dtype") else v) for v in leaves]
    out = f(*self.treedef.unflatten(leaves), **self.kwargs)
    flat = jax.tree_util.tree_flatten_with_path(out)[0]
    keep = [(p, o) for p, o in flat if _is_float(o)]
    return ["out" + jax.tree_util.keystr(p) for p, _ in keep], [o for _, o in keep]

  def primal(self, f, f64, *, wrap=None, subset=None, outs=None):
    """``f`` as a function of the differentiable leaves (of ``subset``, the others fixed at
    their values) returning its floating outputs (those of ``outs``) as a list."""

    def h(*z):
      values = self._outputs(f, z, f64, subset)[1]
      return [values[k] for k in (range(len(values)) if outs is None else outs)]

    return h if wrap is None else wrap(h)

  # ------------------------------------------------------------------ random draws

  def draw(self, like) -> np.ndarray:
    """A standard normal array of ``like``'s shape and dtype (a tangent or a cotangent)."""
    return self.rng.standard_normal(like.shape).astype(np.dtype(like.dtype))

  # ------------------------------------------------------------------ the comparison

  def oracle(self, ref_fn, z, in_axes=None):
    """``(expected, magnitude)``: ``ref_fn`` at ``z`` in float64 and its condition magnitude
    (:mod:`jaxnorm.testing._condition`), both lists of float64 NumPy arrays."""
    seed = int(self.rng.integers(2 ** 16))
    with _enable_x64():
      fn = ref_fn if in_axes is None else jax.vmap(ref_fn, in_axes=in_axes)
      run = jax.jit(lambda *z64: magnitude(fn, z64, directions=_DIRECTIONS, seed=seed))
      e, m = run(*[np.asarray(a).astype(np.float64) for a in z])
      e = [np.asarray(a, np.float64) for a in e]
      m = [np.asarray(a, np.float64) for a in m]
    return e, m

  def compare(self, check, got, expected, magnitude, names):
    """An :class:`Outcome` and the per-element budgets (for the adjoint identity)."""
    worst, worst_ulps, detail, budgets, failed = -1.0, 0.0, "", [], False
    for name, a, e, m in zip(names, got, expected, magnitude):
      a = np.asarray(a)
      if a.shape != e.shape:
        return Outcome(check, "fail", np.inf, np.inf,
                       f"{name}: shape {a.shape}, the oracle's {e.shape}"), None
      dt = a.dtype
      a64 = a.astype(np.float64)
      budget = self.tol.budget(e, m, dt)
      budgets.append(budget)
      fin = np.isfinite(e)
      err = np.abs(a64 - e)
      # A value beyond the dtype's range rounds to an infinity: the same infinity is exact.
      big = fin & (np.abs(e) > float(jnp.finfo(dt).max))
      over_ok = big & np.isinf(a64) & (np.sign(a64) == np.sign(e))
      checked = fin & np.isfinite(budget) & ~over_ok
      bad = checked & (~np.isfinite(a64) | (err > budget))
      if self.nonfinite == "match":
        nan_e, nan_a = np.isnan(e), np.isnan(a64)
        bad |= (~fin & ((nan_e != nan_a) | (~nan_e & (a64 != e))))
      ratio = np.where(checked, err / budget, -1.0)
      ratio = np.where(bad, np.where(np.isfinite(ratio), ratio, np.inf), ratio)
      if ratio.size and ratio.max() > worst:
        idx = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        worst = float(ratio[idx])
        u = ulp(e[idx], dt)
        worst_ulps = float(err[idx] / u) if np.isfinite(err[idx]) else np.inf
        with np.errstate(over="ignore"):
          kappa = float(m[idx] / max(abs(e[idx]), 1e-300)) if np.isfinite(m[idx]) else np.inf
        detail = (f"{name}{[int(i) for i in idx]}: got {float(a64[idx]):.9g}, float64 oracle "
                  f"{float(e[idx]):.17g}, "
                  f"error {worst_ulps:.3g} ulp of {dt.name}, allowed {budget[idx] / u:.3g} ulp "
                  f"(condition {kappa:.3g}; {int(bad.sum())} of {a.size} elements over)")
      failed |= bool(bad.any())
    status = "fail" if failed else "pass"
    return Outcome(check, status, max(worst, 0.0), worst_ulps,
                   detail if failed else ""), budgets

  def split_oracle(self, ref_fn, z, counts: dict):
    """Computes one oracle whose outputs are several checks' (``counts``: key -> how many
    outputs, in order) and caches each check's part under its key."""
    expected, magnitude = self.oracle(ref_fn, z)
    i = 0
    for key, k in counts.items():
      self.cache[key] = expected[i:i + k], magnitude[i:i + k]
      i += k

  def run_split(self, mode, rule_fn, z, parts):
    """Runs ``rule_fn(*z)`` once and compares its consecutive outputs with the cached oracle
    of each ``(key, names)`` of ``parts``: ``{key: (outcome, got, budgets)}``."""
    try:
      with self.context():
        got = [np.asarray(a) for a in rule_fn(*[jnp.asarray(a) for a in z])]
    except Exception as exc:  # a rule that fails under a transformation fails the check
      detail = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
      return {key: (Outcome(key + mode, "fail", np.inf, np.inf, detail), None, None)
              for key, _ in parts}
    out, i = {}, 0
    for key, names in parts:
      sub = got[i:i + len(names)]
      i += len(names)
      outcome, budgets = self.compare(key + mode, sub, *self.cache[key], names)
      out[key] = (outcome, sub, budgets)
    return out

  def run(self, check, rule_fn, ref_fn, z, names, in_axes=None, key=None):
    """Runs ``rule_fn(*z)`` and compares it with the oracle: ``(outcome, got, budgets)``.

    ``key`` names the oracle's computation: checks with the same key (the VJP eagerly, under
    ``jit`` and ``jax.checkpoint``) reuse its values instead of recomputing them.
    """
    try:
      with self.context():
        got = [np.asarray(a) for a in rule_fn(*[jnp.asarray(a) for a in z])]
    except Exception as exc:  # a rule that fails under a transformation fails the check
      return Outcome(check, "fail", np.inf, np.inf,
                     f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"), None, None
    if key is None or key not in self.cache:
      self.cache[key] = self.oracle(ref_fn, z, in_axes)
    expected, magnitude = self.cache[key]
    outcome, budgets = self.compare(check, got, expected, magnitude, names)
    return outcome, got, budgets


def _vjp_of(h, n):
  """``(z..., c...) -> dz`` for a list-valued ``h`` of ``n`` arguments."""

  def g(*zc):
    _, pull = jax.vjp(h, *zc[:n])
    return list(pull(list(zc[n:])))

  return g


def _jvp_of(h, n):
  """``(z..., t...) -> tangent of h``."""

  def g(*zt):
    return list(jax.jvp(h, tuple(zt[:n]), tuple(zt[n:]))[1])

  return g


def _forward_refused(outcome: Outcome) -> bool:
  """Whether ``jax.jvp`` failed because the rule is a ``jax.custom_vjp`` (JAX raises a
  TypeError only when the tangent is computed, not when it is traced)."""
  return outcome.detail.startswith("raised TypeError") and "custom_vjp" in outcome.detail


def check_rule(rule, reference, args, *, kwargs=None, nondiff_argnums=(), modes=MODES,
               transforms=TRANSFORMS, tolerance: Tolerance | None = None, nonfinite="any",
               seed: int = 0, raise_on_failure: bool = True) -> Report:
  r"""Checks a function with custom derivative rules against autodiff of a plain reference.

  The rule (a ``jax.custom_vjp`` or ``jax.custom_jvp`` function, or any function calling
  them) and the reference (the same mathematics in plain ``jax.numpy``, no custom rule) are
  called as ``f(*args, **kwargs)``. Compared, element by element, against the reference
  differentiated by JAX in float64 on the same input values:

  * ``value``: the outputs;
  * ``vjp`` (mode ``"rev"``): ``jax.vjp`` with random cotangents;
  * ``jvp`` (mode ``"fwd"``): ``jax.jvp`` with random tangents, and the adjoint identity
    :math:`\langle J t, c\rangle = \langle t, J^\top c\rangle` between the rule's own JVP and
    VJP. A ``jax.custom_vjp`` has no forward mode: these are skipped, saying so;
  * each of ``transforms`` (:data:`TRANSFORMS`) applied to the above.

  The rule runs under ``jax.jit`` (one program for its value and VJP, one for its JVP); the
  ``"eager"`` transform runs it op by op.

  Args:
    rule: the function under test.
    reference: the plain function it must equal; it must accept float64 arguments.
    args: the positional arguments, pytrees of arrays (a tuple, even for one argument).
      Floating leaves are differentiated; integer and boolean leaves, and every leaf of the
      arguments in ``nondiff_argnums``, are held fixed.
    kwargs: keyword arguments passed to both functions unchanged (static configuration).
    nondiff_argnums: indices of ``args`` not to differentiate (a mask, indices).
    modes: ``"rev"`` and/or ``"fwd"``.
    transforms: a subset of :data:`TRANSFORMS`.
    tolerance: a :class:`Tolerance` (default ``Tolerance()``).
    nonfinite: where the oracle is NaN or infinite: ``"any"`` accepts any value (autodiff of a
      plain formula may be NaN where a derived rule is finite, e.g. at a zero variance);
      ``"match"`` requires the same NaN or infinity.
    seed: seeds the random cotangents, tangents and condition directions.
    raise_on_failure: raise :class:`RuleCheckError` on a failure (else only return the report).

  Returns:
    The :class:`Report` of every check (true when none failed).

  Raises:
    RuleCheckError: a check failed (an ``AssertionError``: pytest and plain ``assert`` show it);
      the message names the check, the output, the worst element, its error in ulps of its
      dtype and the budget there, and prints the inputs.
    TypeError, ValueError: bad arguments, named.
  """
  modes = tuple(modes)
  transforms = tuple(transforms)
  for name, values, allowed in (("modes", modes, MODES), ("transforms", transforms, TRANSFORMS)):
    unknown = [v for v in values if v not in allowed]
    if unknown:
      raise ValueError(f"{name} must be a subset of {allowed}, got unknown {unknown!r}.")
  tolerance = Tolerance() if tolerance is None else tolerance
  if not isinstance(tolerance, Tolerance):
    raise TypeError(f"tolerance must be a jaxnorm.testing.Tolerance, got {tolerance!r}.")
  p = _Problem(rule, reference, args, kwargs, nondiff_argnums, tolerance, nonfinite, seed)
  n = len(p.diff)
  in_names = [p.names[i] for i in p.diff]
  out_names = p.out_paths
  z0 = p.z0
  cts = [p.draw(av) for av in p.out_avals]
  tans = [p.draw(a) for a in z0]
  outcomes = []

  def add(outcome):
    outcomes.append(outcome)
    return outcome

  def both(**kw):
    return p.primal(rule, False, **kw), p.primal(reference, True, **kw)

  h_rule, h_ref = both()
  grads = ["d " + nm for nm in in_names]
  tangent_names = ["tangent of " + nm for nm in out_names]
  vjp_rule, vjp_ref = _vjp_of(h_rule, n), _vjp_of(h_ref, n)
  jvp_rule, jvp_ref = _jvp_of(h_rule, n), _jvp_of(h_ref, n)
  rev = "rev" in modes
  fwd = "fwd" in modes
  n_out, n_ct = len(out_names), len(cts)

  def base_ref(*zct):  # the oracle of value, vjp and jvp: one compiled program
    z, c, t = zct[:n], zct[n:n + n_ct], zct[n + n_ct:]
    return (h_ref(*z) + (vjp_ref(*z, *c) if rev else []) + (jvp_ref(*z, *t) if fwd else []))

  p.split_oracle(base_ref, z0 + cts + tans, {"value": n_out, "vjp": n if rev else 0,
                                              "jvp": n_out if fwd else 0})

  def value_and_vjp(*zc):  # the rule's value and VJP, one program under jit
    return h_rule(*zc[:n]) + (vjp_rule(*zc) if rev else [])

  def runs(mode, wrap):
    """The base checks, with the rule run through ``wrap`` (jax.jit, or eagerly)."""
    outs = p.run_split(mode, wrap(value_and_vjp), z0 + (cts if rev else []),
                       [("value", out_names)] + ([("vjp", grads)] if rev else []))
    if fwd:
      outs["jvp"] = p.run(f"jvp{mode}", wrap(jvp_rule), jvp_ref, z0 + tans, tangent_names,
                          key="jvp")
    return outs

  base = runs("", jax.jit)
  add(base["value"][0])
  if rev:
    add(base["vjp"][0])
  if fwd:
    fwd_out, got_jvp, b_jvp = base["jvp"]
    if _forward_refused(fwd_out):
      fwd = False
      add(Outcome("jvp", "skip", detail="no forward mode: the rule is a jax.custom_vjp "
                                        "(JAX refuses jax.jvp through one)"))
    else:
      add(fwd_out)
      if rev and base["vjp"][1] is not None and got_jvp is not None:
        add(_adjoint(got_jvp, cts, base["vjp"][1], tans, b_jvp, base["vjp"][2]))
  if "eager" in transforms:
    for outcome, _, _ in runs(" (eager)", lambda f: f).values():
      if fwd or not outcome.check.startswith("jvp"):
        add(outcome)
  if "checkpoint" in transforms:
    c_rule = p.primal(rule, False, wrap=jax.checkpoint)
    if rev:
      add(p.run("vjp(checkpoint)", _vjp_of(c_rule, n), vjp_ref, z0 + cts, grads,
                key="vjp")[0])
    if fwd:
      add(p.run("jvp(checkpoint)", _jvp_of(c_rule, n), jvp_ref, z0 + tans, tangent_names,
                key="jvp")[0])

  zb = [np.stack([a, _second(a)]) for a in z0]
  cb = [np.stack([c, p.draw(c)]) for c in cts]
  tb = [np.stack([t, p.draw(t)]) for t in tans]
  for name, on in (("vmap", "vmap" in transforms), ("vmap_unbatched", "vmap_unbatched" in
                                                    transforms and len(set(p.arg_of)) > 1)):
    if not on:
      continue
    axes = [0 if name == "vmap" or arg == p.arg_of[0] else None for arg in p.arg_of]
    zv = [b if ax == 0 else a for a, b, ax in zip(z0, zb, axes)]
    what = "batched parameters" if name == "vmap" else "only args[0] batched"
    if rev:
      ia = tuple(axes) + (0,) * len(cts)
      add(p.run(f"vmap(vjp), {what}", jax.vmap(vjp_rule, in_axes=ia), vjp_ref, zv + cb, grads,
                in_axes=ia, key=("vjp", ia))[0])
    if fwd:
      ia = tuple(axes) + (0,) * n
      add(p.run(f"vmap(jvp), {what}", jax.vmap(jvp_rule, in_axes=ia), jvp_ref, zv + tb,
                tangent_names, in_axes=ia, key=("jvp", ia))[0])
  if "scan" in transforms:
    def scanned(g):
      return lambda *zb_: lax.scan(lambda c, zi: (c, g(*zi)), 0, list(zb_))[1]

    if rev:
      ia = (0,) * (n + len(cts))
      add(p.run("scan(vjp)", scanned(vjp_rule), vjp_ref, zb + cb, grads, in_axes=ia,
                key=("vjp", ia))[0])
    if fwd:
      ia = (0,) * (2 * n)
      add(p.run("scan(jvp)", scanned(jvp_rule), jvp_ref, zb + tb, tangent_names, in_axes=ia,
                key=("jvp", ia))[0])
  if "grad2" in transforms:
    n2 = n + len(cts)
    w = [p.draw(a) for a in z0]
    names2 = ["d2 " + nm for nm in in_names] + ["d2 cotangent of " + nm for nm in out_names]
    if rev:
      add(p.run("vjp(vjp)", _vjp_of(vjp_rule, n2), _vjp_of(vjp_ref, n2), z0 + cts + w,
                names2)[0])
    if rev and fwd:
      t2 = tans + [p.draw(c) for c in cts]
      add(p.run("jvp(vjp)", _jvp_of(vjp_rule, n2), _jvp_of(vjp_ref, n2), z0 + cts + t2,
                ["tangent of " + g for g in grads])[0])
  if "zeros" in transforms:
    args_used = sorted(set(p.arg_of))
    if len(args_used) > 1:
      for arg in args_used:
        subset = [k for k, a in enumerate(p.arg_of) if a == arg]
        zs = [z0[k] for k in subset]
        s_rule, s_ref = both(subset=subset)
        if rev:
          add(p.run(f"vjp(args[{arg}] only)", _vjp_of(s_rule, len(subset)),
                    _vjp_of(s_ref, len(subset)), zs + cts, [grads[k] for k in subset])[0])
        if fwd:
          add(p.run(f"jvp(args[{arg}] only)", _jvp_of(s_rule, len(subset)),
                    _jvp_of(s_ref, len(subset)), zs + [tans[k] for k in subset],
                    tangent_names)[0])
    if len(cts) > 1 and rev:
      for k, name in enumerate(out_names):
        o_rule, o_ref = both(outs=[k])
        add(p.run(f"vjp({name} only)", _vjp_of(o_rule, n), _vjp_of(o_ref, n), z0 + [cts[k]],
                  grads)[0])
  report = Report(outcomes, _describe(p.names, p.fixed))
  if raise_on_failure and not report.ok:
    lines = [f"{o.check}: {o.detail}" for o in report.failures]
    raise RuleCheckError(f"{len(report.failures)} of {len(outcomes)} checks failed:\n  " +
                         "\n  ".join(lines) + "\ninputs:\n" + report.inputs)
  return report


def _adjoint(ty, cts, dx, tans, b_jvp, b_vjp) -> Outcome:
  r""":math:`\langle J t, c\rangle = \langle t, J^\top c\rangle` from the rule's own JVP and
  VJP, within the error the two comparisons with the oracle allowed each side."""
  f64 = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731
  lhs = sum(float(np.sum(f64(a) * f64(c))) for a, c in zip(ty, cts))
  rhs = sum(float(np.sum(f64(t) * f64(d))) for t, d in zip(tans, dx))
  allowed = (sum(float(np.nansum(b * np.abs(f64(c)))) for b, c in zip(b_jvp or [], cts)) +
             sum(float(np.nansum(b * np.abs(f64(t)))) for b, t in zip(b_vjp or [], tans)))
  if not (np.isfinite(lhs) and np.isfinite(rhs)):  # non-finite inputs: no identity to check
    return Outcome("adjoint <J t, c> = <t, J^T c>", "skip",
                   detail=f"non-finite: <J t, c> = {lhs!r}, <t, J^T c> = {rhs!r}")
  err = abs(lhs - rhs)
  ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else np.inf)
  detail = (f"<J t, c> = {lhs!r}, <t, J^T c> = {rhs!r}: difference {err:.3g}, allowed "
            f"{allowed:.3g}")
  return Outcome("adjoint <J t, c> = <t, J^T c>", "pass" if ratio <= 1 else "fail", ratio,
                 0.0, detail if ratio > 1 else "")
