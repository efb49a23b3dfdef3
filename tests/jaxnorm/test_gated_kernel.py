"""The gated RMSNorm Pallas kernels (:mod:`jaxnorm.backends.triton.gated`) against the float64 oracle.

First the hand-derived backward (``docs/derivations.md``, "Gated RMSNorm") is checked, in plain
``jax.numpy`` and float64, against ``jax.vjp`` of :func:`jaxnorm.reference.gated_rms_norm`; then
the kernels (interpret mode off a GPU) are compared with the same oracle: ``y``, ``rstd``,
``dx``, ``dz`` and ``dscale``, both gate orders, one group and several (widths that are and are
not powers of two), rows that are not a multiple of the row block, more row tiles than backward
programs, a group wider than one column block, float32, bfloat16 and a mixed x/z dtype, with
and without a scale; and :func:`gated_refusal`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import reference
from jaxnorm.backends.triton.config import GPU_BACKENDS, default_block_config
from jaxnorm.backends.triton.gated import gated_backward, gated_forward, gated_refusal

from _numerics import assert_close

INTERPRET = jax.default_backend() not in GPU_BACKENDS
EPS = 1e-6
# Norm-wise relative tolerances: float32 arithmetic throughout, so only the outputs' rounding.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def _inputs(rows, d, x_dtype, z_dtype, has_scale, seed=0):
  kx, kz, ks, kd = jax.random.split(jax.random.key(seed), 4)
  x = (0.5 + 2.0 * jax.random.normal(kx, (rows, d), jnp.float32)).astype(x_dtype)
  z = (3.0 * jax.random.normal(kz, (rows, d), jnp.float32)).astype(z_dtype)  # both silu tails
  scale = (1.0 + 0.5 * jax.random.normal(ks, (d,), jnp.float32)) if has_scale else None
  dy = jax.random.normal(kd, (rows, d), jnp.float32).astype(x_dtype)
  return x, z, scale, dy


def _oracle(x, z, scale, dy, group_size, norm_before_gate):
  """``(y, rstd, dx, dz, dscale)`` of the float64 oracle (``jax.vjp``) at the given inputs."""
  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(a, np.float64)) for a in (x, z) + ((scale,) if scale is not None
                                                                      else ())]

    def f(x, z, *s):
      return reference.gated_rms_norm(x, z, s[0] if s else None, epsilon=EPS,
                                      group_size=group_size, norm_before_gate=norm_before_gate)

    y, vjp = jax.vjp(f, *args)
    grads = vjp(jnp.asarray(np.asarray(dy, np.float64)))
    xf, zf = args[0], args[1]
    u = xf if norm_before_gate else xf * zf * jax.nn.sigmoid(zf)
    k = xf.shape[1] if group_size is None else group_size
    ug = u.reshape(u.shape[0], -1, k)
    rstd = 1.0 / jnp.sqrt(jnp.mean(ug * ug, axis=-1) + EPS)
    out = (y, rstd, grads[0], grads[1], grads[2] if scale is not None else None)
    return tuple(None if a is None else np.asarray(a) for a in out)


def _derived(x, z, scale, dy, group_size, norm_before_gate):
  """``(y, dx, dz, dscale)`` by the derived formulas, in ``jax.numpy`` (float64 under x64)."""
  rows, d = x.shape
  k = d if group_size is None else group_size
  s = 1.0 / (1.0 + jnp.exp(-z))
  g, dsilu = z * s, s * (1.0 + z * (1.0 - s))
  gam = jnp.ones((d,), x.dtype) if scale is None else scale
  u = x if norm_before_gate else x * g
  grouped = lambda a: a.reshape(rows, d // k, k)  # noqa: E731
  r = 1.0 / jnp.sqrt(jnp.mean(grouped(u * u), axis=-1, keepdims=True) + EPS)
  uh = (grouped(u) * r).reshape(rows, d)
  a = dy * g * gam[None, :] if norm_before_gate else dy * gam[None, :]
  mean_au = jnp.mean(grouped(a * uh), axis=-1, keepdims=True)
  du = (r * (grouped(a) - grouped(uh) * mean_au)).reshape(rows, d)
  if norm_before_gate:
    y = gam[None, :] * uh * g
    dx, dz, dscale = du, dy * gam[None, :] * uh * dsilu, jnp.sum(dy * g * uh, axis=0)
  else:
    y = gam[None, :] * uh
    dx, dz, dscale = du * g, du * x * dsilu, jnp.sum(dy * uh, axis=0)
  return y, dx, dz, (dscale if scale is not None else None)


@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("group_size", [None, 16])
@pytest.mark.parametrize("has_scale", [True, False])
def test_derivation_matches_autodiff(x64, norm_before_gate, group_size, has_scale):
  x, z, scale, dy = _inputs(7, 48, jnp.float32, jnp.float32, has_scale, seed=1)
  x, z, dy = (a.astype(jnp.float64) for a in (x, z, dy))
  scale = None if scale is None else scale.astype(jnp.float64)
  want = _oracle(x, z, scale, dy, group_size, norm_before_gate)
  got = _derived(x, z, scale, dy, group_size, norm_before_gate)
  for name, g, w in zip(("y", "dx", "dz", "dscale"), got, (want[0],) + want[2:]):
    if w is None:
      assert g is None
      continue
    assert_close(np.asarray(g), w, jnp.float64, tol=1e-12, what=name)


def _block(rows, group, dtype, **changes):
  return dataclasses.replace(default_block_config(rows, group, dtype), **changes)


# (rows, d, group_size, norm_before_gate, x dtype, z dtype, scale, block changes)
CASES = [
    (13, 64, 16, True, jnp.float32, jnp.float32, True, {}),
    (13, 64, 16, False, jnp.float32, jnp.float32, True, {}),
    (10, 96, 32, False, jnp.float32, jnp.float32, True, {}),
    (9, 128, 128, True, jnp.float32, jnp.float32, False, {}),
    (10, 96, None, True, jnp.bfloat16, jnp.bfloat16, True, {}),
    (9, 128, None, False, jnp.bfloat16, jnp.bfloat16, False, {}),
    (11, 64, 16, False, jnp.bfloat16, jnp.float32, True, {}),  # z in another dtype than x
    # A group that is no power of two (masked columns inside a tile), 3 groups.
    (9, 72, 24, True, jnp.float32, jnp.float32, True, {}),
    # 7 row tiles of 2 rows (the last one half empty) over 3 backward programs, and groups of
    # 40 columns in 3 column blocks of 16 (the column loop; the last block partly masked).
    (13, 80, 40, False, jnp.float32, jnp.float32, True,
     dict(block_rows=2, bwd_programs=3, block_d=16)),
    (13, 80, None, True, jnp.float32, jnp.float16, True,
     dict(block_rows=2, bwd_programs=3, block_d=32)),
]


@pytest.mark.parametrize("rows,d,group_size,norm_before_gate,x_dtype,z_dtype,has_scale,blk",
                         CASES)
def test_kernels_match_oracle(rows, d, group_size, norm_before_gate, x_dtype, z_dtype, has_scale,
                              blk):
  x, z, scale, dy = _inputs(rows, d, x_dtype, z_dtype, has_scale)
  block = _block(rows, group_size or d, x_dtype, **blk) if blk else None
  kw = dict(group_size=group_size, epsilon=EPS, norm_before_gate=norm_before_gate,
            interpret=INTERPRET, block=block)
  y, rstd = gated_forward(x, z, scale, out_dtype=x_dtype, **kw)
  dx, dz, dscale = gated_backward(x, z, scale, rstd, dy, **kw)
  assert y.dtype == x_dtype and dx.dtype == x_dtype and dz.dtype == z_dtype
  assert rstd.dtype == jnp.float32 and rstd.shape == (rows, d // (group_size or d))
  want = _oracle(x, z, scale, dy, group_size, norm_before_gate)
  tol = max(TOL[x_dtype], TOL[z_dtype])
  assert_close(y, want[0], tol=tol, what="y")
  assert_close(rstd, want[1], tol=1e-5, what="rstd")  # float32 from the inputs as stored
  assert_close(dx, want[2], tol=tol, what="dx")
  assert_close(dz, want[3], tol=tol, what="dz")
  if has_scale:
    assert dscale.dtype == jnp.float32 and dscale.shape == (d,)
    # Summed in float32 from the stored inputs: the float32 tolerance (a little more with
    # rounded dy and the low-precision products it multiplies).
    assert_close(dscale, want[4], tol=1e-5 if tol == TOL[jnp.float32] else 3e-3, what="dscale")
    again = gated_backward(x, z, scale, rstd, dy, **kw)[2]
    np.testing.assert_array_equal(np.asarray(again), np.asarray(dscale))  # deterministic
  else:
    assert dscale is None


def test_out_dtype_and_no_rows():
  x, z, scale, _ = _inputs(5, 32, jnp.bfloat16, jnp.bfloat16, True)
  kw = dict(group_size=None, epsilon=EPS, norm_before_gate=True, interpret=INTERPRET)
  y, _ = gated_forward(x, z, scale, out_dtype=jnp.float32, **kw)
  assert y.dtype == jnp.float32
  assert_close(y, _oracle(x, z, scale, x, None, True)[0], tol=1e-5, what="float32 y")
  empty = jnp.zeros((0, 32), jnp.bfloat16)
  y0, r0 = gated_forward(empty, empty, scale, out_dtype=jnp.bfloat16, **kw)
  assert y0.shape == (0, 32) and r0.shape == (0, 1)
  dx0, dz0, ds0 = gated_backward(empty, empty, scale, r0, empty, **kw)
  assert dx0.shape == dz0.shape == (0, 32) and np.all(np.asarray(ds0) == 0)


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_saturated_gate(norm_before_gate):
  """Gates far in both tails (exp(-z) overflows float32 below about -88): finite, and the
  oracle's values; with the gate first, a group whose gate is all zero (u = 0, r = eps^-1/2)."""
  x, z, scale, dy = _inputs(6, 32, jnp.float32, jnp.float32, True, seed=2)
  z = z.at[0].set(-100.0).at[1, :16].set(100.0).at[2, ::2].set(-1e4).at[3, 1::3].set(95.0)
  kw = dict(group_size=16, epsilon=EPS, norm_before_gate=norm_before_gate, interpret=INTERPRET)
  y, rstd = gated_forward(x, z, scale, out_dtype=jnp.float32, **kw)
  dx, dz, dscale = gated_backward(x, z, scale, rstd, dy, **kw)
  want = _oracle(x, z, scale, dy, 16, norm_before_gate)
  for name, got, w in zip(("y", "rstd", "dx", "dz", "dscale"), (y, rstd, dx, dz, dscale), want):
    assert np.all(np.isfinite(np.asarray(got))), name
    assert_close(got, w, tol=1e-5, what=name)


def test_refusal():
  assert gated_refusal(64, None, jnp.float32) is None
  assert gated_refusal(64, 16, jnp.bfloat16) is None
  assert gated_refusal(96, 96, jnp.float16) is None
  assert gated_refusal(96, 24, "float32") is None
  assert "divide" in gated_refusal(64, 24, jnp.float32)
  assert gated_refusal(64, 0, jnp.float32) is not None
  assert gated_refusal(64, -16, jnp.float32) is not None
  assert gated_refusal(64, 128, jnp.float32) is not None
  assert gated_refusal(0, None, jnp.float32) is not None
  assert "float64" in gated_refusal(64, 16, np.float64)
  assert gated_refusal(64, 16, jnp.int32) is not None
  x = jnp.ones((4, 64), jnp.float32)
  with pytest.raises(ValueError, match="divide"):
    gated_forward(x, x, None, group_size=24, epsilon=EPS, norm_before_gate=True,
                  out_dtype=jnp.float32, interpret=INTERPRET)
