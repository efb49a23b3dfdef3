"""Known-wrong derivative rules (mutants) beside correct ones, for tests/jaxnorm/test_testing_kit.py.

Each :class:`Case` pairs a rule with its plain reference and the inputs hypothesis draws for
it. The correct rules must pass :func:`jaxnorm.testing.check_rule`, the mutants must fail it.
Run as a script (``python tests/_mutants.py``) it prints the kill table of docs/testing.md:
the kit's verdict and shrunk counterexample per mutant, beside ``jax.test_util.check_grads``
on a typical input and on that counterexample.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

import jaxnorm
from jaxnorm import reference
from jaxnorm import testing as jt
from jaxnorm.testing import arrays, shapes  # noqa: F401 (registers the profiles at import)

EPS = 1e-5


def _stats(x, center, ct):
  """``(x_hat, rstd)`` in the compute dtype ``ct``."""
  x = x.astype(ct)
  xc = x - jnp.mean(x, -1, keepdims=True) if center else x
  rstd = lax.rsqrt(jnp.mean(xc * xc, -1, keepdims=True) + EPS)
  return xc * rstd, rstd


def _row(p, x):
  """A ``(d,)`` parameter with leading ones to ``x``'s rank (the tests forbid rank promotion)."""
  return p.reshape((1,) * (x.ndim - 1) + p.shape)


def norm_vjp(center: bool, *, mean_path=True, var_path=True, var_sign=1.0, in_input_dtype=False):
  """A user-written LayerNorm (``center``) or RMSNorm as a ``jax.custom_vjp`` of ``(x, scale)``.

  The derived backward (``docs/derivations.md``): ``g = dy * scale``, ``dx = rstd * (g -
  mean(g) - x_hat * mean(g * x_hat))``; the switches remove the mean path or the variance path,
  flip the variance (RMS) path's sign, or compute the backward in the input dtype.
  """

  def forward(x, scale):
    x_hat, _ = _stats(x, center, jnp.promote_types(x.dtype, jnp.float32))
    return (x_hat * _row(scale, x).astype(x_hat.dtype)).astype(x.dtype)

  @jax.custom_vjp
  def norm(x, scale):
    return forward(x, scale)

  def fwd(x, scale):
    return forward(x, scale), (x, scale)

  def bwd(res, dy):
    x, scale = res
    ct = x.dtype if in_input_dtype else jnp.promote_types(x.dtype, jnp.float32)
    x_hat, rstd = _stats(x, center, ct)
    g = dy.astype(ct) * _row(scale, x).astype(ct)
    dx = g
    if center and mean_path:
      dx = dx - jnp.mean(g, -1, keepdims=True)
    if var_path:
      dx = dx - var_sign * x_hat * jnp.mean(g * x_hat, -1, keepdims=True)
    dscale = jnp.sum((dy.astype(ct) * x_hat).reshape(-1, x.shape[-1]), 0)
    return (rstd * dx).astype(x.dtype), dscale.astype(scale.dtype)

  norm.defvjp(fwd, bwd)
  return norm


def layer_norm_jvp(*, scale_tangent=True):
  """LayerNorm of ``(x, scale)`` as a ``jax.custom_jvp`` (JAX transposes its tangent)."""

  @jax.custom_jvp
  def norm(x, scale):
    x_hat, _ = _stats(x, True, jnp.float32)
    return (x_hat * _row(scale, x)).astype(x.dtype)

  @norm.defjvp
  def norm_jvp(primals, tangents):
    (x, scale), (tx, ts) = primals, tangents
    x_hat, rstd = _stats(x, True, jnp.float32)
    txc = tx - jnp.mean(tx, -1, keepdims=True)
    ty = _row(scale, x) * rstd * (txc - x_hat * jnp.mean(x_hat * txc, -1, keepdims=True))
    if scale_tangent:
      ty = ty + x_hat * _row(ts, x)
    return (x_hat * _row(scale, x)).astype(x.dtype), ty.astype(x.dtype)

  return norm


