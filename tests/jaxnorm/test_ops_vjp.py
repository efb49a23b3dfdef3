"""The ops' derivative rules against float64 autodiff of :mod:`jaxnorm.reference`, through the
public kit (:func:`jaxnorm.testing.check_rule`), on each backend.

One battery, :class:`VjpBattery`, run on each backend (:mod:`_backends`): :class:`TestXla` and
:class:`TestPallas` (the kernels, in interpret mode off a GPU). Every check compares, element by
element within the kit's ulp budgets, each output and each cotangent in its own dtype.

* ``test_rule_matches_autodiff``: hypothesis draws the op, the shape (rank 1 to 4, one or two
  normalized trailing axes, normalized size 1 to 1024, smaller for interpret mode), the dtype,
  scale and bias (each present or not), epsilon and its placement, a zero-centred scale, the
  casting, a mask (``jt.masks``, where the backend takes one) and the input's rows (the kit's
  adversarial kinds: large means, constant, tiny and huge rows, around a drawn location, under
  every transformation). Each example checks the value, the VJP
  with a random cotangent, the JVP with random tangents and the adjoint identity under
  ``jax.jit``, and one drawn transformation of :data:`jaxnorm.testing.TRANSFORMS`.
* ``test_every_variant_and_dtype``: a fixed grid, op x dtype x epsilon placement x zero-centred
  scale, value and VJP under ``jax.jit`` (what it checked before the kit); each float32 entry
  adds one transformation (``_backends.GRID_TRANSFORMS``: every one once per battery and
  backend).
* ``test_eager_without_params_and_two_axes``: value and VJP without ``jax.jit`` (the kit's
  "eager", beside its jitted checks), over two normalized axes, without scale and bias, then
  with both and a zero-centred scale.
* ``test_output_dtype_argument``: ``dtype=float32`` on bfloat16 input.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import jaxnorm
from jaxnorm import reference
from jaxnorm import testing as jt
from _backends import FINITE_KINDS, PALLAS, XLA, Backend, grid_transforms

DTYPES = ["float32", "bfloat16", "float16", "float64"]
OPS = {
    "layer_norm": (jaxnorm.layer_norm, reference.layer_norm, True),
    "rms_norm": (jaxnorm.rms_norm, reference.rms_norm, False),
}
# The fixed cases check the value and the VJP, as they did before the kit (forward mode is in
# every hypothesis example, and tests/jaxnorm/test_forward_mode.py).
REV = ("rev",)


@st.composite
def cases(draw, backend: Backend):
  """One op, its configuration, its arguments and one transformation, as a dict for
  :func:`_check`."""
  op_name = draw(st.sampled_from(list(OPS)))
  rank = draw(st.integers(1, 4))
  n_norm = draw(st.integers(1, min(2, rank)))
  if n_norm == 1:
    sizes = [d for d in [1, 2, 3, 7, 16, 33, 100, 256, 1024] if d <= backend.max_d]
    norm_shape = [draw(st.sampled_from(sizes))]
  else:
    norm_shape = [draw(st.integers(1, int(backend.max_d ** 0.5))) for _ in range(n_norm)]
  shape = tuple([draw(st.integers(1, 4)) for _ in range(rank - n_norm)] + norm_shape)
  dtype = draw(st.sampled_from([d for d in DTYPES if d in backend.dtypes]))
  kw = dict(axis=tuple(range(-n_norm, 0)) if n_norm > 1 else -1,
            epsilon=draw(st.sampled_from([1e-6, 1e-5, 1e-3, 0.1])),
            epsilon_placement=draw(st.sampled_from(["inside", "outside"])),
            zero_centered_scale=draw(st.booleans()),
            casting=draw(st.sampled_from(jaxnorm.CASTINGS)))
  transform = draw(st.sampled_from(jt.TRANSFORMS))
  x = draw(jt.arrays(dtype, shape, loc=draw(st.sampled_from([0.0, 3.0])), scale=2.0,
                     kinds=FINITE_KINDS))
  params = dict(kinds=("normal",))
  return dict(
      op_name=op_name,
      x=x,
      scale=draw(st.none() | jt.arrays(dtype, norm_shape, loc=1.0, scale=0.5, **params)),
      bias=draw(st.none() | jt.arrays(dtype, norm_shape, **params)) if OPS[op_name][2] else None,
      # A backend without masks (the kernels) never draws one: test_ops_errors checks it raises.
      mask=draw(st.none() | jt.masks(shape)) if backend.masks else None,
      kw=kw,
      transforms=(transform,),
  )


def _check(backend: Backend, op_name, *, x, scale=None, bias=None, mask=None, kw=None,
           transforms=(), modes=jt.MODES, out_dtype=None):
  """``check_rule`` of the op on ``backend`` against the reference, and the output's dtype."""
  op, ref, has_bias = OPS[op_name]
  kw = dict(kw or {}, mask=mask)
  if out_dtype is not None:
    kw["dtype"] = out_dtype
  params = (scale, bias) if has_bias else (scale,)
  rule = functools.partial(op, **kw, **backend.kw)
  with jax.enable_x64(x.dtype == jnp.float64):
    y = jax.eval_shape(rule, x, *params)
  assert y.dtype == jnp.dtype(out_dtype or x.dtype) and y.shape == x.shape
  plain = functools.partial(ref, **{k: v for k, v in kw.items() if k != "dtype"})
  jt.check_rule(rule, plain, (x, *params), modes=modes, transforms=transforms,
                tolerance=_tolerance(kw, x))


