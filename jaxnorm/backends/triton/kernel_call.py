"""Internal API: the kernels behind a primitive of their own, differentiable to any order.

A ``pallas_call`` has no derivative here, and none is needed for the first order: the kernels
*are* the derivative rules (:mod:`jaxnorm.ops.norm.rules`). But a program may differentiate them
again (the forward inside a second-order ``jax.jvp``, the backward inside a forward-over-reverse
Hessian-vector product), and with ``impl="auto"`` every program traces the GPU branch, even
on a CPU host where it is never compiled. A ``jax.custom_jvp`` wrapper would not do: partial
evaluation inlines a ``custom_jvp`` whose inputs are known, so after one linearization the
bare ``pallas_call`` is left. ``kernel_call_p`` is never inlined:

* value and lowering: ``fn`` on the kernels (``cfg.impl == "triton"``), lowered per platform:
  the Triton kernels for cuda/rocm (but for ``impl="auto"`` in a program ``jax.export``
  lowers, which takes the XLA path there too: the kernels' custom call is not
  export-stable); elsewhere the kernels in interpret mode, or the op's
  ``impl='pallas'`` error (raised where the program is lowered, so a program traced on a CPU
  host lowers for a GPU), or, in ``impl="auto"``'s GPU branch, the XLA path (a program lowered
  for several platforms lowers that branch for all of them);
* JVP: the value from the primitive again (so that a higher order meets this rule too), the
  tangent from ``jax.jvp`` of the same ``fn`` on the XLA path, which computes the same values;
* batching: a batch axis of any operand becomes a leading group axis of all of them, mapped
  with ``jax.vmap`` over the kernels (a ``pallas_call`` under ``vmap`` is one launch with one
  more grid axis).

The rules both kernel backends share are written once
(:class:`jaxnorm.backends._kernel_primitive.KernelPrimitive`); this module says what is the
Triton kernels' own: their platforms, the export rule and the error elsewhere.
"""

from __future__ import annotations

from jaxnorm import _validation as v
from jaxnorm._norm_config import NormConfig
from jaxnorm.backends._kernel_primitive import KernelPrimitive, flat_fn, on_xla
from jaxnorm.backends.triton.config import GPU_BACKENDS, kernel_problem
from jaxnorm.backends.triton.config import GPU_PLATFORMS as PLATFORMS

__all__ = ["kernel_call"]


class _TritonCall(KernelPrimitive):
  """The Triton kernels' primitive: lowered for cuda/rocm, interpreted in place elsewhere."""

  def run(self, *leaves, cfg, fn, tree, groups, elsewhere, for_export=False):
    """What the primitive lowers to for a GPU: ``fn`` on the kernels, on flat leaves; in
    ``impl="auto"``'s GPU branch (``elsewhere="xla"``) of a program ``jax.export`` lowers, the
    XLA path instead: the Triton kernels' custom call has no compatibility guarantee, so JAX
    refuses to serialize it, and ``auto`` exports wherever the XLA path does (a call that names
    ``impl="triton"`` exports its kernels, with the safety check disabled by the caller)."""
    if for_export and elsewhere == "xla":
      return flat_fn(on_xla(cfg), fn, tree, groups)(*leaves)
    return flat_fn(cfg, fn, tree, groups)(*leaves)

  def refusal_elsewhere(self, platform: str) -> str:
    """The op's ``impl='pallas'`` error for a program lowered for ``platform``."""
    # The config does not carry the spelling the call used ("triton" or its alias "pallas"), so
    # the message names both.
    return v.backend_refusal("triton", kernel_problem(backend=platform)).replace(
        "impl='triton'", "impl='triton' (alias 'pallas')", 1)


_KERNEL_CALL = _TritonCall("jaxnorm_kernels", PLATFORMS, eager_backends=GPU_BACKENDS,
                           with_export=True)
kernel_call_p = _KERNEL_CALL.p
_run = _KERNEL_CALL.run  # the GPU lowering (tests expand a kernel call's jaxpr with it)


def kernel_call(cfg: NormConfig, fn, *args, elsewhere: str = "raise"):
  """``fn(cfg, *args)`` on the kernels (``cfg.impl == "triton"``), behind ``kernel_call_p``.

  ``fn`` takes the config first and is hashable (it is a primitive parameter): the dispatcher
  passes one entry of the backends' tables (:class:`jaxnorm.backends.interface.Entry`, a frozen
  dataclass that runs ``cfg.impl``'s function, XLA's where this module swaps in
  ``impl="xla"``); ``args`` may hold None. The Triton backend's ``launch``. ``elsewhere``: what
  lowering for a platform the kernels do not compile for gives (interpret mode aside): "raise"
  (``impl="pallas"``) or "xla" (the GPU branch of ``impl="auto"``). Returns what ``fn`` returns.
  """
  return _KERNEL_CALL.call(cfg, fn, *args, elsewhere=elsewhere)
