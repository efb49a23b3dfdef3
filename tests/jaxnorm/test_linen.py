"""jaxnorm.linen.LayerNorm / RMSNorm against Flax Linen's modules.

Parity on outputs, on the input and parameter cotangents (random upstream gradients), on
dtypes and on the ``params`` tree, over a grid of input dtype, parameter dtype, mask,
reduction/feature axes and ``use_bias``/``use_scale``; then the dataclass fields, the
compatibility-only fields (``use_fast_variance``, ``force_float32_reductions``), boxed
(partitioned) initializers, the Linen transforms, ``axis_name`` under ``shard_map`` and that
the custom VJP is really used.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxnorm
from jaxnorm import linen as jln

from _module_cases import GRID, SHAPE, assert_matches_flax, assert_same_params, grid_id, partial_mask, randomize
from _numerics import assert_allclose

PAIRS = {"LayerNorm": (jln.LayerNorm, nn.LayerNorm), "RMSNorm": (jln.RMSNorm, nn.RMSNorm)}


def _out_and_grads(module, variables, x, mask, dy_seed=2):
  y, vjp = jax.vjp(lambda v, x: module.apply(v, x, mask=mask), variables, x)
  dy = jax.random.normal(jax.random.key(dy_seed), y.shape, jnp.float32).astype(y.dtype)
  dv, dx = vjp(dy)
  return y, dv, dx


def _compare_with_flax(name, x, mask, **kwargs):
  ours_cls, flax_cls = PAIRS[name]
  ours, theirs = ours_cls(**kwargs), flax_cls(**kwargs)
  v_ours = ours.init(jax.random.key(0), x, mask=mask)
  v_theirs = theirs.init(jax.random.key(0), x, mask=mask)
  assert_same_params(v_ours, v_theirs)
  variables = randomize(v_ours)
  y1, dv1, dx1 = _out_and_grads(ours, variables, x, mask)
  assert_matches_flax(x, (y1, dv1, dx1), _out_and_grads(theirs, variables, x, mask))
  return y1


@pytest.mark.parametrize("name,dtype,param_dtype,masked,axes,use_scale,use_bias", GRID,
                         ids=[grid_id(c) for c in GRID])
def test_parity_with_flax(name, dtype, param_dtype, masked, axes, use_scale, use_bias):
  red, feat = axes
  x = (0.5 + 2.0 * jax.random.normal(jax.random.key(3), SHAPE)).astype(dtype)
  kwargs = dict(param_dtype=jnp.dtype(param_dtype), use_scale=use_scale, reduction_axes=red,
                feature_axes=feat)
  if name == "LayerNorm":
    kwargs["use_bias"] = use_bias
  _compare_with_flax(name, x, partial_mask() if masked else None, **kwargs)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("x_dtype,dtype", [("float32", "bfloat16"), ("bfloat16", "float32"),
                                           ("float16", "float16")])
def test_dtype_field_matches_flax(name, x_dtype, dtype):
  x = jax.random.normal(jax.random.key(4), SHAPE).astype(x_dtype)
  y = _compare_with_flax(name, x, None, dtype=jnp.dtype(dtype))
  assert y.dtype == jnp.dtype(dtype)


def test_dataclass_fields_match_flax():
  for name, (ours, theirs) in PAIRS.items():
    # Flax appends `parent` and `name` to every module's fields; compare the layer's own.
    a = [(f.name, f.default) for f in dataclasses.fields(ours) if f.name not in ("parent", "name")]
    b = [(f.name, f.default) for f in dataclasses.fields(theirs)
         if f.name not in ("parent", "name")]
    # The documented difference (docs/modules.md): LayerNorm's accurate variance by default.
    if name == "LayerNorm":
      assert ("use_fast_variance", False) in a and ("use_fast_variance", True) in b
      b = [("use_fast_variance", False) if f == ("use_fast_variance", True) else f for f in b]
    assert a[:len(b)] == b, name
    assert a[len(b):] == [("epsilon_placement", "inside"), ("zero_centered_scale", False),
                          ("impl", "auto"), ("backend_config", None), ("casting", "float32"),
                          ("memory_efficient", False)], name
  assert "force_float32_reductions" in [f.name for f in dataclasses.fields(jln.LayerNorm)]


def test_compatibility_fields_only_differ_where_flax_is_inaccurate():
  rng = np.random.default_rng(0)
  base = rng.standard_normal((8, 64))
  # use_fast_variance: moderate mean/std agrees with Flax's default; at 1e4 jaxnorm's default
  # is accurate. With the flag, jaxnorm computes Flax's fast form.
  x = jnp.asarray(3.0 + base, jnp.float32)
  v = jln.LayerNorm().init(jax.random.key(0), x)
  np.testing.assert_allclose(jln.LayerNorm().apply(v, x), nn.LayerNorm().apply(v, x),
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(jln.LayerNorm(use_fast_variance=True).apply(v, x),
                             nn.LayerNorm().apply(v, x), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(jln.LayerNorm().apply(v, x),
                             nn.LayerNorm(use_fast_variance=False).apply(v, x),
                             rtol=1e-5, atol=1e-5)
  x = jnp.asarray(1e4 + base, jnp.float32)
  xs = np.asarray(x, np.float64)
  ref = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-6)
  err_ours = np.max(np.abs(np.asarray(jln.LayerNorm().apply(v, x), np.float64) - ref))
  err_fast = np.max(np.abs(np.asarray(nn.LayerNorm().apply(v, x), np.float64) - ref))
  assert err_ours < 1e-3 and err_ours < err_fast / 10, (err_ours, err_fast)
  # force_float32_reductions=False: identical for float32 inputs; for bfloat16 inputs Flax
  # reduces in bfloat16, jaxnorm in float32: it is the closer to a float64 reference, and the
  # two differ by bfloat16 rounding only.
  for name, (ours_cls, flax_cls) in PAIRS.items():
    x32 = jnp.asarray(0.5 + base, jnp.float32)
    v = ours_cls().init(jax.random.key(0), x32)
    np.testing.assert_allclose(ours_cls(force_float32_reductions=False).apply(v, x32),
                               flax_cls(force_float32_reductions=False).apply(v, x32),
                               rtol=1e-4, atol=1e-4)
    xb = x32.astype(jnp.bfloat16)
    # dtype=None: Flax reduces in the input's bfloat16; the output is float32 (params' dtype).
    y_ours = ours_cls(force_float32_reductions=False).apply(v, xb)
    y_flax = flax_cls(force_float32_reductions=False).apply(v, xb)
    y_ref = flax_cls().apply(v, xb)  # Flax with float32 reductions
    assert y_ours.dtype == y_flax.dtype == jnp.float32
    err_ours = float(jnp.max(jnp.abs(y_ours - y_ref)))
    err_flax = float(jnp.max(jnp.abs(y_flax - y_ref)))
    assert err_ours <= err_flax and err_ours < 1e-4, (name, err_ours, err_flax)
    assert_allclose(y_ours, y_flax, jnp.bfloat16)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_bad_fields_raise_when_the_module_is_built(name):
  cls = PAIRS[name][0]
  with pytest.raises(ValueError, match="epsilon_placement"):
    cls(epsilon_placement="middle")
  with pytest.raises(ValueError, match="impl"):
    cls(impl="cuda")
  with pytest.raises(ValueError, match="epsilon"):
    cls(epsilon=-1.0)
  with pytest.raises(ValueError, match=r"reduction_axes=5"):
    cls(reduction_axes=5).init(jax.random.key(0), jnp.ones((2, 4)))
  with pytest.raises(TypeError, match="mask"):
    cls().init(jax.random.key(0), jnp.ones((2, 4)), mask=jnp.ones((2, 4)))
  # Applying variables made for another feature size fails clearly (Flax's shape check).
  v = cls().init(jax.random.key(0), jnp.ones((2, 4)))
  with pytest.raises(Exception, match="scale"):
    cls().apply(v, jnp.ones((2, 6)))


def test_partitioned_initializers_pass_through():
  names = ("model",)
  for name, (ours_cls, flax_cls) in PAIRS.items():
    kw = dict(scale_init=nn.with_partitioning(nn.initializers.ones, names))
    if name == "LayerNorm":
      kw["bias_init"] = nn.with_partitioning(nn.initializers.zeros, names)
    x = jnp.ones((2, 8))
    v_ours = ours_cls(**kw).init(jax.random.key(0), x)
    v_theirs = flax_cls(**kw).init(jax.random.key(0), x)
    assert isinstance(v_ours["params"]["scale"], nn.Partitioned)
    assert nn.get_partition_spec(v_ours) == nn.get_partition_spec(v_theirs)
    assert nn.get_partition_spec(v_ours)["params"]["scale"] == P("model")
    np.testing.assert_allclose(ours_cls(**kw).apply(v_ours, x), flax_cls(**kw).apply(v_ours, x),
                               atol=1e-6)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("axes", [(-1, -1), ((1, 2), -1)], ids=["fused", "affine-outside"])
def test_module_calls_the_custom_jvp_op(name, axes):
  red, feat = axes
  x = jnp.ones(SHAPE)
  for cls, expected in zip(PAIRS[name], (True, False)):
    layer = cls(reduction_axes=red, feature_axes=feat)
    v = layer.init(jax.random.key(0), x)
    jaxpr = str(jax.make_jaxpr(layer.apply)(v, x))
    assert ("custom_jvp_call" in jaxpr) == expected, cls


class _ScanBody(nn.Module):
  norm: Any

  @nn.compact
  def __call__(self, h, _):
    return jnp.tanh(self.norm()(h)), None


class _Stack(nn.Module):
  """Three norm layers with stacked parameters, applied with nn.scan under nn.remat."""
  norm: Any

  @nn.compact
  def __call__(self, x):
    body = nn.scan(nn.remat(_ScanBody), variable_axes={"params": 0},
                   split_rngs={"params": True}, length=3)
    h, _ = body(self.norm)(x, None)
    return h


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_linen_transforms(name):
  ours_cls, flax_cls = PAIRS[name]
  x = jax.random.normal(jax.random.key(5), (5, 4))
  dy = jax.random.normal(jax.random.key(6), (5, 4))

  def check(ours, theirs, x, dy):
    v = randomize(ours.init(jax.random.key(0), x))
    assert jax.tree.structure(v) == jax.tree.structure(theirs.init(jax.random.key(0), x))
    y1, vjp1 = jax.vjp(jax.jit(ours.apply), v, x)
    y2, vjp2 = jax.vjp(theirs.apply, v, x)
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(vjp1(dy)), jax.tree.leaves(vjp2(dy))):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    return v

  # nn.scan (with nn.remat inside) over a stack of three layers.
  v = check(_Stack(ours_cls), _Stack(flax_cls), x, dy)
  assert jax.tree.leaves(v)[0].shape == (3, 4)
  # nn.remat of the layer itself.
  check(nn.remat(ours_cls)(), nn.remat(flax_cls)(), x, dy)
  # nn.vmap with per-example parameters (one layer per leading index).
  vm = dict(variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=0, out_axes=0)
  v = check(nn.vmap(ours_cls, **vm)(), nn.vmap(flax_cls, **vm)(), x, dy)
  assert jax.tree.leaves(v)[0].shape == (5, 4)


@pytest.mark.parametrize("name", ["RMSNorm"])  # LayerNorm: the same code path, in test_nnx.py
def test_axis_name_under_shard_map_equals_unsharded(name):
  n_dev = len(jax.devices())
  mesh = jax.make_mesh((n_dev,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
  cls = PAIRS[name][0]
  # Normalize over axis 1 (not trailing), split over the devices.
  x = jax.random.normal(jax.random.key(7), (3, 2 * n_dev, 2)) + 1.0
  dy = jax.random.normal(jax.random.key(8), x.shape)
  full = cls(reduction_axes=1, feature_axes=1)
  sharded = cls(reduction_axes=1, feature_axes=1, axis_name="model")
  v = randomize(full.init(jax.random.key(0), x))
  x_spec = P(None, "model", None)
  v_spec = jax.tree.map(lambda _: P("model"), v)
  f = jax.shard_map(sharded.apply, mesh=mesh, in_specs=(v_spec, x_spec), out_specs=x_spec)
  y, vjp = jax.vjp(f, v, x)
  y_ref, vjp_ref = jax.vjp(full.apply, v, x)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(vjp(dy)), jax.tree.leaves(vjp_ref(dy))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_impl_is_passed_to_the_op(name):
  cls = PAIRS[name][0]
  x = jax.random.normal(jax.random.key(9), (4, 8))
  v = cls().init(jax.random.key(0), x)
  # impl reaches the op: "xla" matches the op's XLA path and the default the op's "auto" (the
  # kernels on a GPU), bit for bit.
  op = jaxnorm.layer_norm if name == "LayerNorm" else jaxnorm.rms_norm
  params = tuple(v["params"][k] for k in ("scale", "bias") if k in v["params"])
  np.testing.assert_array_equal(cls(impl="xla").apply(v, x),
                                op(x, *params, epsilon=1e-6, impl="xla"))
  np.testing.assert_array_equal(cls().apply(v, x), op(x, *params, epsilon=1e-6, impl="auto"))
  # The Pallas kernels take no mask: the op refuses, so the field demonstrably reaches it.
  with pytest.raises(ValueError, match="impl='pallas'"):
    cls(impl="pallas").apply(v, x, mask=x > 0)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("placement,zero_centered", [("outside", False), ("inside", True)])
def test_extra_fields_match_reference(name, placement, zero_centered):
  x = jax.random.normal(jax.random.key(10), (4, 8))
  layer = PAIRS[name][0](epsilon=1e-2, epsilon_placement=placement,
                         zero_centered_scale=zero_centered)
  v = randomize(layer.init(jax.random.key(0), x))
  p = v["params"]
  kw = dict(epsilon=1e-2, epsilon_placement=placement, zero_centered_scale=zero_centered)
  if name == "LayerNorm":
    ref = jaxnorm.reference.layer_norm(x, p["scale"], p["bias"], **kw)
  else:
    ref = jaxnorm.reference.rms_norm(x, p["scale"], **kw)
  np.testing.assert_allclose(layer.apply(v, x), ref, rtol=1e-5, atol=1e-5)
  # Defaults reproduce Flax.
  np.testing.assert_allclose(PAIRS[name][0](epsilon=1e-2).apply(v, x),
                             PAIRS[name][1](epsilon=1e-2).apply(v, x), rtol=1e-5, atol=1e-5)
