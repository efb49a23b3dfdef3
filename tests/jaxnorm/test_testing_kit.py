"""jaxnorm.testing: it rejects seeded wrong rules, accepts the correct ones beside them, and its
arguments, messages and strategies do what they say.

The rules jaxnorm ships (every op, variant, casting and backend) are checked with the kit by
the op batteries (tests/jaxnorm/test_ops_vjp.py, tests/jaxnorm/test_fused.py, tests/jaxnorm/test_per_head.py), each
hypothesis example under one drawn transformation; one fixed case here runs every
transformation at once. The mutants of :mod:`_mutants` must each be rejected (hypothesis finds
a failing input) while the correct rules beside them are accepted.
"""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

import jaxnorm
from jaxnorm import reference
from jaxnorm import testing as jt
from _mutants import CORRECT, MUTANTS, curved, log_softmax_plain


def _fused(op, ref, alpha=0.5):
  """The fused op and its reference: ``(norm(h), h)`` with ``h = x + alpha * r``."""
  rule = lambda x, r, *p: op(x, r, *p, residual_scale=alpha)  # noqa: E731
  plain = lambda x, r, *p: (lambda h: (ref(h, *p), h))(x + alpha * r)  # noqa: E731
  return rule, plain


@pytest.mark.slow
def test_every_transform_on_one_case():
  """All transformations at once, float32, one input with a large-mean row (the fused op: two
  outputs, so the symbolic-zero checks include one output at a time)."""
  rule, ref = _fused(jaxnorm.add_rms_norm, reference.rms_norm)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 8)).astype(np.float32)
  x[1] += 300.0
  args = [x, rng.standard_normal((3, 8)).astype(np.float32),
          1 + 0.5 * rng.standard_normal(8).astype(np.float32)]
  report = jt.check_rule(rule, ref, tuple(jnp.asarray(a) for a in args))
  assert report.ok and not any(o.status == "skip" for o in report.outcomes), str(report)
  assert len(report.outcomes) >= 20


# ------------------------------------------------------------------------------ mutants

# No shrinking here (each shrink step is a check): docs/testing.md shows shrunk counterexamples.
_KILL = settings(max_examples=12, derandomize=True, database=None, phases=[Phase.generate],
                 suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("case", MUTANTS, ids=lambda c: c.name)
def test_rejects_every_mutant(case):
  """Hypothesis finds an input (shrunk) on which the kit rejects the mutant."""
  bad = find(case.args, lambda args: not case.check(args).ok, settings=_KILL)
  assert not case.check(bad).ok


@pytest.mark.parametrize("case", CORRECT, ids=lambda c: c.name)
def test_accepts_the_correct_rules_beside_them(case):
  @settings(max_examples=2, suppress_health_check=list(HealthCheck))
  @given(args=case.args)
  def example(args):
    report = case.check(args)
    assert report, str(report)

  example()


# ------------------------------------------------------------------------------ the kit itself


def test_failure_message_names_transform_element_and_ulps():
  from _mutants import LN_REF, norm_vjp

  x = jnp.asarray(np.arange(12, dtype=np.float32).reshape(2, 6) ** 1.5)
  with pytest.raises(jt.RuleCheckError) as info:
    jt.check_rule(norm_vjp(True, mean_path=False), LN_REF, (x, jnp.ones(6)), transforms=("eager",))
  msg = str(info.value)
  for part in ("vjp (eager)", "d args[0][", "ulp of float32", "allowed", "float64 oracle",
               "inputs:", "args[1]: float32[6]"):
    assert part in msg, (part, msg)
  assert isinstance(info.value, AssertionError)


def test_custom_vjp_forward_mode_is_skipped_not_failed():
  from _mutants import softplus_plain, softplus_vjp

  report = jt.check_rule(softplus_vjp(), softplus_plain, (jnp.linspace(-3, 3, 7),),
                         transforms=())
  assert report.ok
  skipped = [o for o in report.outcomes if o.status == "skip"]
  assert [o.check for o in skipped] == ["jvp"] and "custom_vjp" in skipped[0].detail


def test_float64_is_scoped_to_the_check():
  assert not jax.config.jax_enable_x64
  jt.check_rule(jaxnorm.rms_norm, reference.rms_norm, (jnp.ones((2, 4)) * 3,), transforms=())
  assert not jax.config.jax_enable_x64


def test_nondiff_arguments_and_pytrees():
  """A dict of parameters, an integer leaf and a non-differentiable float mask."""

  def rule(p, x, w):
    return {"y": jaxnorm.layer_norm(x, p["scale"], p["bias"]) * w, "n": p["n"]}

  def ref(p, x, w):
    return {"y": reference.layer_norm(x, p["scale"], p["bias"]) * w, "n": p["n"]}

  p = {"scale": jnp.full(5, 1.5), "bias": jnp.zeros(5), "n": jnp.int32(3)}
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5)), jnp.float32)
  report = jt.check_rule(rule, ref, (p, x, jnp.ones((2, 5))), nondiff_argnums=(2,),
                         transforms=("zeros",))
  assert report.ok, str(report)
  assert any(o.check == "vjp(args[0] only)" for o in report.outcomes)


