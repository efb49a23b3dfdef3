"""The table of bad and edge inputs (issue 56): every public op, layer and the model, one row each.

A *bad* row calls the public surface with one wrong argument and asserts the exception type and
that the message names the argument as it is spelled (``epsilon``, ``axis_name``, ``z``...). An
*edge* row is legal but unusual (a zero row, one feature, a constant row, a row near the end of
the float range, a NaN row, ...) and asserts the value against a float64 NumPy reference of the
same formula. New public arguments join the table. ``jaxnorm.testing``'s option and dtype
arguments are in it (its own tests cover ``check_rule``'s reports); the command line's table is
``tests/experiments/test_cli_bad_inputs.py``.

Everything runs eagerly on tiny shapes unless a row is about traced values (then ``jax.jit``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm import linen as jln
from jaxnorm import testing as jt
from jaxnorm import nnx as jnn
from jaxnorm.models import TransformerConfig, TransformerLM

F8 = jnp.float8_e4m3fn
X = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8)), jnp.float32)
S = jnp.ones(8)
B = jnp.zeros(8)
TINY_LM = dict(vocab_size=16, max_len=8, d_model=8, n_layers=1, n_heads=2, d_ff=16)

# ---------------------------------------------------------------------------------------------
# Bad rows: (id, thunk, exception type, text the message must contain).

# The keyword arguments every norm op takes, each with bad values: (kwargs, type, names).
_NORM_KW = [
    (dict(epsilon=-1.0), ValueError, "epsilon"),
    (dict(epsilon=float("nan")), ValueError, "epsilon"),
    (dict(epsilon=float("inf")), ValueError, "epsilon"),
    (dict(epsilon="1e-6"), TypeError, "epsilon"),
    (dict(epsilon=True), TypeError, "epsilon"),
    (dict(epsilon=jnp.asarray(1e-6)), TypeError, "epsilon"),
    (dict(epsilon=None), TypeError, "epsilon"),
    # Past the float range of the (float32) statistics: a ValueError, not NaN everywhere (issue 65).
    (dict(epsilon=1e39), ValueError, "epsilon=1e+39 is past the float range"),
    (dict(epsilon=3.5e38), ValueError, "epsilon=3.5e+38 is past the float range"),
    (dict(epsilon=1e300), ValueError, "epsilon=1e+300"),
    (dict(epsilon=1e38, epsilon_placement="outside"), ValueError, "epsilon=1e+38"),
    (dict(epsilon=np.float64(1e39)), ValueError, "epsilon=1e+39"),
    (dict(axis=2), ValueError, "axis"),
    (dict(axis=-3), ValueError, "axis"),
    (dict(axis=0), ValueError, "axis"),
    (dict(axis=()), ValueError, "axis"),
    (dict(axis=(-1, -1)), ValueError, "axis"),
    (dict(axis="last"), TypeError, "axis"),
    (dict(axis=1.0), TypeError, "axis"),
    (dict(epsilon_placement="middle"), ValueError, "epsilon_placement"),
    (dict(epsilon_placement=None), ValueError, "epsilon_placement"),
    (dict(zero_centered_scale=1), TypeError, "zero_centered_scale"),
    (dict(zero_centered_scale="yes"), TypeError, "zero_centered_scale"),
    (dict(casting="fp32"), ValueError, "casting"),
    (dict(casting=None), ValueError, "casting"),
    (dict(impl="cuda"), ValueError, "impl"),
    (dict(impl=None), ValueError, "impl"),
    (dict(pallas=1), TypeError, "pallas"),
    (dict(pallas={"interpret": True}), TypeError, "pallas"),
    (dict(backend_config=1), TypeError, "backend_config"),
    (dict(backend_config="interpret"), TypeError, "backend_config"),
    (dict(backend_config=jaxnorm.PallasConfig(), pallas=jaxnorm.PallasConfig()), ValueError,
     "backend_config= and its alias pallas="),
    (dict(dtype=jnp.int32), TypeError, "dtype"),
    (dict(dtype=jnp.bool_), TypeError, "dtype"),
    (dict(dtype="float8"), TypeError, "dtype must be a floating dtype"),
    (dict(dtype=3), TypeError, "dtype must be a floating dtype"),
    (dict(dtype=[jnp.float32]), TypeError, "dtype must be a floating dtype"),
    (dict(dtype=jnp.complex64), TypeError, "dtype must be a floating dtype"),
    (dict(dtype="float33"), TypeError, "dtype must be a floating dtype or None (e.g. jnp.float32), "
                                       "got str 'float33'"),
    (dict(dtype="int8"), TypeError, "dtype must be a floating dtype or None, got int8"),
    (dict(dtype=float("nan")), TypeError, "dtype must be a floating dtype"),
    (dict(epsilon=1e39, epsilon_placement="outside"), ValueError, "epsilon=1e+39 is past"),
    (dict(epsilon=4.3e37), ValueError, "epsilon=4.3e+37 is past the float range"),
    (dict(mask=jnp.ones((2, 8), jnp.int32)), TypeError, "mask"),
    (dict(mask=jnp.ones((3, 8), bool)), ValueError, "mask"),
    (dict(mask=[[True] * 8] * 2), TypeError, "mask"),
    (dict(axis_name="i"), ValueError, "axis_name"),
    (dict(axis_name=("i", "j")), ValueError, "axis_name"),
    (dict(axis_index_groups=[[0]]), ValueError, "axis_index_groups"),
]

# Bad x (or residual) for every op taking one.
_BAD_X = [
    ("int", jnp.ones((2, 8), jnp.int32), TypeError, "x must have a floating dtype"),
    ("bool", jnp.ones((2, 8), bool), TypeError, "x must have a floating dtype"),
    ("complex", jnp.ones((2, 8), jnp.complex64), TypeError, "x must have a floating dtype"),
    ("list", [[1.0] * 8] * 2, TypeError, "x must be a JAX or NumPy array"),
    ("None", None, TypeError, "x must be a JAX or NumPy array"),
    ("float8_e4m3fn", X.astype(F8), TypeError, "x must be float16, bfloat16, float32 or float64"),
    ("float8_e5m2", X.astype(jnp.float8_e5m2), TypeError, "x must be float16, bfloat16"),
]


def _norm_ops():
  """``(name, call(x, **kw))`` of every norm entry point (ops, fused ops, Jacobians)."""
  return [
      ("rms_norm", lambda x, **kw: jaxnorm.rms_norm(x, S, **kw)),
      ("layer_norm", lambda x, **kw: jaxnorm.layer_norm(x, S, B, **kw)),
      ("add_rms_norm", lambda x, **kw: jaxnorm.add_rms_norm(x, X, S, **kw)),
      ("add_layer_norm", lambda x, **kw: jaxnorm.add_layer_norm(x, X, S, B, **kw)),
      ("rms_norm_jacobian", lambda x, **kw: jaxnorm.rms_norm_jacobian(x, S, **kw)),
      ("layer_norm_jacobian", lambda x, **kw: jaxnorm.layer_norm_jacobian(x, S, **kw)),
  ]


def _norm_rows():
  rows = []
  jacobian_kw = {"epsilon", "axis", "mask", "epsilon_placement", "zero_centered_scale"}
  for op, call in _norm_ops():
    for kw, exc, name in _NORM_KW:
      if op.endswith("jacobian") and not set(kw) <= jacobian_kw:
        continue
      key = ",".join(f"{k}={v!r}" for k, v in kw.items())[:40]
      rows.append((f"{op}-{key}", functools.partial(call, X, **kw), exc, name))
    for key, x, exc, text in _BAD_X:
      rows.append((f"{op}-x-{key}", functools.partial(call, x), exc, text))
  for op in ("rms_norm", "layer_norm"):
    f = getattr(jaxnorm, op)
    rows += [
        (f"{op}-scale-shape", lambda f=f: f(X, jnp.ones(7)), ValueError, "scale"),
        (f"{op}-scale-int", lambda f=f: f(X, jnp.ones(8, jnp.int32)), TypeError, "scale"),
        (f"{op}-scale-list", lambda f=f: f(X, [1.0] * 8), TypeError, "scale"),
        (f"{op}-memory_efficient-str", lambda f=f: f(X, S, memory_efficient="yes"), TypeError,
         "memory_efficient"),
        (f"{op}-memory_efficient-zero-scale", lambda f=f: f(X, S.at[1].set(0), memory_efficient=True),
         ValueError, "memory_efficient=True"),
        (f"{op}-memory_efficient-zero-scale-grad",
         lambda f=f: jax.grad(lambda s: jnp.sum(f(X, s, memory_efficient=True) ** 2))(S.at[1].set(0)),
         ValueError, "memory_efficient=True"),
        (f"{op}-memory_efficient-zero-scale-vjp",
         lambda f=f: jax.vjp(lambda s: f(X, s, memory_efficient=True), S.at[1].set(0)),
         ValueError, "memory_efficient=True"),
        (f"{op}-memory_efficient-zero-scale-jvp",
         lambda f=f: jax.jvp(lambda s: f(X, s, memory_efficient=True), (S.at[1].set(0),), (S,)),
         ValueError, "memory_efficient=True"),
        (f"{op}-row-1e19", lambda f=f: f(X * 1e19), ValueError, "past the float range"),
        (f"{op}-row-1e19-grad", lambda f=f: jax.grad(lambda x: jnp.sum(f(x) ** 2))(X * 1e19),
         ValueError, "past the float range"),
        (f"{op}-row-1e-20-eps0", lambda f=f: f(X * 1e-20, epsilon=0.0), ValueError,
         "below the float range"),
        (f"{op}-epsilon-1e39-jit", lambda f=f: jax.jit(lambda x: f(x, S, epsilon=1e39))(X),
         ValueError, "epsilon=1e+39"),
        (f"{op}-epsilon-1e39-grad",
         lambda f=f: jax.grad(lambda x: jnp.sum(f(x, S, epsilon=1e39)))(X), ValueError,
         "epsilon=1e+39"),
        (f"{op}-epsilon-1e39-bfloat16", lambda f=f: f(X.astype(jnp.bfloat16), epsilon=1e39),
         ValueError, "epsilon=1e+39"),
    ]
    # The float range (issue 56): huge rows 1e19..1e30 and tiny ones with epsilon=0, the value
    # and every eager derivative (the JVP rule checks its concrete primal).
    grad = lambda f, x, **kw: jax.grad(lambda x: jnp.sum(f(x, S, **kw) ** 2))(x)  # noqa: E731
    for sc in (1e20, 1e25, 1e30):
      rows += [
          (f"{op}-row-{sc:.0e}", lambda f=f, sc=sc: f(X.at[1].multiply(sc)), ValueError,
           "past the float range"),
          (f"{op}-row-{sc:.0e}-grad", lambda f=f, sc=sc: grad(f, X * sc), ValueError,
           "past the float range"),
      ]
    for sc in (1e-25, 1e-30, 1e-40):  # 1e-40: subnormal, made on the host (XLA:CPU flushes it)
      tiny = jnp.asarray((np.asarray(X, np.float64) * sc).astype(np.float32))
      rows += [
          (f"{op}-row-{sc:.0e}-eps0", lambda f=f, t=tiny: f(t, epsilon=0.0), ValueError,
           "below the float range"),
          (f"{op}-row-{sc:.0e}-eps0-grad", lambda f=f, t=tiny: grad(f, t, epsilon=0.0),
           ValueError, "below the float range"),
      ]
    rows += [
        (f"{op}-row-1e19-vjp", lambda f=f: jax.vjp(lambda x: f(x, S), X * 1e19), ValueError,
         "past the float range"),
        (f"{op}-row-1e19-jvp", lambda f=f: jax.jvp(lambda x: f(x, S), (X * 1e19,), (X,)),
         ValueError, "past the float range"),
        (f"{op}-row-1e19-dscale", lambda f=f: jax.grad(lambda s: jnp.sum(f(X * 1e19, s)))(S),
         ValueError, "past the float range"),
        (f"{op}-row-1e19-pallas",
         lambda f=f: f(X * 1e19, pallas=jaxnorm.PallasConfig(interpret=True), impl="pallas"),
         ValueError, "past the float range"),
        (f"{op}_jacobian-row-1e19", lambda op=op: getattr(jaxnorm, f"{op}_jacobian")(X * 1e19),
         ValueError, f"{op}_jacobian: 2 row(s) of x are past the float range"),
        (f"{op}_jacobian-row-1e-30-eps0",
         lambda op=op: getattr(jaxnorm, f"{op}_jacobian")(X * 1e-30, epsilon=0.0), ValueError,
         "below the float range"),
    ]
  rows += [
      ("layer_norm-bias-shape", lambda: jaxnorm.layer_norm(X, S, jnp.ones(3)), ValueError, "bias"),
      ("layer_norm-bias-int", lambda: jaxnorm.layer_norm(X, S, jnp.ones(8, jnp.int32)), TypeError,
       "bias"),
      ("layer_norm-use_fast_variance-int", lambda: jaxnorm.layer_norm(X, use_fast_variance=1),
       TypeError, "use_fast_variance"),
      ("layer_norm-grad-float8", lambda: jax.grad(lambda x: jnp.sum(jaxnorm.layer_norm(x)))(X.astype(F8)),
       TypeError, "x must be float16"),
      ("layer_norm-float8-dtype-f32", lambda: jaxnorm.layer_norm(X.astype(F8), dtype=jnp.float32),
       TypeError, "x must be float16"),
  ]
  for op in ("add_rms_norm", "add_layer_norm"):
    f = getattr(jaxnorm, op)
    rows += [
        (f"{op}-residual-shape", lambda f=f: f(X, X[:1]), ValueError, "residual"),
        (f"{op}-residual-int", lambda f=f: f(X, X.astype(jnp.int32)), TypeError, "residual"),
        (f"{op}-residual-float8", lambda f=f: f(X, X.astype(F8)), TypeError, "residual must be float16"),
        (f"{op}-residual-None", lambda f=f: f(X, None), TypeError, "residual"),
        (f"{op}-residual_scale-nan", lambda f=f: f(X, X, residual_scale=float("nan")), ValueError,
         "residual_scale"),
        (f"{op}-residual_scale-bool", lambda f=f: f(X, X, residual_scale=True), TypeError,
         "residual_scale"),
        (f"{op}-residual_scale-vector", lambda f=f: f(X, X, residual_scale=jnp.ones(2)), ValueError,
         "residual_scale"),
        (f"{op}-residual_dtype-int", lambda f=f: f(X, X, residual_dtype=jnp.int32), TypeError,
         "residual_dtype"),
        (f"{op}-residual_dtype-float33", lambda f=f: f(X, X, residual_dtype="float33"), TypeError,
         "residual_dtype must be a floating dtype or None (e.g. jnp.float32), got str 'float33'"),
        (f"{op}-residual_dtype-complex", lambda f=f: f(X, X, residual_dtype=jnp.complex64),
         TypeError, "residual_dtype must be a floating dtype or None, got complex64"),
        (f"{op}-residual_dtype-3", lambda f=f: f(X, X, residual_dtype=3), TypeError,
         "residual_dtype must be a floating dtype"),
        (f"{op}-h-1e19", lambda f=f: f(X, X * 1e19), ValueError, "residual_scale * residual"),
    ]
  # epsilon past the statistics' range: refused with the arguments, so traced x too (issue 65).
  for op, call in _norm_ops():
    for placement in ("inside", "outside") if not op.endswith("jacobian") else ():
      rows.append((f"{op}-epsilon-1e39-{placement}-jit",
                   lambda call=call, p=placement: jax.jit(
                       lambda x: call(x, epsilon=1e39, epsilon_placement=p))(X),
                   ValueError, "epsilon=1e+39 is past the float range"))
  return rows


def _pointwise_rows():
  a = jnp.asarray(0.5)
  rows = []
  for op, call in (("dyt", lambda x, **kw: jaxnorm.dyt(x, a, **kw)),
                   ("derf", lambda x, **kw: jaxnorm.derf(x, a, jnp.asarray(0.1), **kw))):
    for key, x, exc, text in _BAD_X:
      rows.append((f"{op}-x-{key}", functools.partial(call, x), exc, text))
    rows += [
        (f"{op}-dtype-int", functools.partial(call, X, dtype=jnp.int32), TypeError, "dtype"),
        (f"{op}-dtype-float33", functools.partial(call, X, dtype="float33"), TypeError,
         "dtype must be a floating dtype or None (e.g. jnp.float32), got str 'float33'"),
        (f"{op}-dtype-complex", functools.partial(call, X, dtype=jnp.complex64), TypeError,
         "dtype must be a floating dtype or None, got complex64"),
        (f"{op}-scale-shape", functools.partial(call, X, scale=jnp.ones(7)), ValueError, "scale"),
        (f"{op}-bias-shape", functools.partial(call, X, bias=jnp.ones((3, 8))), ValueError, "bias"),
        (f"{op}-scale-int", functools.partial(call, X, scale=jnp.ones(8, jnp.int32)), TypeError,
         "scale"),
    ]
  rows += [
      ("dyt-alpha-int", lambda: jaxnorm.dyt(X, jnp.ones((), jnp.int32)), TypeError, "alpha"),
      ("dyt-alpha-None", lambda: jaxnorm.dyt(X, None), TypeError, "alpha"),
      ("dyt-alpha-shape", lambda: jaxnorm.dyt(X, jnp.ones(7)), ValueError, "alpha"),
      ("derf-shift-shape", lambda: jaxnorm.derf(X, a, jnp.ones(7)), ValueError, "shift"),
      ("derf-shift-None", lambda: jaxnorm.derf(X, a, None), TypeError, "shift"),
  ]
  return rows


def _gated_rows():
  g = jaxnorm.gated_rms_norm
  rows = [
      ("gated-z-None", lambda: g(X, None), TypeError, "z must be"),
      ("gated-z-shape", lambda: g(X, X[:1]), ValueError, "z (the gate)"),
      ("gated-z-int", lambda: g(X, X.astype(jnp.int32)), TypeError, "z must have a floating"),
      ("gated-z-float8", lambda: g(X, X.astype(F8)), TypeError, "z must be float16"),
      ("gated-scale-shape", lambda: g(X, X, jnp.ones(7)), ValueError, "scale"),
      ("gated-scale-float8", lambda: g(X, X, jnp.ones(8, F8)), TypeError, "scale must be float16"),
      ("gated-epsilon-neg", lambda: g(X, X, epsilon=-1.0), ValueError, "epsilon"),
      ("gated-epsilon-str", lambda: g(X, X, epsilon="0"), TypeError, "epsilon"),
      ("gated-epsilon-1e39", lambda: g(X, X, epsilon=1e39), ValueError, "epsilon=1e+39"),
      ("gated-epsilon-1e39-jit", lambda: jax.jit(lambda x: g(x, X, epsilon=1e39))(X), ValueError,
       "epsilon=1e+39"),
      ("gated-dtype-str", lambda: g(X, X, dtype="float8"), TypeError, "dtype must be a floating"),
      ("gated-group_size-0", lambda: g(X, X, group_size=0), ValueError, "group_size"),
      ("gated-group_size-3", lambda: g(X, X, group_size=3), ValueError, "group_size"),
      ("gated-group_size-float", lambda: g(X, X, group_size=4.0), TypeError, "group_size"),
      ("gated-norm_before_gate-int", lambda: g(X, X, norm_before_gate=1), TypeError,
       "norm_before_gate"),
      ("gated-dtype-int", lambda: g(X, X, dtype=jnp.int32), TypeError, "dtype"),
      ("gated-dtype-float33", lambda: g(X, X, dtype="float33"), TypeError,
       "dtype must be a floating dtype or None (e.g. jnp.float32), got str 'float33'"),
      ("gated-epsilon-1e39-grad", lambda: jax.grad(lambda x: jnp.sum(g(x, X, epsilon=1e39)))(X),
       ValueError, "epsilon=1e+39 is past the float range"),
      ("gated-epsilon-1e39-bfloat16",
       lambda: g(X.astype(jnp.bfloat16), X.astype(jnp.bfloat16), epsilon=1e39), ValueError,
       "epsilon=1e+39 is past the float range of the statistics (float32"),
      ("gated-impl", lambda: g(X, X, impl="cuda"), ValueError, "impl"),
      ("gated-pallas", lambda: g(X, X, pallas="interpret"), TypeError, "pallas"),
      ("gated-backend_config", lambda: g(X, X, backend_config="interpret"), TypeError,
       "backend_config"),
      ("gated-backend_config-and-pallas", lambda: g(X, X, backend_config=jaxnorm.PallasConfig(),
                                                    pallas=jaxnorm.PallasConfig()), ValueError,
       "backend_config= and its alias pallas="),
      ("gated-x-scalar", lambda: g(jnp.ones(()), jnp.ones(())), ValueError, "x must have at least"),
      ("gated-casting-str", lambda: g(X, X, casting="bf16"), ValueError, "casting must be one of"),
      ("gated-casting-None", lambda: g(X, X, casting=None), ValueError, "casting must be one of"),
  ]
  for key, x, exc, text in _BAD_X:
    rows.append((f"gated-x-{key}", functools.partial(g, x, X), exc, text))
  rows += [  # the float range, per group (issue 56)
      ("gated-row-1e19", lambda: g(X * 1e19, X), ValueError, "of x are past the float range"),
      ("gated-group-1e30", lambda: g(X.at[0, :4].multiply(1e30), X, group_size=4), ValueError,
       "past the float range"),
      ("gated-gated-row-1e19", lambda: g(X * 1e19, X + 3.0, norm_before_gate=False), ValueError,
       "of x * silu(z) are past the float range"),
      ("gated-row-1e19-grad", lambda: jax.grad(lambda x: jnp.sum(g(x, X) ** 2))(X * 1e19),
       ValueError, "past the float range"),
      ("gated-row-1e-30-eps0", lambda: g(X * 1e-30, X, epsilon=0.0), ValueError,
       "below the float range"),
  ]
  return rows


def _layer_rows():
  r = nnx.Rngs(0)
  k = jax.random.key(0)
  rows = []
  for name in ("LayerNorm", "RMSNorm"):
    N, L = getattr(jnn, name), getattr(jln, name)
    rows += [
        (f"nnx.{name}-x-float8", lambda N=N: N(8, rngs=r)(X.astype(F8)), TypeError, "x must be float16"),
        (f"nnx.{name}-x-features", lambda N=N: N(8, rngs=r)(jnp.ones((2, 7))), ValueError, "7"),
        (f"nnx.{name}-epsilon", lambda N=N: N(8, epsilon=-1.0, rngs=r)(X), ValueError, "epsilon"),
        (f"nnx.{name}-num_features", lambda N=N: N(0, rngs=r), ValueError, "num_features"),
        (f"nnx.{name}-num_features-str", lambda N=N: N("8", rngs=r), TypeError, "num_features"),
        (f"nnx.{name}-use_scale-str", lambda N=N: N(8, use_scale="no", rngs=r), TypeError,
         "use_scale must be a bool"),
        (f"linen.{name}-use_scale-int", lambda L=L: L(use_scale=0).init(k, X), TypeError,
         "use_scale must be a bool"),
        (f"linen.{name}-force_float32_reductions-str",
         lambda L=L: L(force_float32_reductions="yes").init(k, X), TypeError,
         "force_float32_reductions must be a bool"),
        (f"nnx.{name}-placement", lambda N=N: N(8, epsilon_placement="x", rngs=r)(X), ValueError,
         "epsilon_placement"),
        (f"nnx.{name}-impl", lambda N=N: N(8, impl="cuda", rngs=r)(X), ValueError, "impl"),
        (f"nnx.{name}-casting", lambda N=N: N(8, casting="bf16", rngs=r)(X), ValueError, "casting"),
        (f"nnx.{name}-backend_config", lambda N=N: N(8, backend_config=1, rngs=r), TypeError,
         "backend_config"),
        (f"linen.{name}-backend_config", lambda L=L: L(backend_config={}).init(k, X), TypeError,
         "backend_config"),
        (f"nnx.{name}-backend_config-oracle", lambda N=N: N(8, impl="xla", rngs=r,
                                                             backend_config=object())(X),
         TypeError, "backend_config"),
        (f"nnx.{name}-axis_name", lambda N=N: N(8, axis_name="i", rngs=r)(X), ValueError, "axis_name"),
        (f"nnx.{name}-mask", lambda N=N: N(8, rngs=r)(X, mask=jnp.ones((2, 8))), TypeError, "mask"),
        (f"nnx.{name}-residual-float8", lambda N=N: N(8, rngs=r)(X, residual=X.astype(F8)),
         TypeError, "residual must be float16"),
        (f"nnx.{name}-row-1e19", lambda N=N: N(8, rngs=r)(X * 1e19), ValueError,
         "past the float range"),
        (f"linen.{name}-row-1e19", lambda L=L: L().init(k, X * 1e19), ValueError,
         "past the float range"),
        (f"nnx.{name}-memory_efficient-zero-grad",
         lambda N=N: nnx.grad(lambda m: jnp.sum(m(X) ** 2))(_zero_scale(N(8, memory_efficient=True, rngs=r))),
         ValueError, "memory_efficient=True"),
        (f"linen.{name}-x-float8", lambda L=L: L().init(k, X.astype(F8)), TypeError, "x must be float16"),
        (f"nnx.{name}-epsilon-1e39", lambda N=N: N(8, epsilon=1e39, rngs=r)(X), ValueError,
         "epsilon=1e+39"),
        (f"linen.{name}-epsilon-1e39", lambda L=L: L(epsilon=1e39).init(k, X), ValueError,
         "epsilon=1e+39"),
        (f"nnx.{name}-dtype-str", lambda N=N: N(8, dtype="float8", rngs=r), TypeError,
         "dtype must be a floating dtype"),
        (f"nnx.{name}-dtype-int", lambda N=N: N(8, dtype=jnp.int32, rngs=r), TypeError,
         "dtype must be a floating dtype"),
        (f"nnx.{name}-param_dtype-int", lambda N=N: N(8, param_dtype=jnp.int32, rngs=r), TypeError,
         "param_dtype must be a floating dtype"),
        (f"nnx.{name}-param_dtype-str", lambda N=N: N(8, param_dtype="f32", rngs=r), TypeError,
         "param_dtype must be a floating dtype"),
        (f"linen.{name}-dtype-str", lambda L=L: L(dtype="float8").init(k, X), TypeError,
         "dtype must be a floating dtype"),
        (f"linen.{name}-dtype-int", lambda L=L: L(dtype=jnp.int32).init(k, X), TypeError,
         "dtype must be a floating dtype"),
        (f"linen.{name}-param_dtype-int", lambda L=L: L(param_dtype=jnp.int32).init(k, X), TypeError,
         "param_dtype must be a floating dtype"),
        (f"linen.{name}-param_dtype-str", lambda L=L: L(param_dtype=3).init(k, X), TypeError,
         "param_dtype must be a floating dtype"),
        (f"linen.{name}-epsilon", lambda L=L: L(epsilon=float("nan")).init(k, X), ValueError, "epsilon"),
        (f"linen.{name}-placement", lambda L=L: L(epsilon_placement=1).init(k, X), ValueError,
         "epsilon_placement"),
        (f"linen.{name}-axis_name", lambda L=L: L(axis_name="i").init(k, X), ValueError, "axis_name"),
        (f"linen.{name}-reduction_axes", lambda L=L: L(reduction_axes=5).init(k, X), ValueError,
         "reduction_axes"),
        (f"linen.{name}-mask", lambda L=L: L().init(k, X, mask=jnp.ones((3, 8), bool)), ValueError,
         "mask"),
    ]
  rows += [
      ("nnx.GatedRMSNorm-casting", lambda: jnn.GatedRMSNorm(8, casting="x", rngs=r), ValueError,
       "casting must be one of"),
      ("linen.GatedRMSNorm-casting", lambda: jln.GatedRMSNorm(casting=3).init(k, X, X), ValueError,
       "casting must be one of"),
      ("nnx.GatedRMSNorm-backend_config", lambda: jnn.GatedRMSNorm(8, backend_config=1, rngs=r)(X, X),
       TypeError, "backend_config"),
      ("linen.GatedRMSNorm-backend_config", lambda: jln.GatedRMSNorm(backend_config=1).init(k, X, X),
       TypeError, "backend_config"),
      ("nnx.GatedRMSNorm-z-None", lambda: jnn.GatedRMSNorm(8, rngs=r)(X, None), TypeError, "z must be"),
      ("nnx.GatedRMSNorm-x-float8", lambda: jnn.GatedRMSNorm(8, rngs=r)(X.astype(F8), X), TypeError,
       "x must be float16"),
      ("nnx.GatedRMSNorm-group", lambda: jnn.GatedRMSNorm(8, group_size=3, rngs=r), ValueError,
       "group_size"),
      ("nnx.GatedRMSNorm-param_dtype", lambda: jnn.GatedRMSNorm(8, param_dtype=jnp.int32, rngs=r),
       TypeError, "param_dtype must be a floating dtype"),
      ("nnx.GatedRMSNorm-dtype", lambda: jnn.GatedRMSNorm(8, dtype="float8", rngs=r),
       TypeError, "dtype must be a floating dtype"),
      ("nnx.GatedRMSNorm-epsilon-1e39", lambda: jnn.GatedRMSNorm(8, epsilon=1e39, rngs=r)(X, X),
       ValueError, "epsilon=1e+39"),
      ("linen.GatedRMSNorm-epsilon-1e39", lambda: jln.GatedRMSNorm(epsilon=1e39).init(k, X, X),
       ValueError, "epsilon=1e+39"),
      ("linen.GatedRMSNorm-z-None", lambda: jln.GatedRMSNorm().init(k, X, None), TypeError, "z must be"),
      ("linen.GatedRMSNorm-x-float8", lambda: jln.GatedRMSNorm().init(k, X.astype(F8), X), TypeError,
       "x must be float16"),
      ("nnx.DyT-x-float8", lambda: jnn.DyT(8, rngs=r)(X.astype(F8)), TypeError, "x must be float16"),
      ("nnx.Derf-x-float8", lambda: jnn.Derf(8, rngs=r)(X.astype(F8)), TypeError, "x must be float16"),
      ("nnx.DyT-alpha_init", lambda: jnn.DyT(8, alpha_init_value=float("nan"), rngs=r), TypeError,
       "alpha_init_value"),
      ("linen.DyT-x-float8", lambda: jln.DyT().init(k, X.astype(F8)), TypeError, "x must be float16"),
      ("linen.DyT-alpha_init", lambda: jln.DyT(alpha_init_value="a").init(k, X), TypeError,
       "alpha_init_value"),
      ("nnx.LayerNorm-use_bias-str", lambda: jnn.LayerNorm(8, use_bias="no", rngs=r), TypeError,
       "use_bias must be a bool"),
      ("linen.LayerNorm-use_bias-None", lambda: jln.LayerNorm(use_bias=None).init(k, X), TypeError,
       "use_bias must be a bool"),
      ("nnx.DyT-use_bias-str", lambda: jnn.DyT(8, use_bias="no", rngs=r), TypeError,
       "use_bias must be a bool"),
      ("linen.DyT-use_scale-int", lambda: jln.DyT(use_scale=1).init(k, X), TypeError,
       "use_scale must be a bool"),
  ]
  return rows + _layer_dtype_rows(r, k)


# Every layer's dtype= and param_dtype=, refused by name before a parameter is made (issue 65).
_BAD_DTYPES = [("int32", jnp.int32, "must be a floating dtype or None, got int32"),
               ("float33", "float33", "must be a floating dtype or None (e.g. jnp.float32), got "
                                      "str 'float33', which is not a dtype"),
               ("complex64", jnp.complex64, "must be a floating dtype or None, got complex64")]


def _layer_dtype_rows(r, k):
  rows = []
  for name in ("DyT", "Derf", "LayerNorm", "RMSNorm", "GatedRMSNorm"):
    N, L = getattr(jnn, name), getattr(jln, name)
    args = (X, X) if name == "GatedRMSNorm" else (X,)
    for arg in ("dtype", "param_dtype"):
      for key, bad, text in _BAD_DTYPES:
        rows += [
            (f"nnx.{name}-{arg}-{key}", lambda N=N, kw={arg: bad}: N(8, rngs=r, **kw), TypeError,
             f"{arg} {text}"),
            (f"linen.{name}-{arg}-{key}", lambda L=L, kw={arg: bad}, a=args: L(**kw).init(k, *a),
             TypeError, f"{arg} {text}"),
        ]
  rows += [
      ("nnx.GatedRMSNorm-impl-built", lambda: jnn.GatedRMSNorm(8, impl="cuda", rngs=r), ValueError,
       "impl must be one of ("),
      ("nnx.GatedRMSNorm-impl-None", lambda: jnn.GatedRMSNorm(8, impl=None, rngs=r), ValueError,
       "impl must be one of ("),
      ("nnx.GatedRMSNorm-backend_config-built",
       lambda: jnn.GatedRMSNorm(8, backend_config="interpret", rngs=r), TypeError,
       "backend_config"),
      ("nnx.GatedRMSNorm-pallas-built", lambda: jnn.GatedRMSNorm(8, pallas=1, rngs=r), TypeError,
       "pallas"),
  ]
  for name in ("LayerNorm", "RMSNorm"):
    N, L = getattr(jnn, name), getattr(jln, name)
    rows += [
        (f"nnx.{name}-epsilon-1e39-outside-jit",
         lambda N=N: jax.jit(N(8, epsilon=1e39, epsilon_placement="outside", rngs=r))(X),
         ValueError, "epsilon=1e+39 is past the float range"),
        (f"linen.{name}-epsilon-1e39-outside",
         lambda L=L: L(epsilon=1e39, epsilon_placement="outside").init(k, X), ValueError,
         "epsilon=1e+39 is past the float range"),
    ]
  return rows


def _zero_scale(layer):
  layer.scale[...] = layer.scale[...].at[2].set(0.0)
  return layer


def _model_rows():
  lm = TransformerLM(TransformerConfig(**TINY_LM), rngs=nnx.Rngs(0))
  rows = [
      ("model-tokens-negative", lambda: lm(jnp.full((1, 4), -1, jnp.int32)), ValueError,
       "tokens must be ids in [0, 16)"),
      ("model-tokens-vocab", lambda: lm(jnp.full((1, 4), 16, jnp.int32)), ValueError,
       "tokens must be ids in [0, 16)"),
      ("model-tokens-300", lambda: lm(jnp.asarray([[1, 2, 300]], jnp.int32)), ValueError,
       "the first 300 at index (0, 2)"),
      ("model-tokens-float", lambda: lm(jnp.ones((1, 4))), TypeError, "tokens must be an integer"),
      ("model-tokens-1d", lambda: lm(jnp.ones((4,), jnp.int32)), ValueError, "tokens must have shape"),
      ("model-tokens-long", lambda: lm(jnp.ones((1, 9), jnp.int32)), ValueError, "max_len"),
  ]
  bad_config = [
      (dict(d_model=0), ValueError, "d_model"), (dict(n_heads=3), ValueError, "n_heads"),
      (dict(vocab_size=1.5), TypeError, "vocab_size"), (dict(norm_type="batch"), ValueError, "norm_type"),
      (dict(norm_position="mid"), ValueError, "norm_position"), (dict(epsilon=-1.0), ValueError, "epsilon"),
      (dict(dtype="float8"), ValueError, "dtype"), (dict(casting="x"), ValueError, "casting"),
      (dict(embed_scale=0.0), ValueError, "embed_scale"), (dict(qk_norm="yes"), ValueError, "qk_norm"),
      (dict(scan_layers=1), TypeError, "scan_layers"), (dict(init="he"), ValueError, "init"),
      (dict(activation="tanh"), ValueError, "activation"), (dict(positions="abs"), ValueError, "positions"),
      # issue 65: epsilon within the statistics' range of dtype; every option by its own name.
      (dict(epsilon=1e39), ValueError, "epsilon=1e+39 is past the float range"),
      (dict(epsilon=4.3e37, dtype="bfloat16"), ValueError, "epsilon=4.3e+37 is past"),
      (dict(epsilon=1e39, norm_type="dyt"), ValueError, "epsilon=1e+39 is past"),
      (dict(norm_impl="Flax"), ValueError, "norm_impl must be one of ('jaxnorm', 'flax')"),
      (dict(qk_norm_scale="per_token"), ValueError, "qk_norm_scale must be one of"),
      (dict(dtype=jnp.int32), ValueError, "dtype must be one of ('float32'"),
      (dict(dtype=None), ValueError, "dtype must be one of ('float32'"),
      (dict(dtype="float33"), ValueError, "dtype must be one of ('float32'"),
      (dict(norm_type="dyt", norm_impl="flax"), ValueError, "norm_type='dyt'"),
      (dict(qk_norm="derf", norm_impl="flax"), ValueError, "qk_norm='derf'"),
      (dict(norm_position=None), ValueError, "norm_position must be one of"),
      (dict(init=None), ValueError, "init must be one of"),
  ]
  for kw, exc, name in bad_config:
    key = ",".join(f"{k}={v!r}" for k, v in kw.items())
    rows.append((f"config-{key}", lambda kw=kw: TransformerConfig(**{**TINY_LM, **kw}), exc, name))
  return rows


def _kit_rows():
  """``jaxnorm.testing``'s option and dtype arguments (issue 65): the same shared checks."""
  one = (jnp.ones(3),)
  check = lambda **kw: jt.check_rule(jnp.sin, jnp.sin, one, **kw)  # noqa: E731
  rows = [
      ("kit-modes-None", lambda: check(modes=None), TypeError, "modes must be a tuple of options"),
      ("kit-modes-str", lambda: check(modes="rev"), TypeError, "write modes=('rev',)"),
      ("kit-modes-unknown", lambda: check(modes=("rev", "up")), ValueError,
       "modes must be a subset of ('rev', 'fwd'), got unknown ['up']"),
      ("kit-transforms-int", lambda: check(transforms=3), TypeError, "transforms must be a tuple"),
      ("kit-transforms-str", lambda: check(transforms="vmap"), TypeError,
       "write transforms=('vmap',)"),
      ("kit-transforms-nonstr", lambda: check(transforms=(1,)), ValueError,
       "transforms must be a subset"),
      ("kit-allow-str", lambda: check(allow="unsupported"), TypeError, "write allow=('unsupported',)"),
      ("kit-allow-unknown", lambda: check(allow=("slow",)), ValueError, "allow must be a subset"),
      ("kit-nonfinite-None", lambda: check(nonfinite=None), ValueError,
       "nonfinite must be one of ('any', 'match'), got None"),
      ("kit-nonfinite-bool", lambda: check(nonfinite=True), ValueError, "nonfinite must be one of"),
      ("kit-nonfinite-list", lambda: check(nonfinite=["any"]), ValueError, "nonfinite must be one of"),
      ("kit-Tolerance-compute_dtype-float33", lambda: jt.Tolerance(compute_dtype="float33"), TypeError,
       "Tolerance.compute_dtype must be a floating dtype or None (e.g. jnp.float32), got str"),
      ("kit-Tolerance-compute_dtype-int", lambda: jt.Tolerance(compute_dtype=jnp.int32), TypeError,
       "Tolerance.compute_dtype must be a floating dtype or None, got int32"),
      ("kit-dtypes-float33", lambda: jt.dtypes(("float32", "float33")), TypeError,
       "allowed[1] must be a floating dtype (e.g. jnp.float32), got str 'float33'"),
      ("kit-dtypes-int", lambda: jt.dtypes((jnp.int32,)), TypeError,
       "allowed[0] must be a floating dtype, got int32"),
      ("kit-dtypes-None", lambda: jt.dtypes((None,)), TypeError,
       "allowed[0] must be a floating dtype (e.g. jnp.float32), got NoneType None"),
      ("kit-dtypes-str", lambda: jt.dtypes("float32"), TypeError, "allowed must be a tuple of dtypes"),
      ("kit-arrays-dtype-int", lambda: jt.arrays(jnp.int32, (2, 3)), TypeError,
       "dtype must be a floating dtype, got int32"),
      ("kit-arrays-dtype-float33", lambda: jt.arrays("float33", (2, 3)), TypeError,
       "dtype must be a floating dtype (e.g. jnp.float32)"),
      ("kit-arrays-kinds-None", lambda: jt.arrays("float32", (2, 3), kinds=None), TypeError,
       "kinds must be a tuple of options"),
      ("kit-arrays-kinds-str", lambda: jt.arrays("float32", (2, 3), kinds="tiny"), TypeError,
       "write kinds=('tiny',)"),
      ("kit-arrays-kinds-unknown", lambda: jt.arrays("float32", (2, 3), kinds=("tiny", "odd")),
       ValueError, "kinds must be a subset"),
      ("kit-arrays-kinds-empty", lambda: jt.arrays("float32", (2, 3), kinds=()), ValueError,
       "kinds must be a non-empty subset"),
      ("kit-arrays-nonfinite-str", lambda: jt.arrays("float32", (2, 3), nonfinite="match"),
       TypeError, "nonfinite must be a bool"),
  ]
  return rows


