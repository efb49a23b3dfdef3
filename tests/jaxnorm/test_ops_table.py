"""jaxnorm.OPS is the one list of ops: every derived table equals its names, a throwaway op
registered in it runs through the layers' dispatch, and an unknown name raises a clear error."""

import dataclasses
import re

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


# The table as it stands, written out (the one place: the assertions below read their expected
# lists from here): a change to OPS must change WANT and EXPORTS as well.
WANT = {  # name: (family, parameters after the inputs, layer, inputs)
    "layer_norm": ("norm", ("scale", "bias"), "LayerNorm", ("x",)),
    "rms_norm": ("norm", ("scale",), "RMSNorm", ("x",)),
    "dyt": ("pointwise", ("alpha", "scale", "bias"), "DyT", ("x",)),
    "derf": ("pointwise", ("alpha", "shift", "scale", "bias"), "Derf", ("x",)),
    "gated_rms_norm": ("gated", ("scale",), "GatedRMSNorm", ("x", "z")),
}
EXPORTS = ("add_layer_norm", "add_rms_norm", "derf", "derf_jacobian", "dyt", "dyt_jacobian",
           "gated_rms_norm", "layer_norm", "layer_norm_jacobian", "rms_norm", "rms_norm_jacobian")


def _want(family=None, inputs=None):
  """The names of WANT (of one family, with these inputs), in order."""
  return tuple(n for n, w in WANT.items()
               if (family is None or w[0] == family) and (inputs is None or w[3] == inputs))


def test_the_table_is_as_written():
  assert {n: (op.family, op.params, op.layer, op.inputs) for n, op in jaxnorm.OPS.items()} == WANT
  assert tuple(jaxnorm.OPS) == tuple(WANT)
  for name, op in jaxnorm.OPS.items():
    assert op.name == op.decl.name == name
    assert getattr(jaxnorm, name) is op.fn
    # DyT's and Derf's oracles are jaxnorm.reference's; a newer op's is in its own module.
    assert getattr(jaxnorm.reference, name, op.reference) is op.reference


def test_every_derived_table_is_the_ops_names():
  from experiments.bench import impls, pointwise, qk
  assert tuple(_ops.NORM_OPS) == _want("norm") == impls.OPS == qk.KINDS
  assert impls.FUSED_OPS == tuple(n for n in EXPORTS if n.startswith("add_"))
  assert pointwise.pointwise_ops() == _want("pointwise")
  # A model's norm is an op with the one input x: the gated op (inputs x, z) is not one.
  assert _config.NORM_TYPES == _want(inputs=("x",)) == _config.QK_NORMS[1:]
  assert _ops.layer_replacements() == _config.NORM_TYPES
  # The public names, exported from the table.
  assert tuple(sorted(_ops.exports())) == EXPORTS
  assert set(EXPORTS) <= set(jaxnorm.__all__)
  assert {w[2] for w in WANT.values()} == set(jnn.__all__) == set(jln.__all__)
  for op in jaxnorm.OPS.values():
    assert hasattr(jnn, op.layer) and hasattr(jln, op.layer), op.layer


def test_the_pointwise_layers_are_built_from_their_entries():
  """One class per entry, named and documented by it, at home in jaxnorm.nnx / jaxnorm.linen."""
  for name in _want("pointwise"):
    op = jaxnorm.OPS[name]
    for module, doc in ((jnn, op.layer_docs[0]), (jln, op.layer_docs[1])):
      cls = getattr(module, op.layer)
      assert (cls.__name__, cls.__qualname__, cls.__module__) == (op.layer, op.layer,
                                                                  module.__name__)
      assert cls.__doc__ == doc if doc else f"jaxnorm.{name}" in cls.__doc__
  assert jnn.DyT.__doc__.startswith("Dynamic Tanh (Zhu et al., CVPR 2025)")


def _negated_tanh():
  """A throwaway pointwise op, y = gamma * (-tanh(alpha x)) + beta, and its table entry."""
  squash = _pointwise.Squash("neg_tanh", lambda u: -jnp.tanh(u),
                             lambda u, t: -(1.0 - jnp.tanh(u) ** 2), has_shift=False)

  def fn(x, alpha, scale=None, bias=None, *, dtype=None):
    return _pointwise.call(squash, x, alpha, None, scale, bias, dtype=dtype)

  def reference(x, alpha, scale=None, bias=None, *, dtype=None):
    return jaxnorm.reference.pointwise(lambda u: -jnp.tanh(u), x, alpha, None, scale, bias,
                                       dtype=dtype)

  return _ops.Op("neg_tanh", _ops.POINTWISE_FAMILY, squash, fn, reference,
                 ("alpha", "scale", "bias"), "NegTanh")


@pytest.fixture
def neg_tanh():
  op = _ops.register(_negated_tanh())
  yield op
  _ops.unregister(op.name)