@pytest.mark.parametrize("bad,error,match", [
    (dict(args=[jnp.ones(3)], modes=("sideways",)), ValueError, "modes must be a subset"),
    (dict(args=[jnp.ones(3)], transforms=("pmap",)), ValueError, "transforms must be"),
    (dict(args=jnp.ones(3)), TypeError, "args must be a tuple"),
    (dict(args=(jnp.ones(3),), nondiff_argnums=(4,)), ValueError, "nondiff_argnums"),
    (dict(args=(jnp.arange(3),)), ValueError, "no floating array"),
    (dict(args=(jnp.ones(3),), tolerance=1e-3), TypeError, "tolerance must be"),
    (dict(args=(jnp.ones(3),), nonfinite="some"), ValueError, "nonfinite must be"),
])
def test_bad_arguments_are_named(bad, error, match):
  with pytest.raises(error, match=match):
    jt.check_rule(jnp.sin, jnp.sin, **bad)


def test_tolerance_and_strategy_arguments_are_checked():
  with pytest.raises(ValueError, match="Tolerance.ulps"):
    jt.Tolerance(ulps=-1)
  with pytest.raises(TypeError, match="compute_dtype"):
    jt.Tolerance(compute_dtype="int32")
  with pytest.raises(TypeError, match="floating dtype"):
    jt.dtypes(("int8",))
  with pytest.raises(ValueError, match="kinds must be"):
    jt.arrays("float32", (2, 3), kinds=("weird",))
  with pytest.raises(ValueError, match="min_rank"):
    jt.shapes(min_rank=3, max_rank=2)


def test_ulp_follows_the_dtype():
  assert jt.ulp(1.0, jnp.bfloat16) == 2.0 ** -7
  assert jt.ulp(1.0, jnp.float16) == 2.0 ** -10
  assert jt.ulp(3.0, jnp.float32) == 2.0 ** -22
  assert jt.ulp(0.0, jnp.float32) == 2.0 ** -149  # below the normal range: the subnormal step


def test_adversarial_rows_are_drawn():
  """Each finite row kind shows up: a constant row, a large mean, tiny and huge magnitudes."""
  seen = set()

  @settings(max_examples=60, derandomize=True, database=None)
  @given(x=jt.arrays("float32", (4, 16)))
  def example(x):
    x = np.asarray(x, np.float64)
    for row in x:
      std, mean, top = row.std(), abs(row.mean()), np.abs(row).max()
      seen.add("constant" if std == 0 else "large_mean" if mean > 50 * std else
               "tiny" if top < 1e-4 else "huge" if top > 1e6 else "normal")

  example()
  assert seen == {"normal", "large_mean", "constant", "tiny", "huge"}, seen


