"""A model with jaxnorm's layers exports wherever one with Flax's does (issue 62): the training
step and the forward of the cpu preset's model, and of one with per-head QK-norm and the fused
add + norm, exported from this CPU with ``jax.export(..., platforms=["cpu", "cuda", "tpu"])``
and no disabled safety check. ``impl="auto"`` takes the XLA path in an export (the Triton
kernels' custom call has no compatibility guarantee, so JAX would refuse to serialize it); a
call that names ``impl="triton"`` still exports its kernels for cuda when the caller disables
that check, and is refused by JAX's own message otherwise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnorm
from jaxnorm.models import TransformerConfig, TransformerLM
from _backends import lowered_for

TRITON_CALL = "__gpu$xla.gpu.triton"
PLATFORMS = ["cpu", "cuda", "tpu"]
# The cpu preset's model (experiments/suite/presets.toml, [cpu] and [cpu.scale]).
CPU_PRESET = dict(d_model=64, n_heads=4, d_ff=256, max_len=64, n_layers=6, scan_layers=True)
MODELS = {
    "cpu-preset": CPU_PRESET,
    "qk-norm-fused": dict(CPU_PRESET, n_layers=2, norm_type="rms_norm", qk_norm="rms_norm",
                          qk_norm_scale="per_head", fuse_residual_norm=True),
}


def _step_and_forward(fields):
  graph, params = nnx.split(TransformerLM(TransformerConfig(**fields), rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, 256)

  def loss(params, tokens):
    logits = nnx.merge(graph, params)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  def forward(params, tokens):
    return nnx.merge(graph, params)(tokens)

  return jax.value_and_grad(loss), forward, params, tokens


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_model_exports_for_every_platform_and_runs_as_jit_does(name):
  step, forward, params, tokens = _step_and_forward(MODELS[name])
  for fn in (step, forward):
    exported = jax.export.export(jax.jit(fn), platforms=PLATFORMS)(params, tokens)
    assert exported.platforms == tuple(PLATFORMS)
    assert TRITON_CALL not in exported.mlir_module()
    # The exported cpu program computes what jit computes.
    got, want = exported.call(params, tokens), jax.jit(fn)(params, tokens)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)


def _rms_grad(impl):
  return jax.grad(lambda x, s: jnp.sum(jaxnorm.rms_norm(x, s, impl=impl) ** 2), argnums=(0, 1))


def test_a_named_triton_call_exports_its_kernels_only_with_the_check_disabled(gpu_host):
  """And "auto", chosen as on a GPU host (where it is a per-platform switch), exports the XLA path
  for cuda while a jit's lowering for cuda carries the kernels."""
  x, s = jax.random.normal(jax.random.key(0), (16, 128)), jnp.linspace(0.5, 1.5, 128)
  with pytest.raises(ValueError, match="custom calls whose targets have no compatibility"):
    jax.export.export(jax.jit(_rms_grad("triton")), platforms=["cuda"])(x, s)
  checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
  text = jax.export.export(jax.jit(_rms_grad("triton")), platforms=["cuda"],
                           disabled_checks=checks)(x, s).mlir_module()
  assert TRITON_CALL in text
  # "auto" exports with the XLA path for cuda, and lowers the kernels for cuda when jitted.
  auto = jax.export.export(jax.jit(_rms_grad("auto")), platforms=["cuda"])(x, s).mlir_module()
  assert TRITON_CALL not in auto
  assert TRITON_CALL in lowered_for(_rms_grad("auto"), ("cuda",), x, s)