def gelu_plain(x):
  """GELU, tanh approximation (the reference: autodiff)."""
  xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  c = np.sqrt(2 / np.pi)
  return (0.5 * xf * (1 + jnp.tanh(c * (xf + 0.044715 * xf ** 3)))).astype(x.dtype)


def gelu_vjp(*, erf_derivative=False):
  """The tanh-approximate GELU with a hand-written backward; the mutant differentiates the
  exact (erf) GELU instead, a slip that differs by at most ~1e-3."""

  @jax.custom_vjp
  def gelu(x):
    return gelu_plain(x)

  def fwd(x):
    return gelu(x), x

  def bwd(x, dy):
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if erf_derivative:
      d = 0.5 * (1 + lax.erf(xf / np.sqrt(2))) + xf * jnp.exp(-0.5 * xf * xf) / np.sqrt(2 * np.pi)
    else:
      c = np.sqrt(2 / np.pi)
      t = jnp.tanh(c * (xf + 0.044715 * xf ** 3))
      d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * c * (1 + 3 * 0.044715 * xf * xf)
    return ((d * dy.astype(xf.dtype)).astype(x.dtype),)

  gelu.defvjp(fwd, bwd)
  return gelu


def softplus_plain(x):
  return jnp.logaddexp(x, 0.0)


def softplus_vjp(*, naive_sigmoid=False):
  """Softplus with a hand-written backward; the mutant's ``exp(x) / (1 + exp(x))`` is NaN for
  x > 88 in float32 (inf / inf), where the derivative is 1."""

  @jax.custom_vjp
  def softplus(x):
    return softplus_plain(x)

  def fwd(x):
    return softplus(x), x

  def bwd(x, dy):
    s = jnp.exp(x) / (1 + jnp.exp(x)) if naive_sigmoid else jax.nn.sigmoid(x)
    return (dy * s,)

  softplus.defvjp(fwd, bwd)
  return softplus


@contextlib.contextmanager
def vmap_ignores_batched_parameters():
  """jaxnorm's ops with a wrong batching rule: a batched ``scale``/``bias`` (or tangent of
  one) is replaced by its first slice, so the derived rules run with the first example's
  parameters for every example. Right everywhere but under ``vmap`` with batched parameters."""
  from jax.interpreters import batching
  from jaxnorm.ops.norm import rules as _ad

  right = batching.fancy_primitive_batchers[_ad.norm_tangent_p]

  def wrong(axis_data, args, dims, *, operand_names, **params):
    args = [jnp.take(a, 0, axis=dm) if k in _ad._PARAMS and dm is not None else a
            for k, a, dm in zip(operand_names, args, dims)]
    dims = [None if k in _ad._PARAMS else dm for k, dm in zip(operand_names, dims)]
    return right(axis_data, args, dims, operand_names=operand_names, **params)

  # check_rule keeps compiled programs by rule and signature: swapping a batching rule behind
  # the same function object needs them forgotten, on the way in and out.
  jt.clear_cache()
  batching.fancy_primitive_batchers[_ad.norm_tangent_p] = wrong
  try:
    yield
  finally:
    batching.fancy_primitive_batchers[_ad.norm_tangent_p] = right
    jt.clear_cache()


def log_softmax_plain(x):
  """log_softmax with no shift: its float64 Hessian is exactly 0 at d = 1 (f = 0 there) and
  its graph makes those zeros products of two cancelling factors (first-order condition 0)."""
  return x - jnp.log(jnp.sum(jnp.exp(x), -1, keepdims=True))


def curved(f, by=1e-3):
  """``f`` plus ``by / 2 * (x - stop_gradient(x))**2``: the same value and first derivative,
  the second derivative wrong by ``by`` on the diagonal."""
  return lambda x: f(x) + 0.5 * by * (x - jax.lax.stop_gradient(x)) ** 2


# ------------------------------------------------------------------------------ the cases


def _rows(dtype, last=(2, 3, 7, 16, 33)):
  return jt.arrays(dtype, jt.shapes(min_rank=2, max_rank=2, max_side=3, last=last))


