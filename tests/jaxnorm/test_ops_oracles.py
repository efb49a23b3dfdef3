"""Two more oracles: finite differences (``check_grads``, to second order, float64) and the
explicit Jacobians (VJP == dy @ J, and J == ``jax.jacrev`` of the reference)."""

import jax
import jax.numpy as jnp
import pytest
from jax.test_util import check_grads

import jaxnorm
from jaxnorm import reference
from _numerics import assert_close, random

VARIANTS = [
    dict(),
    dict(epsilon_placement="outside"),
    dict(zero_centered_scale=True),
    dict(epsilon=0.3, epsilon_placement="outside", zero_centered_scale=True),
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_check_grads_second_order_float64(x64, kw, masked):
  ks = jax.random.split(jax.random.key(1), 4)
  x = random(ks[0], (3, 6), jnp.float64, loc=0.5)
  scale = random(ks[1], (6,), jnp.float64, loc=1.0, scale=0.3)
  bias = random(ks[2], (6,), jnp.float64)
  mask = jnp.array([[1, 1, 0, 1, 0, 1]] * 3, bool) if masked else None
  kw = dict(kw, mask=mask, epsilon=kw.get("epsilon", 1e-3))
  check_grads(lambda x, s, b: jaxnorm.layer_norm(x, s, b, **kw), (x, scale, bias), order=2,
              modes=["rev"], atol=1e-6, rtol=1e-6)
  check_grads(lambda x, s: jaxnorm.rms_norm(x, s, **kw), (x, scale), order=2, modes=["rev"],
              atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("op,jac,ref", [
    (jaxnorm.layer_norm, jaxnorm.layer_norm_jacobian, reference.layer_norm),
    (jaxnorm.rms_norm, jaxnorm.rms_norm_jacobian, reference.rms_norm),
], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_explicit_jacobian(x64, op, jac, ref, kw, masked):
  ks = jax.random.split(jax.random.key(2), 4)
  d = 9
  x = random(ks[0], (2, 3, d), jnp.float64, loc=2.0, scale=1.5)
  scale = random(ks[1], (d,), jnp.float64, loc=1.0, scale=0.3)
  dy = random(ks[2], x.shape, jnp.float64)
  mask = jax.random.bernoulli(ks[3], 0.6, x.shape).at[..., 0].set(True) if masked else None
  kw = dict(kw, mask=mask)
  J = jac(x, scale, **kw)  # (2, 3, d, d)
  assert J.shape == (2, 3, d, d)
  # J equals jax.jacrev of the autodiff reference, row by row.
  rowref = lambda r, m: ref(r, scale, **dict(kw, mask=m))
  if masked:
    J_ref = jax.vmap(jax.vmap(jax.jacrev(rowref)))(x, mask)
  else:
    J_ref = jax.vmap(jax.vmap(jax.jacrev(lambda r: rowref(r, None))))(x)
  assert_close(J, J_ref, jnp.float64, what="J")
  # The custom VJP equals dy @ J.
  (dx,) = jax.vjp(lambda a: op(a, scale, **kw), x)[1](dy)
  assert_close(dx, jnp.einsum("...i,...ij->...j", dy, J), jnp.float64, what="dx")


def test_jacobian_float32_matches_float64(x64):
  x = random(jax.random.key(3), (4, 16), jnp.float64, loc=1.0)
  J64 = jaxnorm.layer_norm_jacobian(x)
  J32 = jaxnorm.layer_norm_jacobian(x.astype(jnp.float32))
  assert J32.dtype == jnp.float32
  assert_close(J32, J64.astype(jnp.float32), jnp.float32, what="J32")
