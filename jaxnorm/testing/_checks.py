r"""``check_rule``: a custom derivative rule against autodiff of a plain float64 reference.

Every check compares a function of the rule (its value, VJP, JVP, under a transformation) with
the same function of the reference, evaluated by JAX's autodiff in float64 on the same input
values (``jax.enable_x64`` scoped to the oracle's evaluation), element by element, within the
budget of :class:`jaxnorm.testing.Tolerance`: ulps of the result's dtype plus the intermediate
roundings scaled by a condition magnitude measured on the oracle. Cotangents and tangents are
random (a plain ``sum()`` would give LayerNorm's input gradient as zero, and accept a backward
that returns zeros).

The arguments, the oracle and the comparison are in :mod:`jaxnorm.testing._problem`, the
results in :mod:`jaxnorm.testing._report`; this module runs the checks, one step per
transformation, in a fixed order (the random draws follow it, so a seed gives the same
checks).
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from jaxnorm import _validation
from jaxnorm.testing._problem import _Problem
from jaxnorm.testing._report import Outcome, Report, _describe
from jaxnorm.testing._tolerance import Tolerance

__all__ = ["ALLOWABLE", "MODES", "TRANSFORMS", "Outcome", "Report", "RuleCheckError", "check_rule"]

MODES = ("rev", "fwd")
# Every check runs its function of the rule under jax.jit (one compiled program a check), but
# eager: the base checks op by op, without jit. vmap: jax.vmap
# over every argument (batched parameters). vmap_unbatched: over the first argument only.
# grad2: reverse over reverse (and forward over reverse where forward mode exists).
# checkpoint: jax.checkpoint around the rule. scan: the rule as a lax.scan body. zeros:
# symbolic-zero cotangents and tangents (one argument or one output at a time).
TRANSFORMS = ("eager", "vmap", "vmap_unbatched", "grad2", "checkpoint", "scan", "zeros")


class RuleCheckError(AssertionError):
  """A rule failed :func:`check_rule`; the message names each failing check."""


def _second(a: np.ndarray) -> np.ndarray:
  """A second example for a batch: ``a`` reversed along every axis, or ``0.75 a`` where that
  changes nothing (a scalar, a palindrome), so a parameter differs between the examples."""
  b = np.flip(a)
  if np.array_equal(b, a, equal_nan=True):
    b = (a.astype(np.float64) * 0.75).astype(a.dtype)
  return np.array(b, copy=True)  # ascontiguousarray would make a 0-d parameter 1-d


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


class _Run:
  """One call of :func:`check_rule`: the problem, its random cotangents and tangents, the rule's
  and the reference's functions of the differentiable leaves, and the outcomes so far.

  ``fwd`` turns off when the base JVP shows the rule has no forward mode (a
  ``jax.custom_vjp``): the later steps then skip every forward-mode check.
  """

  def __init__(self, p: _Problem, rule, reference, modes):
    self.p, self.rule, self.reference = p, rule, reference
    self.n = len(p.diff)
    self.in_names = [p.names[i] for i in p.diff]
    self.out_names = p.out_paths
    self.z0 = p.z0
    self.cts = [p.draw(av) for av in p.out_avals]
    self.tans = [p.draw(a) for a in self.z0]
    self.outcomes = []
    self.h_rule, self.h_ref = self.both()
    self.grads = ["d " + nm for nm in self.in_names]
    self.tangent_names = ["tangent of " + nm for nm in self.out_names]
    self.vjp_rule, self.vjp_ref = _vjp_of(self.h_rule, self.n), _vjp_of(self.h_ref, self.n)
    self.jvp_rule, self.jvp_ref = _jvp_of(self.h_rule, self.n), _jvp_of(self.h_ref, self.n)
    self.rev = "rev" in modes
    self.fwd = "fwd" in modes
    # The dtype each result must have: a cotangent (first or second order) its primal's, a
    # tangent its output's (a VJP's tangent its primal's), as JAX's own rules give them.
    in_dtypes = [np.dtype(a.dtype) for a in self.z0]
    out_dtypes = [np.dtype(av.dtype) for av in p.out_avals]
    for prefix, names, dts in (("", self.out_names, out_dtypes), ("d ", self.in_names, in_dtypes),
                               ("tangent of ", self.out_names, out_dtypes),
                               ("d2 ", self.in_names, in_dtypes),
                               ("d2 cotangent of ", self.out_names, out_dtypes),
                               ("tangent of d ", self.in_names, in_dtypes)):
      p.dtypes.update({prefix + nm: dt for nm, dt in zip(names, dts)})

  def add(self, outcome: Outcome) -> Outcome:
    """Records ``outcome`` (in the report's order)."""
    self.outcomes.append(outcome)
    return outcome

  def both(self, **kw):
    """The rule (as given) and the reference (in float64) as functions of the leaves
    (``kw``: :meth:`_Problem.primal`'s ``subset``/``outs``)."""
    return self.p.primal(self.rule, False, **kw), self.p.primal(self.reference, True, **kw)

  def base_ref(self, *zct):
    """The oracle of value, vjp and jvp: one compiled program of ``(z, c, t)``."""
    n, n_ct = self.n, len(self.cts)
    z, c, t = zct[:n], zct[n:n + n_ct], zct[n + n_ct:]
    return (self.h_ref(*z) + (self.vjp_ref(*z, *c) if self.rev else []) +
            (self.jvp_ref(*z, *t) if self.fwd else []))

  def value_and_vjp(self, *zc):
    """The rule's value and VJP of ``(z, c)``, one program under jit."""
    return self.h_rule(*zc[:self.n]) + (self.vjp_rule(*zc) if self.rev else [])

  def value_vjp_jvp(self, *zct):
    """The same and the JVP of ``(z, c, t)``: one program where forward mode exists."""
    n, n_ct = self.n, len(self.cts)
    return (self.value_and_vjp(*zct[:n + (n_ct if self.rev else 0)]) +
            self.jvp_rule(*zct[:n], *zct[n + n_ct:]))

  def runs(self, mode, wrap):
    """The base checks, with the rule run through ``wrap`` (jax.jit, or eagerly): value, VJP
    and JVP in one program; if it raises, value and VJP apart from the JVP, so that the report
    says which of them raised (a ``jax.custom_vjp``'s JVP does)."""
    p, rev = self.p, self.rev
    parts = [("value", self.out_names)] + ([("vjp", self.grads)] if rev else [])
    if self.fwd:
      outs = p.run_split(mode, self.value_vjp_jvp, self.z0 + self.cts + self.tans,
                         parts + [("jvp", self.tangent_names)], wrap=wrap)
      if not any(o.detail.startswith("raised") for o, _, _ in outs.values()):
        return outs
    outs = p.run_split(mode, self.value_and_vjp, self.z0 + (self.cts if rev else []), parts,
                       wrap=wrap)
    if self.fwd:
      outs["jvp"] = p.run(f"jvp{mode}", self.jvp_rule, self.jvp_ref, self.z0 + self.tans,
                          self.tangent_names, key="jvp", wrap=wrap)
    return outs


def _check_base(r: _Run) -> None:
  """Value, VJP and JVP under jit (one oracle for the three) and the adjoint identity; turns
  ``r.fwd`` off, saying so, for a rule without forward mode."""
  r.p.split_oracle(r.base_ref, r.z0 + r.cts + r.tans,
                   {"value": len(r.out_names), "vjp": r.n if r.rev else 0,
                    "jvp": len(r.out_names) if r.fwd else 0})
  base = r.runs("", jax.jit)
  r.add(base["value"][0])
  if r.rev:
    r.add(base["vjp"][0])
  if r.fwd:
    fwd_out, got_jvp, b_jvp = base["jvp"]
    if _forward_refused(fwd_out):
      r.fwd = False
      r.add(Outcome("jvp", "skip", detail="no forward mode: the rule is a jax.custom_vjp "
                                          "(JAX refuses jax.jvp through one)"))
    else:
      r.add(fwd_out)
      if r.rev and base["vjp"][1] is not None and got_jvp is not None:
        r.add(_adjoint(got_jvp, r.cts, base["vjp"][1], r.tans, b_jvp, base["vjp"][2]))


def _check_eager_and_checkpoint(r: _Run, transforms) -> None:
  """The base checks op by op (``"eager"``) and the VJP/JVP through ``jax.checkpoint``."""
  if "eager" in transforms:
    for outcome, _, _ in r.runs(" (eager)", lambda f: f).values():
      if r.fwd or not outcome.check.startswith("jvp"):
        r.add(outcome)
  if "checkpoint" in transforms:
    p, n, z0 = r.p, r.n, r.z0
    c_rule = p.primal(r.rule, False, wrap=jax.checkpoint)
    if r.rev:
      r.add(p.run("vjp(checkpoint)", _vjp_of(c_rule, n), r.vjp_ref, z0 + r.cts, r.grads,
                  key="vjp")[0])
    if r.fwd:
      r.add(p.run("jvp(checkpoint)", _jvp_of(c_rule, n), r.jvp_ref, z0 + r.tans,
                  r.tangent_names, key="jvp")[0])


def _check_batched(r: _Run, transforms) -> None:
  """``jax.vmap`` (every argument batched, or only the first) and ``lax.scan`` over a batch of
  two examples (the second from :func:`_second` and fresh draws)."""
  p, n, z0, cts = r.p, r.n, r.z0, r.cts
  zb = [np.stack([a, _second(a)]) for a in z0]
  cb = [np.stack([c, p.draw(c)]) for c in cts]
  tb = [np.stack([t, p.draw(t)]) for t in r.tans]
  for name, on in (("vmap", "vmap" in transforms), ("vmap_unbatched", "vmap_unbatched" in
                                                    transforms and len(set(p.arg_of)) > 1)):
    if not on:
      continue
    axes = [0 if name == "vmap" or arg == p.arg_of[0] else None for arg in p.arg_of]
    zv = [b if ax == 0 else a for a, b, ax in zip(z0, zb, axes)]
    what = "batched parameters" if name == "vmap" else "only args[0] batched"
    if r.rev:
      ia = tuple(axes) + (0,) * len(cts)
      r.add(p.run(f"vmap(vjp), {what}", jax.vmap(r.vjp_rule, in_axes=ia), r.vjp_ref, zv + cb,
                  r.grads, in_axes=ia, key=("vjp", ia))[0])
    if r.fwd:
      ia = tuple(axes) + (0,) * n
      r.add(p.run(f"vmap(jvp), {what}", jax.vmap(r.jvp_rule, in_axes=ia), r.jvp_ref, zv + tb,
                  r.tangent_names, in_axes=ia, key=("jvp", ia))[0])
  if "scan" in transforms:
    def scanned(g):
      return lambda *zb_: lax.scan(lambda c, zi: (c, g(*zi)), 0, list(zb_))[1]

    if r.rev:
      ia = (0,) * (n + len(cts))
      r.add(p.run("scan(vjp)", scanned(r.vjp_rule), r.vjp_ref, zb + cb, r.grads, in_axes=ia,
                  key=("vjp", ia))[0])
    if r.fwd:
      ia = (0,) * (2 * n)
      r.add(p.run("scan(jvp)", scanned(r.jvp_rule), r.jvp_ref, zb + tb, r.tangent_names,
                  in_axes=ia, key=("jvp", ia))[0])


def _check_grad2(r: _Run) -> None:
  """Second order: reverse over reverse, and forward over reverse where forward mode exists."""
  p, n, z0, cts = r.p, r.n, r.z0, r.cts
  n2 = n + len(cts)
  w = [p.draw(a) for a in z0]
  names2 = (["d2 " + nm for nm in r.in_names] +
            ["d2 cotangent of " + nm for nm in r.out_names])
  if r.rev:
    r.add(p.run("vjp(vjp)", _vjp_of(r.vjp_rule, n2), _vjp_of(r.vjp_ref, n2), z0 + cts + w,
                names2)[0])
  if r.rev and r.fwd:
    t2 = r.tans + [p.draw(c) for c in cts]
    r.add(p.run("jvp(vjp)", _jvp_of(r.vjp_rule, n2), _jvp_of(r.vjp_ref, n2), z0 + cts + t2,
                ["tangent of " + g for g in r.grads])[0])


def _check_zeros(r: _Run) -> None:
  """Symbolic zeros: one argument differentiated at a time, then one output's cotangent at a
  time (the others symbolic zeros)."""
  p, n, z0, cts = r.p, r.n, r.z0, r.cts
  args_used = sorted(set(p.arg_of))
  if len(args_used) > 1:
    for arg in args_used:
      subset = [k for k, a in enumerate(p.arg_of) if a == arg]
      zs = [z0[k] for k in subset]
      s_rule, s_ref = r.both(subset=subset)
      if r.rev:
        r.add(p.run(f"vjp(args[{arg}] only)", _vjp_of(s_rule, len(subset)),
                    _vjp_of(s_ref, len(subset)), zs + cts, [r.grads[k] for k in subset])[0])
      if r.fwd:
        r.add(p.run(f"jvp(args[{arg}] only)", _jvp_of(s_rule, len(subset)),
                    _jvp_of(s_ref, len(subset)), zs + [r.tans[k] for k in subset],
                    r.tangent_names)[0])
  if len(cts) > 1 and r.rev:
    for k, name in enumerate(r.out_names):
      o_rule, o_ref = r.both(outs=[k])
      r.add(p.run(f"vjp({name} only)", _vjp_of(o_rule, n), _vjp_of(o_ref, n), z0 + [cts[k]],
                  r.grads)[0])


ALLOWABLE = ("unsupported", "outside_domain")


def _checked_options(modes, transforms, tolerance, allow) -> tuple:
  """``(modes, transforms, tolerance, allow)``: tuples and a :class:`Tolerance` (default
  ``Tolerance()``); ValueError/TypeError, named, for unknown values
  (:func:`jaxnorm._validation.check_subset`)."""
  modes = _validation.check_subset("modes", modes, MODES)
  transforms = _validation.check_subset("transforms", transforms, TRANSFORMS)
  allow = _validation.check_subset("allow", allow, ALLOWABLE)
  tolerance = Tolerance() if tolerance is None else tolerance
  if not isinstance(tolerance, Tolerance):
    raise TypeError(f"tolerance must be a jaxnorm.testing.Tolerance, got {tolerance!r}.")
  return modes, transforms, tolerance, allow


def check_rule(rule, reference, args, *, kwargs=None, nondiff_argnums=(), modes=MODES,
               transforms=TRANSFORMS, tolerance: Tolerance | None = None, nonfinite="any",
               seed: int = 0, allow=(), raise_on_failure: bool = True) -> Report:
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
    allow: outcomes that do not fail the check (each is still reported): ``"unsupported"``
      (a transformation of the rule raises, e.g. a rule that cannot be differentiated twice;
      the ``value`` check raising always fails), ``"outside_domain"`` (the input is outside
      the function's float domain: the reference evaluated in the compute dtype is as wrong).
    raise_on_failure: raise :class:`RuleCheckError` on a failure (else only return the report).

  Returns:
    The :class:`Report` of every check (true when none failed).

  Raises:
    RuleCheckError: a check failed (an ``AssertionError``: pytest and plain ``assert`` show it);
      the message names the check, its status, the output, the worst element, its error in
      ulps of its dtype and the budget there, the cause where found (an input outside the
      float domain, overflow or underflow of intermediates, a rule computing in its 16-bit
      input dtype), and prints the inputs. A rule whose outputs differ from the reference's
      in tree or shape fails the ``value`` check, saying how, whatever the modes.
    TypeError, ValueError: bad arguments, named.
  """
  modes, transforms, tolerance, allow = _checked_options(modes, transforms, tolerance, allow)
  p = _Problem(rule, reference, args, kwargs, nondiff_argnums, tolerance, nonfinite, seed)
  if p.mismatch:  # the same report in every mode, before any transformation runs
    outcomes = [Outcome("value", "fail", np.inf, np.inf, p.mismatch)]
  else:
    r = _Run(p, rule, reference, modes)
    _check_base(r)
    _check_eager_and_checkpoint(r, transforms)
    _check_batched(r, transforms)  # draws the batch's second examples even when not run
    if "grad2" in transforms:
      _check_grad2(r)
    if "zeros" in transforms:
      _check_zeros(r)
    outcomes = r.outcomes
  report = Report(outcomes, _describe(p.names, p.fixed), allow)
  if raise_on_failure and not report.ok:
    lines = [f"{o.check}: " + (f"[{o.status}] " if o.status != "fail" else "") + o.detail
             for o in report.failures]
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
  # Where the oracle is not finite (a reference whose derivative is undefined there, e.g. the
  # sqrt of a zero variance) the comparisons skip the element and its budget is not finite: the
  # identity has no bound then (summing the finite budgets alone allowed 0 and failed correct
  # rules).
  unbounded = sum(int(np.sum(~np.isfinite(b) & (f64(c) != 0)))
                  for bs, cs in ((b_jvp or [], cts), (b_vjp or [], tans)) for b, c in zip(bs, cs))
  if unbounded:
    return Outcome("adjoint <J t, c> = <t, J^T c>", "skip",
                   detail=f"the float64 oracle is not finite at {unbounded} elements: no bound")
  err = abs(lhs - rhs)
  ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else np.inf)
  detail = (f"<J t, c> = {lhs!r}, <t, J^T c> = {rhs!r}: difference {err:.3g}, allowed "
            f"{allowed:.3g}")
  return Outcome("adjoint <J t, c> = <t, J^T c>", "pass" if ratio <= 1 else "fail", ratio,
                 0.0, detail if ratio > 1 else "")
