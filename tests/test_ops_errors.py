"""Bad input raises a clear error naming the argument, what it got and what was expected."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm

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
    (jnp.float32(1e-6), TypeError, r"epsilon must be a Python float"),
    ("1e-6", TypeError, r"epsilon must be a Python float"),
    (True, TypeError, r"epsilon must be a Python float"),
])
def test_bad_epsilon(op, eps, exc, msg):
  with pytest.raises(exc, match=msg):
    op(X, epsilon=eps)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis,exc,msg", [
    (3, ValueError, r"axis 3 is out of range for an input of rank 3"),
    (-4, ValueError, r"axis -4 is out of range"),
    (0, ValueError, r"axis must name the trailing axes of x"),
    ((0, 2), ValueError, r"axis must name the trailing axes"),
    ((-1, -1), ValueError, r"repeated axis"),
    (1.0, TypeError, r"axis must be an int or a non-empty tuple of ints"),
    ((), TypeError, r"axis must be an int or a non-empty tuple"),
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
  with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'xla', 'pallas'\), got 'cuda'"):
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
