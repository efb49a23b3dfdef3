"""Bad input raises a clear error naming the argument, what it got and what was expected.

Each rule has one home (:mod:`jaxnorm._validation`) and one message; the ``*_one_rule`` tests
pass the same bad value through every place that takes it (ops, fused ops, Flax layers, the
model config, the checked kernel API) and pin that one message.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
import _kernel_api as _pallas
from jaxnorm.backends.triton import config as _pallas_config
from jaxnorm.backends import table as _backends
from jaxnorm import _validation as v
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm.models import TransformerConfig
from jaxnorm.ops.table import layer_replacements

X = jnp.ones((2, 3, 8), jnp.float32)
OPS = [jaxnorm.layer_norm, jaxnorm.rms_norm, jaxnorm.layer_norm_jacobian, jaxnorm.rms_norm_jacobian]


@pytest.mark.parametrize("op", OPS)
def test_integer_input(op):
  with pytest.raises(TypeError, match=r"x must have a floating dtype .* got int32"):
    op(jnp.ones((2, 8), jnp.int32))


@pytest.mark.parametrize("op", OPS)
def test_non_array_input(op):
  with pytest.raises(TypeError, match="x must be a JAX or NumPy array"):
    op([[1.0, 2.0]])


@pytest.mark.parametrize("op", OPS)
def test_scale_shape(op):
  with pytest.raises(ValueError, match=r"scale must have the normalized shape \(8,\).*got shape \(7,\)"):
    op(X, jnp.ones(7))


def test_bias_shape_and_dtype():
  with pytest.raises(ValueError, match=r"bias must have the normalized shape \(3, 8\)"):
    jaxnorm.layer_norm(X, jnp.ones((3, 8)), jnp.ones(8)[None], axis=(-2, -1))
  with pytest.raises(TypeError, match="bias must have a floating dtype"):
    jaxnorm.layer_norm(X, None, jnp.ones(8, jnp.int32))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("eps,exc,msg", [
    (-1e-6, ValueError, r"epsilon must be finite and >= 0, got -1e-06"),
    (float("nan"), ValueError, r"epsilon must be finite and >= 0, got nan"),
    (float("inf"), ValueError, r"epsilon must be finite"),
    (jnp.float32(1e-6), TypeError, r"epsilon must be a real number .*not an array"),
    ("1e-6", TypeError, r"epsilon must be a real number"),
    (True, TypeError, r"epsilon must be a real number"),
])
def test_bad_epsilon(op, eps, exc, msg):
  with pytest.raises(exc, match=msg):
    op(X, epsilon=eps)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis,exc,msg", [
    (3, ValueError, r"axis=3: axis 3 is out of range for an input of rank 3; use axes in "
                    r"\[-3, 2\]"),
    (-4, ValueError, r"axis -4 is out of range"),
    (0, ValueError, r"axis must name the trailing axes of x"),
    ((0, 2), ValueError, r"axis must name the trailing axes"),
    ((-1, -1), ValueError, r"axis=\(-1, -1\) repeats axis 2 \(as -1 and -1\)"),
    ((-1, 2), ValueError, r"axis=\(-1, 2\) repeats axis 2 \(as -1 and 2\)"),
    (1.0, TypeError, r"axis must be an int or a non-empty tuple of ints"),
    ((), ValueError, r"axis must name at least one axis, got \(\)"),
])
def test_bad_axis(op, axis, exc, msg):
  with pytest.raises(exc, match=msg):
    op(X, axis=axis)


@pytest.mark.parametrize("op", OPS)
def test_unknown_variant(op):
  with pytest.raises(ValueError, match=r"epsilon_placement must be one of \('inside', 'outside'\), got 'middle'"):
    op(X, epsilon_placement="middle")
  with pytest.raises(TypeError, match="zero_centered_scale must be a bool"):
    op(X, zero_centered_scale="yes")


@pytest.mark.parametrize("op", [jaxnorm.layer_norm, jaxnorm.rms_norm])
def test_unknown_impl_and_unusable_pallas(op):
  with pytest.raises(ValueError, match=re.escape(f"impl must be one of {_backends.IMPLS}, got 'cuda'")):
    op(X, impl="cuda")
  with pytest.raises(ValueError, match="impl='pallas' cannot run this call: the Pallas kernels do not take a mask"):
    op(X, mask=jnp.ones(X.shape, bool), impl="pallas")


@pytest.mark.parametrize("op", [jaxnorm.layer_norm, jaxnorm.rms_norm])
def test_bad_mask(op):
  with pytest.raises(TypeError, match="mask must be a boolean array"):
    op(X, mask=jnp.ones(X.shape, jnp.float32))
  with pytest.raises(ValueError, match=r"mask of shape \(2, 4, 8\) does not broadcast to x of shape \(2, 3, 8\)"):
    op(X, mask=jnp.ones((2, 4, 8), bool))


@pytest.mark.parametrize("op", [jaxnorm.layer_norm, jaxnorm.rms_norm])
def test_bad_dtype_and_groups(op):
  with pytest.raises(TypeError, match="dtype must be a floating dtype or None, got int32"):
    op(X, dtype=jnp.int32)
  with pytest.raises(ValueError, match="axis_index_groups needs axis_name"):
    op(X, axis_index_groups=[[0, 1]])


def test_scalar_input():
  with pytest.raises(ValueError, match="at least one dimension"):
    jaxnorm.layer_norm(jnp.float32(1.0))


def test_numpy_input_is_accepted():
  y = jaxnorm.layer_norm(np.ones((2, 4), np.float32))
  assert y.shape == (2, 4)


# ---------------------------------------------------------------------------------------------
# One rule, one message, in every place that takes the value.

EPSILON_HOMES = {
    "op": lambda eps: jaxnorm.rms_norm(X, epsilon=eps),
    "fused op": lambda eps: jaxnorm.add_layer_norm(X, X, epsilon=eps),
    "nnx layer": lambda eps: jnn.LayerNorm(8, epsilon=eps, rngs=nnx.Rngs(0)),
    "linen module": lambda eps: jln.RMSNorm(epsilon=eps),
    "model config": lambda eps: TransformerConfig(epsilon=eps),
    "kernel API": lambda eps: _pallas.rms_norm_fwd(X[0], None, epsilon=eps, interpret=True),
}


@pytest.mark.parametrize("home", sorted(EPSILON_HOMES))
def test_epsilon_one_rule(home):
  make = EPSILON_HOMES[home]
  make(np.float32(1e-6))  # a NumPy scalar is a real number: accepted everywhere
  make(0)
  with pytest.raises(ValueError, match=re.escape("epsilon must be finite and >= 0, got -1e-06.")):
    make(-1e-6)
  for bad in ("1e-6", True, jnp.float32(1e-6)):
    with pytest.raises(TypeError, match=r"^epsilon must be a real number \(a Python or NumPy "
                                        r"scalar: static configuration, not an array\), got "):
      make(bad)


def test_epsilon_is_stored_as_a_python_float():
  cfg = TransformerConfig(epsilon=np.float32(1e-6))
  assert type(cfg.epsilon) is float and cfg.epsilon == float(np.float32(1e-6))
  assert type(jnn.RMSNorm(8, epsilon=np.float32(1e-6), rngs=nnx.Rngs(0)).epsilon) is float


def _one_of(name, choices, got):
  return "^" + re.escape(f"{name} must be one of {tuple(choices)}, got {got!r}.")


@pytest.mark.parametrize("home, name, choices, call", [
    ("op", "epsilon_placement", v.EPSILON_PLACEMENTS,
     lambda bad: jaxnorm.layer_norm(X, epsilon_placement=bad)),
    ("op", "casting", jaxnorm.CASTINGS, lambda bad: jaxnorm.rms_norm(X, casting=bad)),
    ("fused op", "impl", _backends.IMPLS, lambda bad: jaxnorm.add_rms_norm(X, X, impl=bad)),
    ("nnx layer", "impl", _backends.IMPLS, lambda bad: jnn.RMSNorm(8, impl=bad, rngs=nnx.Rngs(0))),
    ("linen module", "epsilon_placement", v.EPSILON_PLACEMENTS,
     lambda bad: jln.LayerNorm(epsilon_placement=bad)),
    ("model config", "norm_type", layer_replacements(),
     lambda bad: TransformerConfig(norm_type=bad)),
    ("model config", "casting", jaxnorm.CASTINGS, lambda bad: TransformerConfig(casting=bad)),
    ("kernel API", "epsilon_placement", v.EPSILON_PLACEMENTS,
     lambda bad: _pallas.rms_norm_fwd(X[0], None, epsilon=1e-6, epsilon_placement=bad)),
])
def test_choice_one_rule(home, name, choices, call):
  """An unknown option is a ValueError naming the argument, the value and the allowed set,
  whatever the value's type (a misspelt string, a number, None)."""
  for bad in ("middle", 1, None):
    with pytest.raises(ValueError, match=_one_of(name, choices, bad)):
      call(bad)