def test_a_registered_op_runs_through_the_layers_dispatch(neg_tanh):
  op = neg_tanh
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
  assert jaxnorm.neg_tanh is op.fn and jnn.NegTanh is jnn.NegTanh


def test_register_refuses_what_cannot_join_and_unregister_restores():
  op = _negated_tanh()
  with pytest.raises(TypeError, match="op must be a jaxnorm.ops.table.Op"):
    _ops.register("neg_tanh")
  with pytest.raises(ValueError, match="'dyt' is already an op"):
    _ops.register(dataclasses.replace(op, name="dyt"))
  with pytest.raises(ValueError, match=r"\['DyT'\] are taken"):
    _ops.register(dataclasses.replace(op, layer="DyT"))
  with pytest.raises(ValueError, match="register takes ops of the 'pointwise' family"):
    _ops.register(dataclasses.replace(op, family="norm"))
  with pytest.raises(ValueError, match="op.decl.name must be op.name"):
    _ops.register(dataclasses.replace(op, name="other"))
  with pytest.raises(ValueError, match="one of the library's ops"):
    _ops.unregister("dyt")
  before = tuple(jaxnorm.OPS)
  _ops.register(op)
  assert tuple(jaxnorm.OPS) == before + ("neg_tanh",)
  assert _ops.unregister("neg_tanh") is op
  assert tuple(jaxnorm.OPS) == before
  with pytest.raises(AttributeError, match="neg_tanh"):
    jaxnorm.neg_tanh  # noqa: B018
  with pytest.raises(ValueError, match="'neg_tanh' is not a registered op"):
    _ops.unregister("neg_tanh")


@pytest.mark.parametrize("call", ["normalize", "pointwise", "make_norm", "config"])
def test_an_unknown_name_raises_naming_the_argument(call):
  x = jnp.ones((2, 8))
  calls = {
      "normalize": lambda: common.normalize("no_such_op", x, None, None, reduction_axes=-1,
                                            feature_axes=-1, epsilon=1e-6, dtype=jnp.float32),
      "pointwise": lambda: common.pointwise("no_such_op", x, jnp.ones(()), None, None, None,
                                            feature_axes=-1, dtype=jnp.float32, num_features=8,
                                            module="M"),
      "make_norm": lambda: _layers._make_norm(TransformerConfig(), nnx.Rngs(0),
                                              norm_type="no_such_op"),
      "config": lambda: TransformerConfig(norm_type="no_such_op"),
  }
  argument = {"normalize": "op_name", "pointwise": "op_name", "make_norm": "norm_type", "config": "norm_type"}
  valid = {"normalize": _want("norm"), "pointwise": _want("pointwise"),
           "make_norm": _want(inputs=("x",)), "config": _want(inputs=("x",))}[call]
  with pytest.raises(ValueError, match=rf"{argument[call]} must be one of {re.escape(str(valid))}, got 'no_such_op'"):
    calls[call]()


def test_a_name_of_the_other_family_is_refused():
  x = jnp.ones((2, 8))
  norms, pointwise = re.escape(str(_want("norm"))), re.escape(str(_want("pointwise")))
  with pytest.raises(ValueError, match=rf"op_name must be one of {norms}, got 'dyt'"):
    common.normalize("dyt", x, None, None, reduction_axes=-1, feature_axes=-1, epsilon=1e-6,
                     dtype=jnp.float32)
  with pytest.raises(ValueError, match=rf"op_name must be one of {pointwise}, got 'rms_norm'"):
    common.pointwise("rms_norm", x, jnp.ones(()), None, None, None, feature_axes=-1,
                     dtype=jnp.float32, num_features=8, module="M")


def test_ops_entries_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    jaxnorm.OPS["dyt"].name = "x"


def test_the_layers_take_the_options_their_op_declares():
  """Option names come from the op's declaration: the layers read and pass exactly those, and
  normalize refuses any other name."""
  assert [o.name for o in common.op_options("layer_norm")] == ["use_fast_variance",
                                                               "memory_efficient"]
  assert [o.name for o in common.op_options("rms_norm")] == ["memory_efficient"]
  rms = jnn.RMSNorm(8, rngs=nnx.Rngs(0))
  assert tuple(common.layer_options(rms, "rms_norm")) == common.FAMILY_OPTIONS + (
      "memory_efficient",)
  assert tuple(common.layer_options(jln.LayerNorm(), "layer_norm"))[-2:] == (
      "use_fast_variance", "memory_efficient")
  x = jnp.ones((2, 8))
  with pytest.raises(TypeError, match=r"rms_norm takes no option \['use_fast_variance'\]"):
    common.normalize("rms_norm", x, None, None, reduction_axes=-1, feature_axes=-1,
                     epsilon=1e-6, dtype=jnp.float32, use_fast_variance=True)
  with pytest.raises(TypeError, match="memory_efficient must be a bool"):
    jnn.LayerNorm(8, memory_efficient="yes", rngs=nnx.Rngs(0))