BAD = (_norm_rows() + _pointwise_rows() + _gated_rows() + _layer_rows() + _model_rows() +
       _kit_rows())


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_refused_naming_the_argument(case):
  _, thunk, exc, text = case
  with pytest.raises(exc) as info:
    thunk()
  assert text in str(info.value), f"{type(info.value).__name__}: {info.value}"


# ---------------------------------------------------------------------------------------------
# Edge rows: legal, unusual input; the value against float64.


def _rms64(x, eps=1e-6):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def _ln64(x, eps=1e-6):
  x = np.asarray(x, np.float64)
  c = x - x.mean(-1, keepdims=True)
  return c / np.sqrt(np.mean(c * c, -1, keepdims=True) + eps)


_RNG = np.random.default_rng(3)
_ROWS = {
    "zero-row": np.zeros((2, 8)),
    "one-feature": _RNG.standard_normal((3, 1)),
    "constant-row": np.full((2, 8), 3.0),
    "large-mean": 1e4 + _RNG.standard_normal((2, 16)),
    "tiny-eps-positive": 1e-30 * _RNG.standard_normal((2, 8)),
    "huge-inside-range": 1e17 * _RNG.standard_normal((2, 8)),
    "small-inside-range": 1e-15 * _RNG.standard_normal((2, 8)),
    "mixed-magnitudes": np.stack([1e-3 * _RNG.standard_normal(8), 1e3 * _RNG.standard_normal(8)]),
    "wide": _RNG.standard_normal((1, 300)),
    "three-axes": _RNG.standard_normal((2, 3, 8)),
}
EDGE = [(f"{op}-{k}", op, k) for op in ("rms_norm", "layer_norm") for k in _ROWS]


