"""jaxnorm.nnx.LayerNorm / RMSNorm against Flax NNX's modules.

Parity is checked on outputs, on the input and parameter cotangents (random upstream
gradients, never ``.sum()``), on the output and cotangent dtypes and on the state trees, over
a product grid of input dtype, parameter dtype, mask, reduction/feature axes and
``use_bias``/``use_scale``. The remaining tests cover the deliberate differences
(``use_fast_variance``, the feature-size error), the extra options, parameter metadata, the
NNX transforms, ``axis_name`` under ``shard_map`` and that the custom VJP is really used.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import nnx as jnn

from _compat import SHARDING_METADATA
from _module_cases import GRID, SHAPE, assert_matches_flax, assert_same_params, grid_id, partial_mask, randomize

PAIRS = {"LayerNorm": (jnn.LayerNorm, nnx.LayerNorm), "RMSNorm": (jnn.RMSNorm, nnx.RMSNorm)}


def _canon(axes, ndim):
  axes = (axes,) if isinstance(axes, int) else axes
  return sorted(a % ndim for a in axes)


def _num_features(feature_axes, shape=SHAPE):
  return int(np.prod([shape[a] for a in _canon(feature_axes, len(shape))]))


def _out_and_grads(graphdef, state, x, mask, dy_seed=2):
  """Runs the module functionally; returns y and the cotangents of (state, x) for a random dy."""
  def f(state, x):
    return nnx.merge(graphdef, state)(x, mask=mask)
  y, vjp = jax.vjp(f, state, x)
  dy = jax.random.normal(jax.random.key(dy_seed), y.shape, jnp.float32).astype(y.dtype)
  dstate, dx = vjp(dy)
  return y, dstate, dx


def _compare_with_flax(name, x, mask, **kwargs):
  ours_cls, flax_cls = PAIRS[name]
  nf = _num_features(kwargs.get("feature_axes", -1), x.shape)
  ours = ours_cls(nf, rngs=nnx.Rngs(0), **kwargs)
  theirs = flax_cls(nf, rngs=nnx.Rngs(0), **kwargs)
  g_ours, s_ours = nnx.split(ours)
  g_theirs, s_theirs = nnx.split(theirs)
  assert_same_params(s_ours, s_theirs)
  state = randomize(s_ours)
  y1, ds1, dx1 = _out_and_grads(g_ours, state, x, mask)
  assert_matches_flax(x, (y1, ds1, dx1), _out_and_grads(g_theirs, state, x, mask))
  return y1


@pytest.mark.parametrize("name,dtype,param_dtype,masked,axes,use_scale,use_bias", GRID,
                         ids=[grid_id(c) for c in GRID])
def test_parity_with_flax(name, dtype, param_dtype, masked, axes, use_scale, use_bias):
  red, feat = axes
  x = jax.random.normal(jax.random.key(3), SHAPE, jnp.float32)
  x = (0.5 + 2.0 * x).astype(dtype)
  mask = partial_mask() if masked else None
  kwargs = dict(param_dtype=jnp.dtype(param_dtype), use_scale=use_scale,
                reduction_axes=red, feature_axes=feat)
  if name == "LayerNorm":
    kwargs["use_bias"] = use_bias
  _compare_with_flax(name, x, mask, **kwargs)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("x_dtype,dtype", [
    ("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float16"),
    ("bfloat16", "bfloat16"),
])
def test_dtype_argument_matches_flax(name, x_dtype, dtype):
  x = jax.random.normal(jax.random.key(4), SHAPE, jnp.float32).astype(x_dtype)
  y = _compare_with_flax(name, x, None, dtype=jnp.dtype(dtype))
  assert y.dtype == jnp.dtype(dtype)


# Masks of lower rank or with size-1 axes, each keeping at least 2 elements per reduced group.
BROADCAST_MASKS = [
    (np.array([[True], [False], [True]]), 1),                          # (3, 1), reduce axis 1
    (np.array([True, False, True, True]), (1, 2)),                      # (4,), reduce axes 1-2
    (np.array([[[True, False, True, True]], [[False, True, True, False]]]), -1),  # (2, 1, 4)
]


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("mask,red", BROADCAST_MASKS, ids=["3x1-mid", "4-last2", "2x1x4-last"])
def test_broadcast_mask_matches_flax(name, mask, red):
  x = jax.random.normal(jax.random.key(5), SHAPE, jnp.float32)
  _compare_with_flax(name, x, jnp.asarray(mask), reduction_axes=red, feature_axes=red)


# (ours, Flax's): the documented differences of defaults (docs/modules.md).
DIFFERENT_DEFAULTS = {("LayerNorm", "use_fast_variance"): (False, True)}


def test_constructor_and_call_signatures_match_flax():
  for name, (ours, theirs) in PAIRS.items():
    a = list(inspect.signature(ours.__init__).parameters.values())
    b = list(inspect.signature(theirs.__init__).parameters.values())
    assert [(p.name, p.kind) for p in a[:len(b)]] == [(p.name, p.kind) for p in b], name
    for p, q in zip(a, b):
      if (name, p.name) in DIFFERENT_DEFAULTS:
        assert (p.default, q.default) == DIFFERENT_DEFAULTS[name, p.name]
      elif not callable(q.default):
        assert p.default == q.default, (name, p.name)
    extra = [(p.name, p.default, p.kind) for p in a[len(b):]]
    assert extra == [("epsilon_placement", "inside", p.KEYWORD_ONLY),
                     ("zero_centered_scale", False, p.KEYWORD_ONLY),
                     ("impl", "auto", p.KEYWORD_ONLY),
                     ("backend_config", None, p.KEYWORD_ONLY),
                     ("casting", "float32", p.KEYWORD_ONLY),
                     ("memory_efficient", False, p.KEYWORD_ONLY)]
  # Both siblings are called the same way.
  assert inspect.signature(jnn.LayerNorm.__call__) == inspect.signature(jnn.RMSNorm.__call__)


def test_fast_variance_only_differs_in_the_unstable_regime():
  rng = np.random.default_rng(0)
  base = rng.standard_normal((8, 64))
  ours = jnn.LayerNorm(64, rngs=nnx.Rngs(0))  # jaxnorm's default: use_fast_variance=False
  ours_fast = jnn.LayerNorm(64, use_fast_variance=True, rngs=nnx.Rngs(0))
  flax_fast = nnx.LayerNorm(64, rngs=nnx.Rngs(0))  # Flax's default: fast variance
  flax_slow = nnx.LayerNorm(64, use_fast_variance=False, rngs=nnx.Rngs(0))
  # Moderate mean/std (3 and 30): tight agreement with the two-pass Flax, close to the fast one;
  # the flag gives Flax's fast form.
  for ratio in (3.0, 30.0):
    x = jnp.asarray(ratio + base, jnp.float32)
    np.testing.assert_allclose(ours(x), flax_slow(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours(x), flax_fast(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours_fast(x), flax_fast(x), rtol=1e-6, atol=1e-6)
  # mean/std = 1e4 in float32: the fast variance cancels catastrophically (Flax's default and
  # jaxnorm's with the flag alike), jaxnorm's default does not.
  x64 = 1e4 + base
  x = jnp.asarray(x64, jnp.float32)
  xs = np.asarray(x, np.float64)  # the float32 input, exactly, in float64
  ref = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-6)
  err_ours = np.max(np.abs(np.asarray(ours(x), np.float64) - ref))
  err_fast = np.max(np.abs(np.asarray(flax_fast(x), np.float64) - ref))
  err_ours_fast = np.max(np.abs(np.asarray(ours_fast(x), np.float64) - ref))
  assert err_ours < 1e-3, err_ours
  assert err_ours < err_fast / 10, (err_ours, err_fast)
  assert err_ours < err_ours_fast / 10, (err_ours, err_ours_fast)


def test_rms_norm_fast_variance_flag_has_no_effect_in_either():
  x = jax.random.normal(jax.random.key(6), (4, 8)) + 2.0
  for fast in (True, False):
    ours = jnn.RMSNorm(8, use_fast_variance=fast, rngs=nnx.Rngs(0))
    theirs = nnx.RMSNorm(8, use_fast_variance=fast, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_feature_size_mismatch_names_both_sizes(name):
  cls = PAIRS[name][0]
  with pytest.raises(ValueError, match=r"num_features=5.*6 features"):
    cls(5, rngs=nnx.Rngs(0))(jnp.ones((2, 6)))
  with pytest.raises(ValueError, match=r"num_features=6.*12 features"):
    cls(6, reduction_axes=(1, 2), feature_axes=(1, 2), rngs=nnx.Rngs(0))(jnp.ones((2, 3, 4)))


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_bad_arguments_raise_clear_errors(name):
  cls = PAIRS[name][0]
  with pytest.raises(TypeError, match="num_features"):
    cls(4.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="num_features"):
    cls(0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="epsilon_placement"):
    cls(4, epsilon_placement="middle", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="impl"):
    cls(4, impl="cuda", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="epsilon"):
    cls(4, epsilon=-1.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"reduction_axes=3"):
    cls(4, reduction_axes=3, rngs=nnx.Rngs(0))(jnp.ones((2, 4)))
  with pytest.raises(ValueError, match=r"feature_axes=\(0, 2\)"):
    cls(4, feature_axes=(0, 2), rngs=nnx.Rngs(0))(jnp.ones((2, 4)))
  with pytest.raises(TypeError, match="mask"):
    cls(4, rngs=nnx.Rngs(0))(jnp.ones((2, 4)), mask=jnp.ones((2, 4)))
  with pytest.raises(TypeError, match="x"):
    cls(4, rngs=nnx.Rngs(0))(jnp.ones((2, 4), jnp.complex64))


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("placement,zero_centered", [("outside", False), ("inside", True),
                                                     ("outside", True)])
@pytest.mark.parametrize("axes", [(-1, -1), (1, 1), ((1, 2), -1)])
def test_extra_options_match_reference(name, placement, zero_centered, axes):
  red, feat = axes
  x = jax.random.normal(jax.random.key(7), SHAPE)
  cls = PAIRS[name][0]
  layer = cls(_num_features(feat), epsilon=1e-2, epsilon_placement=placement,
              zero_centered_scale=zero_centered, reduction_axes=red, feature_axes=feat,
              rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  state = randomize(state)
  layer = nnx.merge(graphdef, state)
  # Reference: move the reduction axes to the end, normalize without parameters, then apply
  # the broadcast (1 + scale) and bias by hand.
  r = _canon(red, 3)
  perm = [a for a in range(3) if a not in r] + r
  xt = jnp.transpose(x, perm)
  op = jaxnorm.reference.layer_norm if name == "LayerNorm" else jaxnorm.reference.rms_norm
  yt = op(xt, epsilon=1e-2, axis=tuple(range(3 - len(r), 3)), epsilon_placement=placement)
  y = jnp.transpose(yt, np.argsort(perm))
  bshape = [SHAPE[a] if a in _canon(feat, 3) else 1 for a in range(3)]
  s = layer.scale[...].reshape(bshape)
  y = y * ((1.0 + s) if zero_centered else s)
  if name == "LayerNorm":
    y = y + layer.bias[...].reshape(bshape)
  np.testing.assert_allclose(layer(x), y, rtol=1e-5, atol=1e-5)
  # The default reproduces Flax: epsilon inside the root and a plain scale.
  default = cls(_num_features(feat), epsilon=1e-2, reduction_axes=red, feature_axes=feat,
                rngs=nnx.Rngs(0))
  flax_layer = PAIRS[name][1](_num_features(feat), epsilon=1e-2, reduction_axes=red,
                              feature_axes=feat, rngs=nnx.Rngs(0))
  nnx.update(default, state)
  nnx.update(flax_layer, state)
  np.testing.assert_allclose(default(x), flax_layer(x), rtol=1e-5, atol=1e-5)


def test_parameter_metadata_passes_through():
  mesh = jax.make_mesh((len(jax.devices()),), ("model",))
  x = jnp.ones((4, 8))
  with jax.set_mesh(mesh):
    for name, (ours_cls, flax_cls) in PAIRS.items():
      kw = dict(scale_metadata={SHARDING_METADATA: ("model",)})
      if name == "LayerNorm":
        kw["bias_metadata"] = {SHARDING_METADATA: (None,)}
      ours = ours_cls(8, rngs=nnx.Rngs(0), **kw)
      theirs = flax_cls(8, rngs=nnx.Rngs(0), **kw)
      spec_ours = nnx.get_partition_spec(nnx.state(ours))
      assert spec_ours == nnx.get_partition_spec(nnx.state(theirs))
      assert spec_ours["scale"].get_value() == P("model")
      assert ours.scale.get_value().sharding.spec == P("model")
      np.testing.assert_allclose(ours(x), theirs(x), atol=1e-6)
    # An initializer wrapped with nnx.with_partitioning works as in Flax too.
    init = nnx.with_partitioning(nnx.initializers.ones_init(), ("model",))
    ours = jnn.LayerNorm(8, scale_init=init, rngs=nnx.Rngs(0))
    assert nnx.get_partition_spec(nnx.state(ours))["scale"].get_value() == P("model")


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("axes", [(-1, -1), (1, 1), ((1, 2), -1)])
def test_module_calls_the_custom_jvp_op(name, axes):
  red, feat = axes
  layer = PAIRS[name][0](_num_features(feat), reduction_axes=red, feature_axes=feat,
                         rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  jaxpr = str(jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, jnp.ones(SHAPE)))
  assert "custom_jvp_call" in jaxpr
  flax_layer = PAIRS[name][1](_num_features(feat), reduction_axes=red, feature_axes=feat,
                              rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(flax_layer)
  jaxpr = str(jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, jnp.ones(SHAPE)))
  assert "custom_jvp_call" not in jaxpr  # the check can fail


def _stack_pair(name, n=3, d=4):
  """n layers of ours and of Flax's with the same random parameters, stacked on axis 0."""
  ours_cls, flax_cls = PAIRS[name]

  @nnx.split_rngs(splits=n)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def create(rngs):
    return ours_cls(d, rngs=rngs)

  @nnx.split_rngs(splits=n)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def create_flax(rngs):
    return flax_cls(d, rngs=rngs)

  ours, theirs = create(nnx.Rngs(0)), create_flax(nnx.Rngs(0))
  state = randomize(nnx.state(ours))
  nnx.update(ours, state)
  nnx.update(theirs, state)
  return ours, theirs