def test_cotangent_and_tangent_dtypes_are_checked():
  """A backward that returns a float32 cotangent for a bfloat16 input (JAX accepts it) fails
  the VJP check, naming the dtypes."""

  @jax.custom_vjp
  def double(x):
    return x * 2

  double.defvjp(lambda x: (double(x), None), lambda _, g: (g.astype(jnp.float32) * 2,))
  report = jt.check_rule(double, lambda x: x * 2, (jnp.ones(3, jnp.bfloat16),), transforms=(),
                         raise_on_failure=False)
  (failure,) = report.failures
  assert failure.check == "vjp" and "dtype float32, expected bfloat16" in failure.detail


def test_masks_keep_one_element_per_row():
  @settings(max_examples=20, derandomize=True, database=None)
  @given(m=jt.masks(jt.shapes(max_rank=3, last=(1, 2, 5)), p=0.0))
  def example(m):
    assert m.dtype == jnp.bool_ and bool(np.all(np.asarray(m).sum(-1) == 1))

  example()
  with pytest.raises(ValueError, match="0 <= p <= 1"):
    jt.masks((2, 3), p=1.5)


def test_import_jaxnorm_does_not_import_hypothesis():
  code = ("import sys, jaxnorm, jaxnorm.testing; assert 'hypothesis' not in sys.modules; "
          "jaxnorm.testing.arrays; assert 'hypothesis' in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_nan_and_inf_rows_stay_in_their_rows():
  """With a NaN row and an Inf row, jaxnorm's NaNs match the oracle's exactly ("match"), the
  other rows are checked as usual, and the adjoint identity is skipped (saying why)."""
  x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
  x[1, 2], x[2, 5] = np.nan, np.inf
  report = jt.check_rule(jaxnorm.layer_norm, reference.layer_norm,
                         (jnp.asarray(x), jnp.ones(8), jnp.zeros(8)), transforms=(),
                         nonfinite="match")
  assert [o.check for o in report.outcomes if o.status == "skip"] == [
      "adjoint <J t, c> = <t, J^T c>"], str(report)


def test_adjoint_identity_skips_where_the_oracle_is_not_finite():
  """A constant row with epsilon outside the square root: the reference's derivative is NaN
  (the sqrt of a zero variance) while jaxnorm's rule takes the limit. The comparisons skip those
  elements; the adjoint identity, with no finite budget to bound it, is skipped and says why
  (it failed this correct rule with "allowed 0" before)."""
  kw = dict(epsilon=1e-3, epsilon_placement="outside", zero_centered_scale=True, casting="llama")
  x = jnp.asarray([3.25, 3.25], jnp.bfloat16)
  s = jnp.asarray([1.0625, 0.93359375], jnp.bfloat16)
  report = jt.check_rule(lambda x, s: jaxnorm.layer_norm(x, s, **kw),
                         lambda x, s: reference.layer_norm(x, s, **kw), (x, s), transforms=(),
                         tolerance=jt.Tolerance(compute_dtype=jnp.bfloat16))
  (adjoint,) = [o for o in report.outcomes if o.check.startswith("adjoint")]
  assert adjoint.status == "skip" and "not finite" in adjoint.detail, adjoint


# ------------------------------------------------------------------------------ issue 53's artefacts


@pytest.mark.parametrize("case", ["d=1", "concat"])
def test_a_zero_in_the_oracle_gets_a_budget_from_the_scale(case):
  """Second order of log_softmax where the float64 Hessian entries are exactly 0 (d = 1, and
  ``concat([x, -x])``): rounding noise passes (the operands of the subtractions are rounding
  sites, and where the oracle is below a rounding of the quantities it is built from their
  scale A is the floor: issue 65), a second derivative wrong by 1e-3 there is still rejected."""
  rng = np.random.default_rng(3)
  if case == "d=1":
    args, outer = (jnp.asarray(rng.standard_normal((4, 1)) * 3, jnp.float32),), lambda f: f
  else:
    args = (jnp.asarray(rng.standard_normal((2, 3)), jnp.float32),)
    outer = lambda f: lambda x: f(jnp.concatenate([x, -x], -1))  # noqa: E731
  rule, ref = outer(jax.nn.log_softmax), outer(log_softmax_plain)
  for seed in range(2):
    report = jt.check_rule(rule, ref, args, transforms=("grad2",), seed=seed,
                           raise_on_failure=False)
    assert report.ok, str(report)
  wrong = jt.check_rule(outer(curved(jax.nn.log_softmax)), ref, args, transforms=("grad2",),
                        raise_on_failure=False)
  assert {o.check for o in wrong.failures} >= {"vjp(vjp)"}, str(wrong)


def test_an_elements_budget_does_not_depend_on_its_neighbours():
  """jnp.sinc at x = 5546034176 alone and inside a 66-element array: the same condition
  magnitude (its value may differ: XLA's sin does)."""
  from jaxnorm.testing._problem import _Problem

  def plain_sinc(x):
    safe = jnp.where(x == 0, 1.0, x)
    return jnp.where(x == 0, 1.0, jnp.sin(np.pi * safe) / (np.pi * safe))

  rng = np.random.default_rng(0)
  alone = np.asarray([5546034176.0], np.float32)
  batch = np.concatenate([rng.standard_normal(40), alone, rng.standard_normal(25)]).astype(np.float32)
  mags = []
  for x in (alone, batch):
    p = _Problem(jnp.sinc, plain_sinc, (jnp.asarray(x),), {}, (), jt.Tolerance(), "any", 0)
    e, m = p.oracle(p.primal(plain_sinc, True), p.z0)
    mags.append(float(m[0][40 if x.size > 1 else 0]))
  assert mags[0] == mags[1] and mags[0] > 0, mags


def _callback_sin():
  """sin with a backward through ``jax.pure_callback``: it cannot be differentiated twice."""

  @jax.custom_vjp
  def f(x):
    return jnp.sin(x)

  def bwd(x, g):
    cos = jax.pure_callback(np.cos, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return (cos * g,)

  f.defvjp(lambda x: (jnp.sin(x), x), bwd)
  return f


def test_unsupported_is_reported_apart_and_fails_unless_allowed():
  rule, args = _callback_sin(), (jnp.linspace(-1.0, 1.0, 3),)
  with pytest.raises(jt.RuleCheckError, match=r"vjp\(vjp\): \[unsupported\] raised ValueError"):
    jt.check_rule(rule, jnp.sin, args, transforms=("grad2",))
  report = jt.check_rule(rule, jnp.sin, args, transforms=("grad2",), allow=("unsupported",))
  (unsupported,) = report.unsupported
  assert report.ok and unsupported.check == "vjp(vjp)" and "pure_callback" not in unsupported.status


def test_outside_the_float_domain_is_named_and_fails_unless_declared():
  """jnp.sinc's derivative at x = 5546034176 (pi x rounds by ~1e3 radians in float32): the
  reference's own float32 graph is as wrong, so the input is outside the float32 domain."""
  def plain_sinc(x):
    return jnp.sin(np.pi * x) / (np.pi * x)

  args = (jnp.asarray([5546034176.0, 0.75], jnp.float32),)
  report = jt.check_rule(jnp.sinc, plain_sinc, args, transforms=(), raise_on_failure=False)
  statuses = {o.check: o.status for o in report.outcomes}
  assert statuses["vjp"] == "outside_domain" and not report.ok, str(report)
  assert "outside the function's float32 domain" in report.failures[0].detail
  assert jt.check_rule(jnp.sinc, plain_sinc, args, transforms=(), allow=("outside_domain",)).ok


def test_points_where_the_reference_is_not_differentiable_are_named():
  """relu (derivative 0 at 0) against jnp.maximum(x, 0) (0.5 at the tie): named, not a
  failure; a rule wrong away from the tie still fails."""
  x = (jnp.asarray([[0.0, 1.5, -2.0, 0.0]], jnp.float32),)
  ref = lambda x: jnp.maximum(x, 0.0)  # noqa: E731
  report = jt.check_rule(jax.nn.relu, ref, x, transforms=("grad2",))
  kinks = [o for o in report.outcomes if o.status == "nondifferentiable"]
  assert report.ok and kinks and "not differentiable" in kinks[0].detail, str(report)
  wrong = jt.check_rule(lambda x: jax.nn.relu(x) * 1.01, ref, x, transforms=(),
                        raise_on_failure=False)
  assert {o.status for o in wrong.failures} == {"fail"}, str(wrong)


def test_a_16_bit_rule_is_told_how_to_declare_its_compute_dtype():
  """jax.nn.silu in float16 near x = -11: the message names the underflow of the sigmoid and
  the float16 arithmetic, and the declaration Tolerance(compute_dtype=jnp.float16)."""
  x = (jnp.asarray([-11.5, -11.2, 0.5, 2.0], jnp.float16),)
  with pytest.raises(jt.RuleCheckError) as info:
    jt.check_rule(jax.nn.silu, lambda x: x / (1 + jnp.exp(-x)), x, transforms=())
  msg = str(info.value)
  for part in ("underflow below the normal range in the rule's graph: logistic (float16)",
               "computes in its 16-bit input dtype", "Tolerance(compute_dtype=jnp.float16)"):
    assert part in msg, (part, msg)


@pytest.mark.parametrize("modes", [("rev",), ("fwd",), ("rev", "fwd")])
@pytest.mark.parametrize("rule,said", [
    (lambda x: x[:, :-1], "out: shape (4, 7), the reference's (4, 8)"),
    (lambda x: x[:, :1], "out: shape (4, 1), the reference's (4, 8)"),
    (lambda x: (x,), "the rule's floating outputs are out[0], the reference's out"),
])
def test_an_output_unlike_the_references_is_reported_in_every_mode(modes, rule, said):
  with pytest.raises(jt.RuleCheckError, match=re.escape(said)):
    jt.check_rule(rule, lambda x: x * 2.0, (jnp.ones((4, 8)),), modes=modes)


@pytest.mark.parametrize("allow,error", [(("wrong",), ValueError), ("unsupported", TypeError)])
def test_allow_is_checked(allow, error):
  with pytest.raises(error, match="allow"):
    jt.check_rule(jnp.sin, jnp.sin, (jnp.ones(3),), allow=allow)


def _product(x, y):
  return x * jnp.sin(y)


def test_a_later_call_reuses_the_programs_with_its_own_values():
  """check_rule keeps the rule's programs and the oracle's traced graphs by signature: a second
  call on other values of the same shapes builds and traces nothing, and every check sees its
  own values (a program that had kept the first call's held arguments as constants fails the
  one-argument-at-a-time checks)."""
  from jaxnorm.testing import _problem

  rng = np.random.default_rng(5)
  draw = lambda: jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)  # noqa: E731
  mask = jnp.asarray([[True, False, True]] * 2)
  rule = lambda x, y, m: jnp.where(m, _product(x, y), 0.0)  # noqa: E731
  jt.check_rule(rule, rule, (draw(), draw(), mask), transforms=("zeros", "vmap"))
  before = len(_problem._PROGRAMS), len(_problem._TRACED)
  report = jt.check_rule(rule, rule, (draw(), draw(), ~mask), transforms=("zeros", "vmap"))
  assert report.ok, str(report)
  assert (len(_problem._PROGRAMS), len(_problem._TRACED)) == before
  jt.clear_cache()
  assert not _problem._PROGRAMS and not _problem._TRACED