@pytest.mark.parametrize("case", EDGE, ids=[c[0] for c in EDGE])
def test_edge_input_matches_float64(case):
  _, op, key = case
  x = _ROWS[key]
  y = np.asarray(getattr(jaxnorm, op)(jnp.asarray(x, jnp.float32)), np.float64)
  ref = (_rms64 if op == "rms_norm" else _ln64)(np.asarray(jnp.asarray(x, jnp.float32), np.float64))
  scale = np.maximum(np.abs(ref), 1.0)
  np.testing.assert_array_less(np.abs(y - ref) / scale, 1e-3 if key == "large-mean" else 2e-5)


# Where the row is traced nothing can raise: the documented outcome past the float range is
# non-finite output (docs/derivations.md, "Where the float range ends"; issue 56), on XLA and on
# the kernels (interpret mode), forward and reverse mode.
HUGE = (1e19, 1e20, 1e21, 1e25, 1e30)
TINY = (1e-20, 1e-25, 1e-30, 1e-40)
_X16 = jnp.asarray(np.random.default_rng(1).standard_normal((4, 16)), jnp.float32)
_S16 = jnp.asarray(1 + 0.1 * np.random.default_rng(2).standard_normal(16), jnp.float32)
_W16 = jnp.asarray(np.random.default_rng(4).standard_normal((4, 16)), jnp.float32)


