"""The problem a :func:`jaxnorm.testing.check_rule` call compares: the rule, the reference and
the arguments as functions of the differentiable leaves, the float64 oracle and the comparison.

Contract: :class:`_Problem` validates the arguments (``TypeError``/``ValueError``, named),
draws every random tangent, cotangent and condition direction from one generator seeded by
``seed`` (so a call is reproducible: the order of the draws is the order of the checks), and
compares a rule's results with the oracle element by element within the
:class:`~jaxnorm.testing.Tolerance` budget, returning :class:`~jaxnorm.testing.Outcome` values.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import _validation
from jaxnorm._jax_compat import enable_x64 as _enable_x64
from jaxnorm.testing import _diagnose
from jaxnorm.testing._programs import (_DIRECTIONS, _PROGRAMS, _PROGRAMS_MAX, _TRACED, _Graph,
                                        _oracle_entry, _runner)
from jaxnorm.testing._report import Outcome
from jaxnorm.testing._tolerance import ulp



def _is_float(a) -> bool:
  """Whether ``a`` is an array (or array-like with a dtype) of a floating dtype."""
  return hasattr(a, "dtype") and jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating)


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
    _validation.check_choice("nonfinite", nonfinite, ("any", "match"))
    self.rule, self.reference = rule, reference
    self.kwargs = dict(kwargs or {})
    self.tol, self.nonfinite = tolerance, nonfinite
    self.rng = np.random.default_rng(seed)
    self.seed, self.n_oracles = seed, 0
    self.native = None  # a dtype: the reference's leaves are cast to it, not to float64
    self.cache = {}
    self.dtypes = {}  # result name -> the dtype it must have (see compare)
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
    # Every array leaf at its value (a mask, an integer array, a nondiff float, and the
    # differentiable leaves a check holds fixed: the others' when one argument is differentiated
    # alone): a cached program takes them as arguments (:meth:`program`), never as constants, so
    # another call with other values and the same signature runs it without tracing or compiling.
    self.held = [i for i, v in enumerate(self.fixed) if hasattr(v, "dtype")]
    self._slot = None  # the held leaves (tracers) while a cached program traces
    self._slot64 = None  # the same, in float64, while the oracle's graph is traced
    self.signature = self._signature(rule)
    self.ref_signature = self._signature(reference)
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
    self.mismatch = self._mismatch(reference)

  def _mismatch(self, reference) -> str:
    """How the rule's floating outputs differ from the reference's in tree or shape ("" when
    they match): checked before any check runs, so that every mode reports it alike."""
    names = []

    def probe(*z):
      names[:], values = self._outputs(reference, z, True, None)
      return values

    with _enable_x64():
      ref_avals = list(jax.eval_shape(probe, *self.z0))
    if names != self.out_paths:
      return (f"the rule's floating outputs are {', '.join(self.out_paths)}, the reference's "
              f"{', '.join(names) or 'none'} (another tree)")
    for name, a, b in zip(names, self.out_avals, ref_avals):
      if a.shape != b.shape:
        return f"{name}: shape {a.shape}, the reference's {b.shape}"
    return ""

  def _signature(self, rule):
    """What the rule's programs depend on besides the values of the arrays: the rule, the
    keyword arguments, the tree, each leaf's shape and dtype (a non-array leaf's value), which
    leaves are differentiated and whether float64 is on. None where something is unhashable
    (the programs are then not cached)."""
    leaves = tuple((tuple(np.shape(v)), np.dtype(v.dtype).name) if hasattr(v, "dtype")
                   else ("value", type(v), v) for v in self.fixed)
    key = (rule, tuple(sorted(self.kwargs.items())), self.treedef, leaves, tuple(self.diff),
           self.x64, bool(jax.config.jax_enable_x64))
    try:
      hash(key)
    except TypeError:
      return None
    return key

  def program(self, key, fn):
    """``jax.jit(fn)``, cached across calls by :attr:`signature` and ``key`` (what ``fn`` is,
    given the signature: the check's name and its arguments' shapes and dtypes): the held
    leaves are arguments of the program, not constants, so a call with the same signature and
    other values reuses the compiled program (``jax.jit``'s own cache sees the same function)."""
    if self.signature is None:
      return jax.jit(fn)
    full = (self.signature, key)
    prog = _PROGRAMS.get(full)
    if prog is None:
      owner = self

      def with_held(held, *z):
        prev, owner._slot = owner._slot, list(held)
        try:
          return fn(*z)
        finally:
          owner._slot = prev

      prog = _PROGRAMS[full] = jax.jit(with_held)
      while len(_PROGRAMS) > _PROGRAMS_MAX:
        _PROGRAMS.popitem(last=False)
    _PROGRAMS.move_to_end(full)
    held = [jnp.asarray(self.fixed[i]) for i in self.held]
    return lambda *z: prog(held, *z)

  # ------------------------------------------------------------------ building functions

  def context(self):
    """Where the rule runs: with float64 switched on only if an argument is float64."""
    return _enable_x64() if self.x64 else contextlib.nullcontext()

  def _outputs(self, f, z, f64, subset):
    leaves = list(self.fixed)
    slot = self._slot64 if f64 else self._slot
    if slot is not None:  # tracing a cached program or oracle graph: the held leaves' arguments
      for i, v in zip(self.held, slot):
        leaves[i] = v
    positions = range(len(self.diff)) if subset is None else subset
    for pos, v in zip(positions, z):
      leaves[self.diff[pos]] = v
    cast = (jnp.float64 if self.native is None else self.native) if f64 else None
    leaves = [jnp.asarray(v, cast) if cast is not None and _is_float(v) else
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

  def oracle(self, ref_fn, z, in_axes=None, seed=None, key=None):
    """``(expected, magnitude)``: ``ref_fn`` at ``z`` in float64 and its condition magnitude
    (:mod:`jaxnorm.testing._condition`), both lists of float64 NumPy arrays. The magnitude's
    seed follows ``seed`` and the order of the checks, never the shapes drawn before.

    ``key`` (what ``ref_fn`` is, given the problem's signature: the check's name) keeps the
    traced graph and its compiled programs across calls (:data:`_TRACED`): the array leaves are
    constants of the graph passed at each call (never perturbed as inputs, as the values baked
    in a graph traced per call were not), so a later call traces nothing."""
    if seed is None:
      seed, self.n_oracles = (self.seed * 7919 + self.n_oracles) % 2 ** 16, self.n_oracles + 1
    self.last_seed = seed
    with _enable_x64():
      fn = ref_fn if in_axes is None else jax.vmap(ref_fn, in_axes=in_axes)
      z64 = [np.asarray(a).astype(np.float64) for a in z]
      held = [np.asarray(self.fixed[i]).astype(np.float64) if _is_float(self.fixed[i]) else
              np.asarray(self.fixed[i]) for i in self.held]
      full = None
      if key is not None and self.ref_signature is not None and self.native is None:
        full = (self.ref_signature, key, repr(in_axes), _avals(z))
      hit = _TRACED.get(full) if full is not None else None
      if hit is None:
        def with_held(held_, *zz):
          prev, self._slot64 = self._slot64, list(held_)
          try:
            return fn(*zz)
          finally:
            self._slot64 = prev

        closed = jax.make_jaxpr(with_held)(held, *z64)
        n_held = len(jax.tree_util.tree_leaves(held))
        jaxpr = closed.jaxpr.replace(
            constvars=list(closed.jaxpr.constvars) + list(closed.jaxpr.invars[:n_held]),
            invars=list(closed.jaxpr.invars[n_held:]))
        graph = _Graph(jaxpr, list(closed.consts) + held)
        text = str(jaxpr)
        # Not kept by text where the text may not say everything: a function's repr (an
        # address), or a custom rule or callback, whose Python function the text names at most.
        opaque = any(w in text for w in (" at 0x", "custom_jvp_call", "custom_vjp_call",
                                         "callback"))
        hit = (graph, _oracle_entry(graph, z64, None if opaque else (text, _DIRECTIONS)),
               len(closed.consts))
        if full is not None:
          _TRACED[full] = hit
          while len(_TRACED) > _PROGRAMS_MAX:
            _TRACED.popitem(last=False)
      if full is not None:
        _TRACED.move_to_end(full)
      graph, entry, n_consts = hit
      consts = graph.consts[:n_consts] + held
      run, tree = _runner(entry, seed)
      e, m, a = jax.tree_util.tree_unflatten(tree, run(consts, *z64))
      e = [np.asarray(v, np.float64) for v in e]
      m = [np.asarray(v, np.float64) for v in m]
      a = [np.asarray(v, np.float64) for v in a]
    # Where the exact result is below one rounding (in the compute dtype) of the quantities it
    # is built from, it cannot be told from 0 by a rule computing in that dtype: its magnitude
    # is at least that scale A (an exact zero's first-order M can be 0: a product of two
    # cancelling factors is second order in the roundings; ulps of 0 are no scale).
    eps_c = self.tol.compute_eps(self.compute_dtype(self.z0))
    with np.errstate(invalid="ignore"):
      m = [np.where(np.abs(ev) <= eps_c * av, np.maximum(mv, av), mv)
           for ev, mv, av in zip(e, m, a)]
    return e, m

  def compare(self, check, got, expected, magnitude, names):
    """An :class:`Outcome` and the per-element budgets (for the adjoint identity).

    A result named in ``self.dtypes`` must have that dtype (a cotangent its primal's, a tangent
    its output's, as JAX's own rules give them; JAX does not check a ``custom_vjp`` backward's).
    """
    worst, worst_ulps, detail, budgets, bads = -1.0, 0.0, "", [], []
    for name, a, e, m in zip(names, got, expected, magnitude):
      a = np.asarray(a)
      if a.shape != e.shape:
        return Outcome(check, "fail", np.inf, np.inf,
                       f"{name}: shape {a.shape}, the oracle's {e.shape}"), None, None
      want = self.dtypes.get(name)
      if want is not None and a.dtype != want:
        return Outcome(check, "fail", np.inf, np.inf,
                       f"{name}: dtype {a.dtype.name}, expected {want.name}"), None, None
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
      bads.append(bad)
    failed = any(bool(b.any()) for b in bads)
    return Outcome(check, "fail" if failed else "pass", max(worst, 0.0), worst_ulps,
                   detail if failed else ""), budgets, bads

  def split_oracle(self, ref_fn, z, counts: dict):
    """Computes one oracle whose outputs are several checks' (``counts``: key -> how many
    outputs, in order) and caches each check's part under its key."""
    expected, magnitude = self.oracle(ref_fn, z, key=("split", tuple(counts.items())))
    i = 0
    for key, k in counts.items():
      self.cache[key] = (expected[i:i + k], magnitude[i:i + k],
                         (ref_fn, z, None, self.last_seed, i))
      i += k

  def run_split(self, mode, rule_fn, z, parts, wrap=jax.jit):
    """Runs ``wrap(rule_fn)(*z)`` once and compares its consecutive outputs with the cached
    oracle of each ``(key, names)`` of ``parts``: ``{key: (outcome, got, budgets)}``."""
    try:
      with self.context():
        call = (self.program(("split", mode, tuple((k, tuple(n)) for k, n in parts),
                              _avals(z)), rule_fn) if wrap is jax.jit else wrap(rule_fn))
        got = [np.asarray(a) for a in call(*[jnp.asarray(a) for a in z])]
    except Exception as exc:  # noqa: BLE001 (reported as unsupported, with the exception)
      return {key: (_raised(key + mode, exc), None, None) for key, _ in parts}
    out, i = {}, 0
    for key, names in parts:
      sub = got[i:i + len(names)]
      i += len(names)
      outcome, budgets, bads = self.compare(key + mode, sub, *self.cache[key][:2], names)
      if outcome.status == "fail" and bads is not None:
        outcome = _diagnose.explain(self, outcome, (wrap(rule_fn), z), self.cache[key], sub,
                                    budgets, bads)
      out[key] = (outcome, sub, budgets)
    return out

  def run(self, check, rule_fn, ref_fn, z, names, in_axes=None, key=None, wrap=jax.jit):
    """Runs ``wrap(rule_fn)(*z)`` and compares it with the oracle: ``(outcome, got, budgets)``.

    ``wrap`` is ``jax.jit`` except for the eager check: one compiled program per check, where
    an unjitted transformation would compile each primitive on its own.

    ``key`` names the oracle's computation: checks with the same key (the VJP eagerly, under
    ``jit`` and ``jax.checkpoint``) reuse its values instead of recomputing them.
    """
    try:
      with self.context():
        call = (self.program(("run", check, repr(in_axes), tuple(names), _avals(z)), rule_fn)
                if wrap is jax.jit else wrap(rule_fn))
        got = [np.asarray(a) for a in call(*[jnp.asarray(a) for a in z])]
    except Exception as exc:  # noqa: BLE001 (reported as unsupported, with the exception)
      return _raised(check, exc), None, None
    if key is None or key not in self.cache:
      self.cache[key] = (*self.oracle(ref_fn, z, in_axes, key=("run", check, key)),
                         (ref_fn, z, in_axes, self.last_seed, 0))
    entry = self.cache[key]
    outcome, budgets, bads = self.compare(check, got, *entry[:2], names)
    if outcome.status == "fail" and bads is not None:
      outcome = _diagnose.explain(self, outcome, (wrap(rule_fn), z), entry, got, budgets, bads)
    return outcome, got, budgets

  def compute_dtype(self, z):
    """The dtype the rule is expected to compute in, for inputs ``z``."""
    if self.tol.compute_dtype is not None:
      return jnp.dtype(self.tol.compute_dtype)
    floats = [jnp.dtype(a.dtype) for a in z if _is_float(a)]
    return jnp.dtype(jnp.promote_types(jnp.result_type(*floats), jnp.float32))


def _avals(z) -> tuple:
  """The shapes and dtypes of a check's arguments (part of its program's cache key)."""
  return tuple((tuple(np.shape(a)), np.dtype(a.dtype).name) for a in z)


def _raised(check, exc) -> Outcome:
  """A check whose function of the rule raised: unsupported, with the exception."""
  return Outcome(check, "unsupported", np.inf, np.inf,
                 f"raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}")