def _scan_apply(stack, x):
  @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
  def body(layer, h):
    return jnp.tanh(layer(h))
  return body(stack, x)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_nnx_transforms(name):
  x = jax.random.normal(jax.random.key(8), (5, 4))
  dy = jax.random.normal(jax.random.key(9), (5, 4))
  ours_cls, flax_cls = PAIRS[name]

  def loss(layer, x):
    return jnp.sum(layer(x) * dy)  # a random cotangent, not a plain sum

  layer = ours_cls(4, rngs=nnx.Rngs(0))
  nnx.update(layer, randomize(nnx.state(layer)))
  flax_layer = flax_cls(4, rngs=nnx.Rngs(0))
  nnx.update(flax_layer, nnx.state(layer))
  # nnx.jit
  np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(layer, x), flax_layer(x), rtol=1e-5,
                             atol=1e-5)
  # nnx.grad (jitted) and nnx.remat give Flax's parameter gradients
  g = nnx.jit(nnx.grad(loss))(layer, x)
  g_flax = nnx.grad(loss)(flax_layer, x)

  def remat_loss(m, x):
    return jnp.sum(nnx.remat(lambda m, x: m(x))(m, x) * dy)

  g_remat = nnx.grad(remat_loss)(layer, x)
  for a, b, c in zip(jax.tree.leaves(g), jax.tree.leaves(g_flax), jax.tree.leaves(g_remat)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c, b, rtol=1e-5, atol=1e-5)
  # nnx.vmap-created stack, run with nnx.scan, and its gradient
  ours, theirs = _stack_pair(name)
  np.testing.assert_allclose(_scan_apply(ours, x), _scan_apply(theirs, x), rtol=1e-5,
                             atol=1e-5)

  def stack_loss(stack, x):
    return jnp.sum(_scan_apply(stack, x) * dy)

  ga = nnx.grad(stack_loss)(ours, x)
  gb = nnx.grad(stack_loss)(theirs, x)
  for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    assert a.shape[0] == 3
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  # nnx.vmap over a batch axis of the input (the layer broadcast)
  xb = jnp.stack([x, 2 * x + 1])
  yb = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(layer, xb)
  np.testing.assert_allclose(yb, jax.vmap(flax_layer)(xb), rtol=1e-5, atol=1e-5)