def _traced(op, impl, x, bias=None, epsilon=1e-6, w=_W16):
  """``(y, dx, dscale)`` of ``op`` under ``jax.jit`` (``impl="pallas"``: the kernels, interpreted)."""
  kw = dict(epsilon=epsilon, impl=impl)
  if impl == "pallas":
    kw["pallas"] = jaxnorm.PallasConfig(interpret=True)
  if bias is not None:
    kw["bias"] = bias
  f = lambda x, s: getattr(jaxnorm, op)(x, s, **kw)  # noqa: E731
  dx, ds = jax.jit(jax.grad(lambda x, s: jnp.sum(f(x, s) * w), (0, 1)))(x, _S16)
  return np.asarray(jax.jit(f)(x, _S16)), np.asarray(dx), np.asarray(ds)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_traced_rows_past_the_float_range_are_nan(op, impl):
  """A row scaled by 1e19..1e30 (its statistic overflows to inf): its ``y`` and ``dx`` are NaN in
  every entry, never finite zeros (nor LayerNorm's bias, below); ``dscale`` is NaN in every
  entry, since every feature's sum takes that row; every other row of ``y`` and ``dx`` is
  bitwise the clean call's. Eagerly the same call raises."""
  y0, dx0, _ = _traced(op, impl, _X16)
  others = np.delete(np.arange(4), 1)
  for sc in HUGE:
    x = _X16.at[1].multiply(sc)
    y, dx, ds = _traced(op, impl, x)
    assert np.all(np.isnan(y[1])) and np.all(np.isnan(dx[1])), sc
    assert np.all(np.isnan(ds)), sc
    np.testing.assert_array_equal(y[others], y0[others])
    np.testing.assert_array_equal(dx[others], dx0[others])
    with pytest.raises(ValueError, match="row 1 .flattened. has largest magnitude"):
      getattr(jaxnorm, op)(x, _S16)