def _tolerance(kw, x):
  """The kit's default budget; for the castings that round ``x_hat`` to the input's dtype on
  purpose ("llama", "t5"), that dtype is where the rule computes."""
  if kw.get("casting", "float32") != "float32":
    return jt.Tolerance(compute_dtype=x.dtype)
  return jt.Tolerance()


class VjpBattery:
  """The op battery, written once against ``self.backend``; one subclass per backend."""

  backend: Backend

  def test_rule_matches_autodiff(self):
    @self.backend.given(8, case=cases(self.backend))
    def example(case):
      _check(self.backend, **case)

  @pytest.mark.parametrize("op_name", list(OPS))
  @pytest.mark.parametrize("dtype", DTYPES)
  @pytest.mark.parametrize("placement", ["inside", "outside"])
  @pytest.mark.parametrize("zero_centered", [False, True])
  def test_every_variant_and_dtype(self, op_name, dtype, placement, zero_centered):
    """A fixed grid so that no variant/dtype combination depends on hypothesis' draws."""
    self.backend.skip_unless(dtype=dtype)
    rng = np.random.default_rng(7)
    x, scale, bias = (_normal(rng, shape, dtype, loc, s) for shape, loc, s in
                      (((3, 5, 48), 1.0, 2.0), ((48,), 1.0, 0.5), ((48,), 0.0, 1.0)))
    _check(self.backend, op_name, x=x, scale=scale, bias=bias, modes=REV,
           kw=dict(epsilon=1e-3, epsilon_placement=placement, zero_centered_scale=zero_centered),
           transforms=grid_transforms(op_name, dtype, placement, zero_centered))

  @pytest.mark.parametrize("op_name", list(OPS))
  @pytest.mark.parametrize("placement", ["inside", "outside"])
  def test_eager_without_params_and_two_axes(self, op_name, placement):
    """Op by op (the kit's "eager" transform), without scale/bias, over two normalized axes;
    then with both and a zero-centred scale."""
    rng = np.random.default_rng(3)
    x = _normal(rng, (2, 4, 6), "float32", 1.0, 2.0)
    kw = dict(axis=(-2, -1), epsilon=1e-3, epsilon_placement=placement)
    _check(self.backend, op_name, x=x, kw=kw, transforms=("eager",), modes=REV)
    _check(self.backend, op_name, x=x, scale=_normal(rng, (4, 6), "float32", 1.0, 0.5),
           bias=_normal(rng, (4, 6), "float32", 0.0, 1.0), kw=dict(kw, zero_centered_scale=True),
           transforms=("eager",), modes=REV)

  @pytest.mark.parametrize("op_name", list(OPS))
  def test_output_dtype_argument(self, op_name):
    """``dtype=float32`` on bfloat16 input: y in float32, each cotangent in its primal's dtype
    (the kit checks cotangent dtypes), values within float32's budget."""
    rng = np.random.default_rng(0)
    _check(self.backend, op_name, x=_normal(rng, (4, 16), "bfloat16", 0.0, 1.0),
           scale=jnp.ones(16, jnp.float32), out_dtype=jnp.float32, modes=REV)


def _normal(rng, shape, dtype, loc, scale):
  """``loc + scale * N(0, 1)`` drawn with NumPy, in ``dtype`` (float64 kept as float64)."""
  a = (loc + scale * rng.standard_normal(shape)).astype(jnp.dtype(dtype))
  if a.dtype == np.float64:
    with jax.enable_x64(True):
      return jnp.asarray(a)
  return jnp.asarray(a)


class TestXla(VjpBattery):
  backend = XLA


class TestPallas(VjpBattery):
  backend = PALLAS