AXES_HOMES = {
    "op axis": ("axis", lambda axes: jaxnorm.layer_norm(X, axis=axes)),
    "nnx reduction_axes": ("reduction_axes", lambda axes: jnn.LayerNorm(
        8, reduction_axes=axes, feature_axes=-1, rngs=nnx.Rngs(0))(X)),
    "nnx feature_axes": ("feature_axes", lambda axes: jnn.RMSNorm(
        24, reduction_axes=(1, 2), feature_axes=axes, rngs=nnx.Rngs(0))(X)),
    "linen reduction_axes": ("reduction_axes", lambda axes: jln.RMSNorm(
        reduction_axes=axes).init(jax.random.key(0), X)),
    "linen feature_axes": ("feature_axes", lambda axes: jln.LayerNorm(
        reduction_axes=-1, feature_axes=axes).init(jax.random.key(0), X)),
}


@pytest.mark.parametrize("home", sorted(AXES_HOMES))
def test_repeated_axis_one_rule(home):
  """A repeated axis is an error naming the axis, in the ops and the layers alike (never merged
  into one, which would silently normalize over fewer axes than the caller wrote)."""
  name, call = AXES_HOMES[home]
  for axes, axis, first, second in [((-1, -1), 2, -1, -1), ((2, -1), 2, 2, -1),
                                    ((1, 2, -2), 1, 1, -2)]:
    msg = f"{name}={axes!r} repeats axis {axis} (as {first} and {second}); name each axis once."
    with pytest.raises(ValueError, match="^" + re.escape(msg)):
      call(axes)
  with pytest.raises(ValueError, match=re.escape(f"{name}=3: axis 3 is out of range for an "
                                                 f"input of rank 3; use axes in [-3, 2].")):
    call(3)
  with pytest.raises(TypeError, match=re.escape(f"{name} must be an int or a non-empty tuple of "
                                                f"ints, got 'last'.")):
    call("last")