@pytest.mark.parametrize("fast", [False, True], ids=["shifted", "fast-variance"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_traced_huge_rows_on_as_many_rows_as_ynnpack_takes(dtype, fast):
  """On 4096 rows or more XLA:CPU hands the statistics to YNNPACK. There the forward alone is
  the program YNNPACK fuses whole, without the float range's guard (issue 62): a traced row past
  the range comes out as Flax's does, exact zeros (``rstd`` = 0; LayerNorm's mean pivot keeps
  ``x - mean`` finite), never the finite nonsense (about 1000 x) that YNNPACK's ``max`` of
  ``inf - inf`` gave before issue 56. Every derivative of that row stays NaN (the gradient and
  the JVP run the guarded forward); the other rows are finite, and the same call made eagerly
  raises."""
  x = jnp.tile(_X16, (1024, 1)).at[1].multiply(1e20).astype(dtype)
  cases = [("layer_norm", dict(use_fast_variance=fast))] + ([] if fast else [("rms_norm", {})])
  for op, kw in cases:
    f = lambda x, s: getattr(jaxnorm, op)(x, s, **kw)  # noqa: E731
    y = np.asarray(jax.jit(f)(x, _S16), np.float32)
    assert np.all(y[1] == 0), op
    assert np.all(np.isfinite(np.delete(y, 1, 0))), op
    dx = jax.jit(jax.grad(lambda x, s: jnp.sum(f(x, s).astype(jnp.float32) * _W16[:1])))(x, _S16)
    y2, t = jax.jit(lambda x, s: jax.jvp(lambda x: f(x, s), (x,), (x,)))(x, _S16)
    for name, a in (("dx", dx), ("jvp", t), ("y under jvp", y2)):
      a = np.asarray(a, np.float32)
      assert np.all(np.isnan(a[1])), (op, name)
      assert np.all(np.isfinite(np.delete(a, 1, 0))), (op, name)
    with pytest.raises(ValueError, match="past the float range"):
      f(x, _S16)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_traced_layer_norm_row_past_the_range_is_nan_not_its_bias(impl):
  """With a bias, LayerNorm's huge row is NaN too (r = 0 would have returned the bias: finite
  and wrong), through the forward alone and through the JVP and the fused residual add."""
  bias = jnp.linspace(-1.0, 1.0, 16)
  for sc in (1e19, 1e30):
    x = _X16.at[1].multiply(sc)
    y, _, _ = _traced("layer_norm", impl, x, bias=bias)
    assert np.all(np.isnan(y[1])) and np.all(np.isfinite(np.delete(y, 1, 0))), sc
  kw = dict(impl=impl, pallas=jaxnorm.PallasConfig(interpret=True)) if impl == "pallas" else {}
  x = _X16.at[1].multiply(1e19)
  _, t = jax.jit(lambda x: jax.jvp(lambda x: jaxnorm.layer_norm(x, _S16, bias, **kw), (x,),
                                   (_W16,)))(x)
  assert np.all(np.isnan(np.asarray(t)[1]))
  y, h = jax.jit(lambda x: jaxnorm.add_layer_norm(x, _W16, _S16, bias, **kw))(x)
  assert np.all(np.isnan(np.asarray(y)[1])) and np.all(np.isfinite(np.asarray(h)))


@pytest.mark.parametrize("impl", ["xla", "triton"])
def test_traced_gated_group_past_the_float_range_is_nan(impl):
  """Gated RMSNorm's statistic is per group: a traced group scaled by 1e25 comes back NaN in
  ``y`` and ``dx``, the row's other group and the other rows as the clean call's; eagerly it
  raises naming the group's magnitude."""
  x = _X16[:3, :8]
  z = x + 1.0
  kw = dict(pallas=jaxnorm.PallasConfig(interpret=True)) if impl == "triton" else {}
  f = lambda x: jaxnorm.gated_rms_norm(x, z, group_size=4, impl=impl, **kw)  # noqa: E731
  g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) * z)))
  xx = x.at[1, :4].multiply(1e25)
  y, dx = np.asarray(jax.jit(f)(xx)), np.asarray(g(xx))
  y0, dx0 = np.asarray(jax.jit(f)(x)), np.asarray(g(x))
  assert np.all(np.isnan(y[1, :4])) and np.all(np.isnan(dx[1, :4]))
  np.testing.assert_array_equal(y[1, 4:], y0[1, 4:])
  np.testing.assert_array_equal(dx[1, 4:], dx0[1, 4:])
  np.testing.assert_array_equal(np.delete(y, 1, 0), np.delete(y0, 1, 0))
  np.testing.assert_array_equal(np.delete(dx, 1, 0), np.delete(dx0, 1, 0))
  with pytest.raises(ValueError, match="row 2 .flattened. has largest magnitude"):
    f(xx)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_traced_tiny_rows_with_epsilon_zero_are_not_finite(op, impl):
  """With epsilon=0, a row scaled by 1e-20..1e-40 (its mean square underflows to 0 or below
  float32's normal range, r = inf): ``y`` and ``dx`` of that row have no finite entry, the other
  rows are the clean call's; eagerly it raises."""
  y0, dx0, _ = _traced(op, impl, _X16, epsilon=0.0)
  for sc in TINY:
    x = np.array(_X16)
    x[0] = (x[0].astype(np.float64) * sc).astype(np.float32)  # made in NumPy: 1e-40 stays subnormal
    x = jnp.asarray(x)
    y, dx, _ = _traced(op, impl, x, epsilon=0.0)
    assert not np.any(np.isfinite(y[0])) and not np.any(np.isfinite(dx[0])), sc
    np.testing.assert_array_equal(y[1:], y0[1:])
    np.testing.assert_array_equal(dx[1:], dx0[1:])
    with pytest.raises(ValueError, match="below the float range"):
      getattr(jaxnorm, op)(x, _S16, epsilon=0.0)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_a_non_finite_row_stays_in_its_row(op):
  """NaN and inf rows are not range errors: they propagate (a NaN row is NaN; an inf row has NaN
  where the inf was), in their own row only."""
  x = X.at[0, 3].set(jnp.nan).at[1, 0].set(jnp.inf)
  y = np.asarray(getattr(jaxnorm, op)(jnp.concatenate([x, X])))
  assert np.all(np.isnan(y[0])) and np.isnan(y[1, 0])
  np.testing.assert_array_equal(y[2:], np.asarray(getattr(jaxnorm, op)(X)))