@st.composite
def norm_args(draw, dtype="float32", bias=False):
  x = draw(_rows(dtype))
  d = x.shape[-1]
  params = [draw(jt.arrays(dtype, (d,), loc=1.0, scale=0.5, kinds=("normal",)))]
  if bias:
    params.append(draw(jt.arrays(dtype, (d,), kinds=("normal",))))
  return (x, *params)


@st.composite
def single_feature_args(draw, dtype="float32"):
  """Rows of one feature (where log_softmax is 0 and its Hessian exactly 0)."""
  return (draw(jt.arrays(dtype, jt.shapes(min_rank=1, max_rank=3, max_side=3, last=(1,)))),)


@st.composite
def vector_args(draw, dtype="float32"):
  return (draw(jt.arrays(dtype, jt.shapes(max_rank=2, max_side=3, last=(1, 4, 16)))),)


@dataclasses.dataclass(frozen=True)
class Case:
  """A rule, its reference, how its inputs are drawn and what the kit must say."""

  name: str
  rule: Callable
  reference: Callable
  args: st.SearchStrategy
  wrong: bool
  what: str = ""  # the mutation, for the table
  context: Callable = contextlib.nullcontext
  transforms: tuple = ()  # beyond value, vjp, jvp, adjoint: what the check runs
  forward: bool = False  # whether the rule has forward mode (a custom_jvp)
  dtype: str = "float32"

  def check(self, args, **kw):
    with self.context():
      return jt.check_rule(self.rule, self.reference, args, transforms=self.transforms,
                           raise_on_failure=False, **kw)


LN_REF = functools.partial(reference.layer_norm, epsilon=EPS)
RMS_REF = functools.partial(reference.rms_norm, epsilon=EPS)

CASES = [
    Case("layer_norm (custom_vjp)", norm_vjp(True), LN_REF, norm_args(), False),
    Case("rms_norm (custom_vjp)", norm_vjp(False), RMS_REF, norm_args(), False),
    Case("layer_norm (custom_jvp)", layer_norm_jvp(), LN_REF, norm_args(), False, forward=True),
    Case("layer_norm (custom_vjp), bfloat16", norm_vjp(True), LN_REF, norm_args("bfloat16"),
         False, dtype="bfloat16"),
    Case("jaxnorm.layer_norm, vmap", jaxnorm.layer_norm, reference.layer_norm,
         norm_args(bias=True), False, transforms=("vmap",), forward=True),
    Case("gelu (custom_vjp)", gelu_vjp(), gelu_plain, vector_args(), False),
    Case("softplus (custom_vjp)", softplus_vjp(), softplus_plain, vector_args(), False),
    Case("log_softmax, zero Hessian", jax.nn.log_softmax, log_softmax_plain,
         single_feature_args(), False, transforms=("grad2",), forward=True),
    Case("ln_no_mean_path", norm_vjp(True, mean_path=False), LN_REF, norm_args(), True,
         "LayerNorm backward without the mean path"),
    Case("ln_no_variance_path", norm_vjp(True, var_path=False), LN_REF, norm_args(), True,
         "LayerNorm backward without the variance path"),
    Case("rms_sign_flipped", norm_vjp(False, var_sign=-1.0), RMS_REF, norm_args(), True,
         "RMSNorm backward with the RMS path's sign flipped"),
    Case("jvp_ignores_scale_tangent", layer_norm_jvp(scale_tangent=False), LN_REF, norm_args(),
         True, "LayerNorm custom_jvp whose tangent ignores the scale's", forward=True),
    Case("bf16_casting", norm_vjp(True, in_input_dtype=True), LN_REF, norm_args("bfloat16"),
         True, "LayerNorm backward computed in the input dtype (right in float32, not bfloat16)",
         dtype="bfloat16"),
    Case("vmap_batched_params", jaxnorm.layer_norm, reference.layer_norm, norm_args(bias=True),
         True, "jaxnorm.layer_norm with a batching rule that drops batched parameters",
         context=vmap_ignores_batched_parameters, transforms=("vmap",), forward=True),
    Case("gelu_erf_backward", gelu_vjp(erf_derivative=True), gelu_plain, vector_args(), True,
         "tanh-GELU whose backward is the exact (erf) GELU's derivative"),
    Case("hessian_off_at_zero", curved(jax.nn.log_softmax), log_softmax_plain,
         single_feature_args(), True, "log_softmax whose second derivative is off by 1e-3 "
         "where the true Hessian is exactly 0 (one feature)", transforms=("grad2",),
         forward=True),
    Case("softplus_naive_sigmoid", softplus_vjp(naive_sigmoid=True), softplus_plain,
         vector_args(), True, "softplus backward exp(x) / (1 + exp(x)) (NaN above x = 88)"),
]
CORRECT = [c for c in CASES if not c.wrong]
MUTANTS = [c for c in CASES if c.wrong]