def test_kernel_support_one_rule(x64):
  """What the Pallas kernels take is said once, in their backend
  (``backends/triton/config.kernel_problem``), by every caller."""
  want = "the Pallas kernels take float32, bfloat16 or float16 {}, got float64"
  problem = _pallas_config.kernel_problem
  assert problem(dtypes=(("x", jnp.bfloat16), ("residual", jnp.float16))) is None
  assert problem(dtypes=(("x", jnp.float64),)) == want.format("x")
  assert _pallas_config.supported((8, 128), jnp.float64) == (False, want.format("x"))
  assert not hasattr(v, "kernel_problem") and not hasattr(v, "KERNEL_DTYPES")  # not the floor's
  gpu = problem(backend="cpu")
  assert gpu.startswith("the Pallas kernels need a GPU (Triton backend) and the backend is 'cpu'")
  assert _pallas_config.supported((8, 128), jnp.float32, backend="cpu") == (False, gpu)
  x32, x64 = jnp.ones((4, 8), jnp.float32), jnp.ones((4, 8), jnp.float64)
  with pytest.raises(ValueError, match=re.escape(want.format("x"))):
    _pallas.layer_norm_fwd(x64, None, None, epsilon=1e-6, interpret=True)
  with pytest.raises(ValueError, match="^" + re.escape(want.format("h_dtype") + ".")):
    _pallas.add_rms_norm_fwd(x32, x32, None, epsilon=1e-6, h_dtype=jnp.float64, interpret=True)
  with pytest.raises(ValueError, match=re.escape(want.format("x"))):
    jaxnorm.rms_norm(x64, impl="pallas", pallas=jaxnorm.PallasConfig(interpret=True))
  # The fused op names the residual (the "take float32, bfloat16 or float16" rule of the kernels).
  with pytest.raises(ValueError, match=re.escape(want.format("residual") + ".")):
    jaxnorm.add_rms_norm(x32, x64, impl="pallas", pallas=jaxnorm.PallasConfig(interpret=True))
  # Without interpret mode on this CPU, the op gives the backend rule's own reason.
  with pytest.raises(ValueError, match=re.escape(gpu)):
    jaxnorm.rms_norm(x32, impl="pallas")


@pytest.mark.parametrize("home", ["fused op", "nnx layer (trailing axes)",
                                  "nnx layer (moved axes)", "linen module"])
def test_residual_shape_one_rule(home):
  x, r = X, jnp.ones((1, 3, 8), jnp.float32)
  call = {
      "fused op": lambda: jaxnorm.add_layer_norm(x, r),
      "nnx layer (trailing axes)": lambda: jnn.LayerNorm(8, rngs=nnx.Rngs(0))(x, residual=r),
      "nnx layer (moved axes)": lambda: jnn.RMSNorm(
          3, reduction_axes=1, feature_axes=1, rngs=nnx.Rngs(0))(x, residual=r),
      "linen module": lambda: jln.RMSNorm(reduction_axes=(0, 1), feature_axes=-1).init(
          jax.random.key(0), x, residual=r),
  }[home]
  msg = ("residual must have the shape of x (2, 3, 8) (h = x + residual is not broadcast), got "
         "shape (1, 3, 8).")
  with pytest.raises(ValueError, match="^" + re.escape(msg)):
    call()