def test_the_range_limits_are_the_documented_ones():
  """``row_range``: sqrt(max / (4 d)) and sqrt(d * tiny) of float32; a row just inside works, the
  same row times 4 (past it) raises."""
  from jaxnorm._concrete_checks import row_range
  huge, tiny = row_range(jnp.float32, 8)
  f32 = np.finfo(np.float32)
  assert huge == pytest.approx(np.sqrt(float(f32.max) / 32)) and tiny == pytest.approx(np.sqrt(8 * float(f32.tiny)))
  row = jnp.full((1, 8), huge / 2, jnp.float32)
  np.testing.assert_allclose(jaxnorm.rms_norm(row), 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match="past the float range"):
    jaxnorm.layer_norm(row * 4)


def test_traced_out_of_range_tokens_give_nan_logits_of_their_sequence_only():
  """The documented behaviour of ids out of range where they are traced: never a wrapped row."""
  lm = TransformerLM(TransformerConfig(**TINY_LM), rngs=nnx.Rngs(0))
  tokens = jnp.asarray([[1, 2, -1, 3], [1, 2, 3, 4], [5, 16, 1, 2]], jnp.int32)
  out = np.asarray(nnx.jit(lambda m, t: m(t))(lm, tokens))
  assert np.all(np.isnan(out[0, 2])) and np.all(np.isnan(out[2, 1]))
  assert np.all(np.isfinite(out[1]))


def test_float8_scale_and_dtype_keep_working():
  s8 = jnp.ones(8, F8)
  np.testing.assert_allclose(jaxnorm.rms_norm(X, s8), jaxnorm.rms_norm(X), rtol=1e-6)
  assert jaxnorm.layer_norm(X, dtype=F8).dtype == F8


def test_axis_name_inside_a_named_vmap_still_works():
  """The features split over a named vmap axis (one feature per instance): the bound axis passes."""
  y = jax.vmap(lambda r: jaxnorm.rms_norm(r, axis_name="i"), axis_name="i")(X.T[:, :, None])
  np.testing.assert_allclose(np.asarray(y)[:, :, 0].T, _rms64(X), rtol=1e-5)


def test_the_table_is_large():
  assert len(BAD) + len(EDGE) >= 200
