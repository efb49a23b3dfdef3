"""The custom VJPs against ``jax.vjp`` of the autodiff reference, with random cotangents.

One battery, :class:`VjpBattery`, run on each backend (:mod:`_backends`): :class:`TestXla` and
:class:`TestPallas` (the kernels, in interpret mode off a GPU). Shapes are drawn by hypothesis
(rank 1 to 4, one or two normalized trailing axes, normalized size 1 to 1024, smaller for
interpret mode); every dtype, variant, parameter combination and epsilon is covered, with and
without ``jax.jit``. Inputs are drawn with NumPy on the host (``host_random``): drawing them with
``jax.random`` compiled a sampler for every new shape, most of the battery's time.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import jaxnorm
from jaxnorm import reference
from _backends import PALLAS, XLA, Backend
from _numerics import assert_close, host_mask, host_random, natural_scales, random

DTYPES = ["float32", "bfloat16", "float16", "float64"]
OPS = {
    "layer_norm": (jaxnorm.layer_norm, reference.layer_norm, True),
    "rms_norm": (jaxnorm.rms_norm, reference.rms_norm, False),
}


@st.composite
def cases(draw, backend: Backend):
  rank = draw(st.integers(1, 4))
  n_norm = draw(st.integers(1, min(2, rank)))
  norm_shape = [draw(st.integers(1, int(backend.max_d ** 0.5))) for _ in range(n_norm)]
  if n_norm == 1:
    sizes = [d for d in [1, 2, 3, 7, 16, 33, 100, 256, 1024] if d <= backend.max_d]
    norm_shape = [draw(st.sampled_from(sizes))]
  lead = [draw(st.integers(1, 4)) for _ in range(rank - n_norm)]
  return dict(
      shape=tuple(lead + norm_shape),
      axis=tuple(range(-n_norm, 0)) if n_norm > 1 else -1,
      dtype=draw(st.sampled_from([d for d in DTYPES if d in backend.dtypes])),
      use_scale=draw(st.booleans()),
      use_bias=draw(st.booleans()),
      epsilon=draw(st.sampled_from([1e-6, 1e-5, 1e-3, 0.1])),
      epsilon_placement=draw(st.sampled_from(["inside", "outside"])),
      zero_centered_scale=draw(st.booleans()),
      loc=draw(st.sampled_from([0.0, 3.0])),
      seed=draw(st.integers(0, 2**16)),
  )


def _check(backend: Backend, op_name, case, use_jit, use_mask=False):
  op, ref, has_bias = OPS[op_name]
  dtype = jnp.dtype(case["dtype"])
  ctx = jax.enable_x64(True) if dtype == jnp.float64 else contextlib.nullcontext()
  with ctx:
    rng = np.random.default_rng(case["seed"])
    shape, axis = case["shape"], case["axis"]
    norm_shape = shape[len(shape) - (len(axis) if isinstance(axis, tuple) else 1):]
    x = host_random(rng, shape, dtype, loc=case["loc"], scale=2.0)
    scale = host_random(rng, norm_shape, dtype, loc=1.0, scale=0.5) if case["use_scale"] else None
    bias = host_random(rng, norm_shape, dtype) if case["use_bias"] and has_bias else None
    dy = host_random(rng, shape, dtype)
    mask = host_mask(rng, shape) if use_mask else None
    kw = dict(epsilon=case["epsilon"], axis=axis, mask=mask,
              epsilon_placement=case["epsilon_placement"],
              zero_centered_scale=case["zero_centered_scale"])
    args = (x, scale, bias) if has_bias else (x, scale)

    def mine(*a):
      return op(*a, **kw, **backend.kw)

    def theirs(*a):
      return ref(*a, **kw)

    def vjp(f, *a):
      y, pull = jax.vjp(f, *a)
      return y, pull(dy)

    def both(*a):  # One jit: one compilation per case instead of two.
      return vjp(mine, *a), vjp(theirs, *a)

    (y, grads), (y_ref, grads_ref) = (jax.jit(both) if use_jit else both)(*args)
    gam = None if scale is None else (1.0 + np.asarray(scale).astype(np.float32) if
                                      case["zero_centered_scale"] else scale)
    floors = natural_scales(x, gam, dy, d=int(np.prod(norm_shape)), epsilon=case["epsilon"],
                            epsilon_placement=case["epsilon_placement"], center=has_bias,
                            mask=mask)
    assert y.dtype == dtype
    assert_close(y, y_ref, dtype, floor=floors["y"], what="y")
    for name, g, g_ref, a in zip(["dx", "dscale", "dbias"], grads, grads_ref, args):
      if a is None:
        assert g is None
        continue
      assert g.dtype == a.dtype and g.shape == a.shape, name
      assert_close(g, g_ref, dtype, floor=floors[name], what=name)


class VjpBattery:
  """The op battery, written once against ``self.backend``; one subclass per backend."""

  backend: Backend

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_vjp_matches_autodiff(self, op_name):
    @self.backend.given(15, case=cases(self.backend))
    def example(case):
      _check(self.backend, op_name, case, use_jit=True)

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_masked_vjp_matches_autodiff(self, op_name):
    self.backend.skip_unless(mask=True)

    @self.backend.given(8, case=cases(self.backend))
    def example(case):
      _check(self.backend, op_name, case, use_jit=True, use_mask=True)

  @pytest.mark.parametrize("op_name", list(OPS))
  @pytest.mark.parametrize("dtype", DTYPES)
  @pytest.mark.parametrize("placement", ["inside", "outside"])
  @pytest.mark.parametrize("zero_centered", [False, True])
  def test_every_variant_and_dtype(self, op_name, dtype, placement, zero_centered):
    """A fixed grid so that no variant/dtype combination depends on hypothesis' draws."""
    self.backend.skip_unless(dtype=dtype)
    case = dict(shape=(3, 5, 48), axis=-1, dtype=dtype, use_scale=True, use_bias=True,
                epsilon=1e-3, epsilon_placement=placement, zero_centered_scale=zero_centered,
                loc=1.0, seed=7)
    _check(self.backend, op_name, case, use_jit=True)

  @pytest.mark.parametrize("op_name", list(OPS))
  @pytest.mark.parametrize("placement", ["inside", "outside"])
  def test_eager_without_params_and_two_axes(self, op_name, placement):
    """Without jit, without scale/bias, and over two normalized axes."""
    case = dict(shape=(2, 4, 6), axis=(-2, -1), dtype="float32", use_scale=False, use_bias=False,
                epsilon=1e-3, epsilon_placement=placement, zero_centered_scale=False, loc=1.0,
                seed=3)
    _check(self.backend, op_name, case, use_jit=False)
    _check(self.backend, op_name,
           dict(case, use_scale=True, use_bias=True, zero_centered_scale=True), False)

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_output_dtype_argument(self, op_name):
    op, ref, has_bias = OPS[op_name]
    op = functools.partial(op, **self.backend.kw)
    x = random(jax.random.key(0), (4, 16), jnp.bfloat16)
    scale = jnp.ones(16, jnp.float32)
    y = op(x, scale, dtype=jnp.float32)
    assert y.dtype == jnp.float32
    assert_close(y, ref(x, scale, dtype=jnp.float32), jnp.float32)
    dx, dscale = jax.vjp(lambda a, s: op(a, s, dtype=jnp.float32), x, scale)[1](
        random(jax.random.key(1), (4, 16), jnp.float32))
    assert dx.dtype == jnp.bfloat16 and dscale.dtype == jnp.float32
    np.testing.assert_equal(np.asarray(y.shape), np.asarray(x.shape))


class TestXla(VjpBattery):
  backend = XLA


class TestPallas(VjpBattery):
  backend = PALLAS