# A non-trailing split axis for LayerNorm (moved to the end inside shard_map), the last axis for
# RMSNorm: the module code is shared, so the two cases cover both paths at half the compile time.
@pytest.mark.parametrize("name,axis", [("LayerNorm", 1), ("RMSNorm", -1)])
def test_axis_name_under_shard_map_equals_unsharded(name, axis):
  n_dev = len(jax.devices())
  mesh = jax.make_mesh((n_dev,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
  # The normalized (and feature) axis, of size 2 * n_dev, is split over the devices.
  shape = (3, 2, 2 * n_dev) if axis == -1 else (3, 2 * n_dev, 2)
  x = jax.random.normal(jax.random.key(10), shape) + 1.0
  dy = jax.random.normal(jax.random.key(11), shape)
  # A mask whose count differs from device to device (some devices hold none of a row's
  # masked-in elements): the statistics must still be those of the whole masked row.
  mask = jnp.asarray(np.indices(shape).sum(0) % 3 != 0)
  cls = PAIRS[name][0]
  kw = dict(reduction_axes=axis, feature_axes=axis, rngs=nnx.Rngs(0))
  full = cls(2 * n_dev, **kw)
  nnx.update(full, randomize(nnx.state(full)))
  graphdef, _ = nnx.split(cls(2 * n_dev, axis_name="model", **kw))
  g_full, state = nnx.split(full)
  x_spec = P(None, None, "model") if axis == -1 else P(None, "model", None)
  state_spec = jax.tree.map(lambda _: P("model"), state)

  def local(state, x, mask):
    return nnx.merge(graphdef, state)(x, mask=mask)

  f = jax.shard_map(local, mesh=mesh, in_specs=(state_spec, x_spec, x_spec), out_specs=x_spec)
  # (The unmasked sharded case is covered in test_linen.py.)
  y, vjp = jax.vjp(lambda s, x: f(s, x, mask), state, x)
  ds, dx = vjp(dy)
  y_ref, vjp_ref = jax.vjp(lambda s, x: nnx.merge(g_full, s)(x, mask=mask), state, x)
  ds_ref, dx_ref = vjp_ref(dy)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, dx_ref, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(ds), jax.tree.leaves(ds_ref)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_impl_is_passed_to_the_op(name):
  cls = PAIRS[name][0]
  x = jax.random.normal(jax.random.key(12), (4, 8))
  # impl reaches the op: "xla" matches the op's XLA path and the default the op's "auto" (the
  # kernels on a GPU), bit for bit.
  module_xla, module_auto = cls(8, impl="xla", rngs=nnx.Rngs(0)), cls(8, rngs=nnx.Rngs(0))
  op = jaxnorm.layer_norm if name == "LayerNorm" else jaxnorm.rms_norm
  params = (module_xla.scale.get_value(),) + (
      (module_xla.bias.get_value(),) if name == "LayerNorm" else ())
  np.testing.assert_array_equal(module_xla(x), op(x, *params, epsilon=1e-6, impl="xla"))
  np.testing.assert_array_equal(module_auto(x), op(x, *params, epsilon=1e-6, impl="auto"))
  # The Pallas kernels take no mask: the op refuses, so the argument demonstrably reaches it.
  with pytest.raises(ValueError, match="impl='pallas'"):
    cls(8, impl="pallas", rngs=nnx.Rngs(0))(x, mask=x > 0)


@pytest.mark.parametrize("api", ["nnx", "linen"])
@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_backend_config_reaches_the_op(api, name):
  """``backend_config=`` on a norm layer is the op's: interpret mode makes ``impl="pallas"`` run
  the kernels on this CPU (one forward kernel in the program), equal to the op called the same
  way; a value that configures no backend is refused when the layer is built."""
  from flax import linen as nn
  from jaxnorm import linen as jln
  from _kernels import count_pallas_calls
  x = jax.random.normal(jax.random.key(3), (4, 8))
  cfg = jaxnorm.PallasConfig(interpret=True)
  op = jaxnorm.layer_norm if name == "LayerNorm" else jaxnorm.rms_norm
  if api == "nnx":
    layer = getattr(jnn, name)(8, impl="pallas", backend_config=cfg, rngs=nnx.Rngs(0))
    f = layer
    params = (layer.scale.get_value(),) + ((layer.bias.get_value(),) if name == "LayerNorm"
                                           else ())
  else:
    module = getattr(jln, name)(impl="pallas", backend_config=cfg)
    variables = module.init(jax.random.key(0), x)
    f = lambda x: module.apply(variables, x)  # noqa: E731
    params = tuple(variables["params"][k] for k in ("scale", "bias")
                   if k in variables["params"])
  assert count_pallas_calls(f, x) == 1
  np.testing.assert_array_equal(f(x), op(x, *params, impl="pallas", backend_config=cfg))
  with pytest.raises(TypeError, match=r"^backend_config must be a backend's config "
                                      r"\(PallasConfig, TpuConfig\)"):
    if api == "nnx":
      getattr(jnn, name)(8, backend_config="interpret", rngs=nnx.Rngs(0))
    else:
      getattr(jln, name)(backend_config="interpret").init(jax.random.key(0), x)
  assert issubclass(getattr(jln, name), nn.Module)
