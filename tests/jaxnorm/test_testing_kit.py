"""jaxnorm.testing: it rejects seeded wrong rules, accepts the correct ones beside them, and its
arguments, messages and strategies do what they say.

The rules jaxnorm ships (every op, variant, casting and backend) are checked with the kit by
the op batteries (tests/jaxnorm/test_ops_vjp.py, tests/jaxnorm/test_fused.py, tests/jaxnorm/test_per_head.py), each
hypothesis example under one drawn transformation; one fixed case here runs every
transformation at once. The mutants of :mod:`_mutants` must each be rejected (hypothesis finds
a failing input) while the correct rules beside them are accepted.
"""

from __future__ import annotations

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
from _mutants import CORRECT, MUTANTS


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
