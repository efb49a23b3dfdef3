"""jaxnorm.OPS is the one list of ops: every derived table equals its names, a throwaway op
registered in it runs through the layers' dispatch, and an unknown name raises a clear error."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxnorm
from jaxnorm.flax import common as common
from jaxnorm.ops import table as _ops
from jaxnorm.ops.pointwise import rules as _pointwise
from jaxnorm import linen as jln
from jaxnorm import nnx as jnn
from jaxnorm.models import TransformerConfig, _config
from jaxnorm.models import _layers


def _family(family):
  return tuple(n for n, op in jaxnorm.OPS.items() if op.family == family)


def test_every_derived_table_is_the_ops_names():
  from experiments.bench import impls
  norms, pointwise = _family(_ops.NORM_FAMILY), _family(_ops.POINTWISE_FAMILY)
  gated = _family(_ops.GATED_FAMILY)
  assert norms + pointwise + gated == tuple(jaxnorm.OPS)
  assert tuple(_ops.NORM_OPS) == norms == common.KINDS == impls.OPS
  assert tuple(_ops.POINTWISE_OPS) == pointwise == common.POINTWISE_KINDS
  # A model's norm is an op with the one input x: the gated op (inputs x, z) is not one.
  one_input = tuple(n for n, op in jaxnorm.OPS.items() if op.inputs == ("x",))
  assert one_input == norms + pointwise
  assert _config.NORM_TYPES == one_input == _config.QK_NORMS[1:]
  assert impls.FUSED_OPS == tuple(jaxnorm.OPS[n].add_fn.__name__ for n in norms)
  for name, op in jaxnorm.OPS.items():
    assert op.name == op.decl.name == name
    assert getattr(jaxnorm, name) is op.fn and getattr(jaxnorm.reference, name) is op.reference
    assert hasattr(jnn, op.layer) and hasattr(jln, op.layer), op.layer


def _negated_tanh():
  """A throwaway pointwise op, y = gamma * (-tanh(alpha x)) + beta, and its table entry."""
  squash = _pointwise.Squash("neg_tanh", lambda u: -jnp.tanh(u),
                             lambda u, t: -(1.0 - jnp.tanh(u) ** 2), has_shift=False)

  def fn(x, alpha, scale=None, bias=None, *, dtype=None):
    cfg, alpha, _, scale, bias = _pointwise.prepare(squash, x, alpha, None, scale, bias, dtype=dtype)
    return _pointwise.apply(cfg, x, alpha, None, scale, bias)

  def reference(x, alpha, scale=None, bias=None, *, dtype=None):
    return -jaxnorm.reference.dyt(x, alpha, scale, None if bias is None else -bias, dtype=dtype)

  return _ops.Op("neg_tanh", _ops.POINTWISE_FAMILY, squash, fn, reference,
                 ("alpha", "scale", "bias"), "DyT")


def test_a_registered_op_runs_through_the_layers_dispatch(monkeypatch):
  op = _negated_tanh()
  monkeypatch.setattr(_ops, "OPS", types.MappingProxyType({**jaxnorm.OPS, op.name: op}))
  x = jax.random.normal(jax.random.key(0), (3, 8))
  alpha, scale, bias = jnp.asarray(0.7), jnp.linspace(0.5, 1.5, 8), jnp.linspace(-0.2, 0.2, 8)

  def layer(x, scale, bias):
    return common.pointwise("neg_tanh", x, alpha, None, scale, bias, feature_axes=-1,
                            dtype=jnp.float32, num_features=8, module="NegTanh")

  np.testing.assert_allclose(layer(x, scale, bias), op.reference(x, alpha, scale, bias), rtol=1e-6)
  dy = jax.random.normal(jax.random.key(1), x.shape)
  got = jax.vjp(layer, x, scale, bias)[1](dy)
  want = jax.vjp(lambda *a: op.reference(a[0], alpha, *a[1:]), x, scale, bias)[1](dy)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call", ["normalize", "pointwise", "make_norm", "config"])
def test_an_unknown_name_raises_naming_the_argument(call):
  x = jnp.ones((2, 8))
  calls = {
      "normalize": lambda: common.normalize("hard_tanh", x, None, None, reduction_axes=-1,
                                            feature_axes=-1, epsilon=1e-6, dtype=jnp.float32),
      "pointwise": lambda: common.pointwise("hard_tanh", x, jnp.ones(()), None, None, None,
                                            feature_axes=-1, dtype=jnp.float32, num_features=8,
                                            module="M"),
      "make_norm": lambda: _layers._make_norm(TransformerConfig(), nnx.Rngs(0),
                                              norm_type="hard_tanh"),
      "config": lambda: TransformerConfig(norm_type="hard_tanh"),
  }
  argument = {"normalize": "op_name", "pointwise": "op_name", "make_norm": "norm_type", "config": "norm_type"}
  with pytest.raises(ValueError, match=rf"{argument[call]} must be one of \(.*'(rms_norm|derf)'\), got 'hard_tanh'"):
    calls[call]()


def test_a_name_of_the_other_family_is_refused():
  x = jnp.ones((2, 8))
  with pytest.raises(ValueError, match=r"op_name must be one of \('layer_norm', 'rms_norm'\), got 'dyt'"):
    common.normalize("dyt", x, None, None, reduction_axes=-1, feature_axes=-1, epsilon=1e-6,
                     dtype=jnp.float32)
  with pytest.raises(ValueError, match=r"op_name must be one of \('dyt', 'derf'\), got 'rms_norm'"):
    common.pointwise("rms_norm", x, jnp.ones(()), None, None, None, feature_axes=-1,
                     dtype=jnp.float32, num_features=8, module="M")


def test_ops_entries_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    jaxnorm.OPS["dyt"].name = "x"
