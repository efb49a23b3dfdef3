"""Internal API: the TPU kernels behind a primitive of their own, differentiable to any order.

The TPU backend's ``launch``, built as the Triton backend's kernel-call primitive is (see
:mod:`jaxnorm.backends.triton.kernel_call` for why a primitive and not a ``custom_jvp``), with
its own platform:

* value and lowering: ``fn`` on the kernels (``cfg.impl == "tpu"``), lowered per platform: the
  Mosaic kernels (``tpu_custom_call``) for ``tpu``; elsewhere the kernels in TPU interpret mode
  (``TpuConfig(interpret=True)``), or the XLA path of the same function where ``impl="auto"``'s
  TPU branch is lowered for another platform (``elsewhere="xla"``), or a ``ValueError`` naming
  the platform (``impl="tpu"``);
* JVP: the value from the primitive again, the tangent from ``jax.jvp`` of ``fn`` on the XLA
  path (:func:`jaxnorm._rules.jvp_by_formula`);
* batching: a batch axis of any operand becomes a leading group axis of all of them, mapped
  with ``jax.vmap`` over the kernels (one more grid axis of the ``pallas_call``).

What both kernel backends share is written once
(:class:`jaxnorm.backends._kernel_primitive.KernelPrimitive`); this module says what is the TPU
kernels' own: their platform, interpret mode as a program of its own, and the error elsewhere.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxnorm import _validation as v
from jaxnorm.backends._kernel_primitive import KernelPrimitive, flat_fn, out_types

__all__ = ["PLATFORMS", "tpu_call"]

#: The lowering platforms the kernels compile for.
PLATFORMS = ("tpu",)


@functools.lru_cache(maxsize=256)
def _interpreter(cfg, fn, tree, groups: int, in_types):
  """The interpret-mode program of the kernels, compiled for the host once per signature, on
  its first run (lowering it inside the caller's lowering fails on jax 0.8.1: the interpreter's
  ordered effects meet the caller's lowering context)."""
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in in_types]
  return jax.jit(flat_fn(cfg, fn, tree, groups)).lower(*structs).compile()


class _TpuCall(KernelPrimitive):
  """The TPU kernels' primitive: Mosaic on a TPU; interpret mode anywhere, as its own program."""

  def run(self, *leaves, cfg, fn, tree, groups, elsewhere):
    """Lowering for a TPU: the kernels (interpret mode too where the config asks for it)."""
    del elsewhere
    if cfg.backend_config.interpret:
      return self.interpreted(cfg, fn, tree, groups, leaves)
    return flat_fn(cfg, fn, tree, groups)(*leaves)

  def interpreted(self, cfg, fn, tree, groups: int, leaves):
    """The kernels in TPU interpret mode, each launch a program of its own run from a host
    callback. Interpret mode (``pltpu.InterpretParams``) simulates the TPU's memory with ordered
    host callbacks, effects which ``jax.checkpoint`` and a primitive's lowering cannot carry;
    run as their own program, they leave the caller's program pure (``jax.pure_callback``), so
    every transformation of the op works on the interpreted kernels as on the compiled ones."""
    in_types = tuple((tuple(a.shape), a.dtype) for a in leaves)
    _, outs = out_types(cfg, fn, tree, groups, in_types)
    structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in outs]

    def host(*arrays):
      return [np.asarray(o) for o in _interpreter(cfg, fn, tree, groups, in_types)(*arrays)]

    return jax.pure_callback(host, structs, *leaves)

  def refusal_elsewhere(self, platform: str) -> str:
    """``impl="tpu"``'s error for a program lowered for ``platform``."""
    return v.backend_refusal("tpu", (
        f"the TPU kernels compile for a TPU only, and the program is lowered for {platform!r}; "
        f"run them in TPU interpret mode elsewhere (slowly, for testing): "
        f"backend_config=jaxnorm.backends.tpu.TpuConfig(interpret=True)"))


_TPU_CALL = _TpuCall("jaxnorm_tpu_kernels", PLATFORMS)
tpu_call_p = _TPU_CALL.p


def tpu_call(cfg, fn, *args, elsewhere: str = "raise", check=lambda cfg, *args: None):
  """``fn(cfg, *args)`` on the TPU kernels (``cfg.impl == "tpu"``), behind ``tpu_call_p``: the
  TPU backend's ``launch``. ``fn``: hashable, the config first (the dispatcher's
  :class:`~jaxnorm.backends.interface.Entry`); ``args`` may hold None. ``elsewhere``: what
  lowering for a platform other than a TPU gives (interpret mode aside), "raise" or "xla".
  ``check(cfg, *args)``: raises, where the call is traced, what the kernels cannot take (their
  own trace runs where the program is lowered)."""
  check(cfg, *args)
  return _TPU_CALL.call(cfg, fn, *args, elsewhere=elsewhere)
