"""The TPU kernels' Mosaic lowering in every launch shape the backend makes, from a CPU host.

``jax.export(..., platforms=["tpu"])`` runs Pallas's lowering of each kernel to the Mosaic
dialect (block shapes, index maps, the operations used) and serializes it into a
``tpu_custom_call``; Mosaic's compiler, which runs only on a TPU, is not run (``docs/tpu.md``).
``test_tpu_kernels.py`` exports each op and gradient at one shape; here each distinct launch
configuration is exported once: padded and full-width unaligned widths, one feature, per-head
parameters and ``vmap`` (the group grid axis), the widest row (a raised VMEM limit), the fused
backward writing two cotangents, and gated RMSNorm in several groups with a padded width.
No kernel runs, so this file costs lowering time only.
"""

import jax
import jax.numpy as jnp
import pytest

import jaxnorm
from jaxnorm.backends import table
from jaxnorm.backends.tpu import TPU, TpuConfig
from jaxnorm.backends.tpu import config as tpu_config


@pytest.fixture(scope="module", autouse=True)
def _tpu_registered():
  own = TPU.name not in table.BACKENDS
  if own:
    table.register_backend(TPU)
  yield
  if own:
    table.unregister_backend(TPU.name)


def _calls(fn, *args):
  """``(forward, gradient)`` counts of ``tpu_custom_call`` in the TPU exports of ``fn`` and of
  the gradient of the sum of squares of its first output, with respect to every argument."""
  def y(*a):
    out = fn(*a)
    return out[0] if isinstance(out, tuple) else out

  def loss(*a):
    return jnp.sum(y(*a).astype(jnp.float32) ** 2)

  texts = [jax.export.export(jax.jit(f), platforms=["tpu"])(*args).mlir_module()
           for f in (y, jax.grad(loss, argnums=tuple(range(len(args)))))]
  return tuple(t.count("tpu_custom_call") for t in texts)


def _s(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


CFG = TpuConfig()
CASES = {
    "padded-width": (lambda x, s, b: jaxnorm.layer_norm(
        x, s, b, impl="tpu", backend_config=TpuConfig(pad_features=True)),
        (_s((37, 300)), _s((300,)), _s((300,)))),
    "one-feature": (lambda x, s: jaxnorm.rms_norm(x, s, impl="tpu", backend_config=CFG),
                    (_s((16, 1)), _s((1,)))),
    "per-head": (lambda x, s, b: jaxnorm.layer_norm(x, s, b, impl="tpu", backend_config=CFG),
                 (_s((2, 8, 4, 128), jnp.bfloat16), _s((4, 128)), _s((4, 128)))),
    "vmap-batched-scale": (jax.vmap(lambda x, s: jaxnorm.rms_norm(
        x, s, impl="tpu", backend_config=CFG)), (_s((3, 16, 256)), _s((3, 256)))),
    "widest-row": (lambda x: jaxnorm.rms_norm(x, impl="tpu", backend_config=CFG),
                   (_s((32, tpu_config.MAX_D), jnp.bfloat16),)),
    "fused-two-cotangents": (lambda x, r, s: jaxnorm.add_rms_norm(
        x, r, s, residual_scale=0.5, impl="tpu", backend_config=CFG),
        (_s((40, 256), jnp.bfloat16), _s((40, 256)), _s((256,)))),
    "gated-groups-padded": (lambda x, z, s: jaxnorm.gated_rms_norm(
        x, z, s, group_size=50, norm_before_gate=False, impl="tpu",
        backend_config=TpuConfig(pad_features=True)),
        (_s((24, 200)), _s((24, 200)), _s((200,)))),
    "gated-llama-bf16": (lambda x, z, s: jaxnorm.gated_rms_norm(
        x, z, s, group_size=128, casting="llama", impl="tpu", backend_config=CFG),
        (_s((24, 512), jnp.bfloat16), _s((24, 512), jnp.bfloat16), _s((512,), jnp.bfloat16))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_launch_shape_lowers_to_mosaic(name):
  fn, args = CASES[name]
  forward, grad = _calls(fn, *args)
  assert forward == 1, (name, forward)
  assert grad == 2, (name, grad)  # the forward with statistics and the backward


def test_the_widest_row_asks_for_more_vmem():
  """Only a row too wide for the default scoped VMEM raises the limit (the rule's blocks keep
  Mosaic's default)."""
  br = tpu_config.block_rows(32, tpu_config.MAX_D, (jnp.bfloat16,), CFG)
  assert tpu_config.vmem_limit_bytes(br, tpu_config.MAX_D, [2, 2, 2]) is not None
  br = tpu_config.block_rows(4096, 1024, (jnp.bfloat16,), CFG)
  assert tpu_config.vmem_limit_bytes(br, 1024, [2, 2, 2]) is None