def typical_args(case: Case, seed=0):
  """The input check_grads is usually given: N(0, 1) rows, parameters near 1."""
  rng = np.random.default_rng(seed)
  n = lambda shape, loc=0.0, sd=1.0: jnp.asarray(  # noqa: E731
      (loc + sd * rng.standard_normal(shape)).astype(jnp.dtype(case.dtype)))
  if case.reference in (gelu_plain, softplus_plain):
    return (n((3, 16)),)
  if case.reference is log_softmax_plain:  # one feature: where its Hessian is exactly 0
    return (n((3, 1)),)
  if case.reference is reference.layer_norm:
    return (n((3, 16)), n(16, 1.0, 0.5), n(16))
  return (n((3, 16)), n(16, 1.0, 0.5))


def check_grads_verdict(case: Case, args) -> str:
  """``jax.test_util.check_grads`` to first order, forward mode too where the rule has it."""
  import jax.test_util

  with case.context():
    try:
      jax.test_util.check_grads(case.rule, args, order=1,
                                modes=("fwd", "rev") if case.forward else ("rev",))
    except AssertionError:
      return "rejects"
    except Exception as exc:  # noqa: BLE001
      return f"error ({type(exc).__name__})"
  return "accepts"


def main():  # pragma: no cover (prints docs/testing.md's table)
  from hypothesis import find, settings
  from hypothesis.errors import NoSuchExample

  rows, shrunk = [], []
  for case in CASES:
    # A mutant: the first failing input among 25, shrunk within 12 checks in all (past them a
    # candidate counts as passing without being run, which ends the shrinking: each check
    # compiles, about 3 s). A correct rule: 5 inputs, all pass.
    n, seen = (25 if case.wrong else 5), {}

    def fails(a, case=case, seen=seen):
      key = tuple((str(np.asarray(v).dtype), np.shape(v), np.asarray(v).tobytes()) for v in a)
      if key not in seen:  # answers are memoized: hypothesis re-runs the final example
        seen[key] = len(seen) < 12 and not case.check(a).ok
      return seen[key]

    try:
      bad = find(case.args, fails, settings=settings(max_examples=n, derandomize=True,
                                                     database=None, deadline=None))
      report = case.check(bad)
      first = report.failures[0]
      verdict = f"rejects ({first.check}, {first.worst_ulps:.3g} ulp)"
      shrunk.append(f"{case.name}: {first.check}: {first.detail}\n{report.inputs}")
    except NoSuchExample:
      verdict, bad = f"accepts ({n} inputs)", None
    cg = check_grads_verdict(case, typical_args(case))
    cg_bad = check_grads_verdict(case, bad) if bad is not None else "-"
    label = case.what or f"{case.name} (correct)"
    rows.append(f"| {label} | {verdict} | {cg} | {cg_bad} |")
    print(rows[-1], flush=True)
  print("\n| rule | jaxnorm.testing | check_grads, typical input | check_grads, kit's "
        "counterexample |\n|---|---|---|---|")
  print("\n".join(rows))
  print("\n```text\n" + "\n\n".join(shrunk) + "\n```")


if __name__ == "__main__":
  main()
