"""Every Pallas TPU name the kernels use, fenced in one module, and whether this JAX has them.

:func:`missing` says, without importing Pallas, why this JAX cannot run the TPU kernels (no
``jax.experimental.pallas.tpu``, found absent or blocked: a ``None`` in ``sys.modules`` is
Python's marker for a module ``import`` refuses), or None. The backend asks it when a call
chooses it (:meth:`jaxnorm.backends.tpu.backend.TpuBackend.unavailable`). The names are looked
up when a kernel first uses one: importing this module leaves ``jax.experimental.pallas``
unimported, and a JAX that lacks a name fails with a ``RuntimeError`` naming it and the JAX
version, not an ``AttributeError`` inside a kernel. Known to work: jax 0.8.1 (the floor) to
0.10.2, in interpret mode and in the export for TPU (``docs/tpu.md``).
"""

from __future__ import annotations

import functools

import jax

from jaxnorm.backends._kernel_common import find_submodule, lookup

__all__ = ["BlockSpec", "CompilerParams", "InterpretParams", "KNOWN", "Squeezed", "cdiv",
           "interpret_mode", "missing", "pallas_call", "program_id"]

#: The JAX releases the kernels were checked with (interpret mode and the TPU export).
KNOWN = "jax 0.8.1 to 0.10.2"
_TPU = "jax.experimental.pallas.tpu"


@functools.cache
def missing() -> str | None:
  """Why this JAX cannot run the TPU kernels (a phrase naming its version), or None. Cached."""
  if find_submodule("jax.experimental.pallas", "tpu") is not None:
    return None
  return (f"jax {jax.__version__}'s Pallas has no TPU backend ({_TPU} is absent or blocked); "
          f"the kernels were checked with {KNOWN}")


_find = functools.partial(lookup, who="jaxnorm's TPU kernels",
                          tail=f"they were checked with {KNOWN}. Use impl='xla'.")


@functools.cache
def _api() -> dict:
  """The Pallas names the kernels use, imported and looked up on first use."""
  why = missing()
  if why is not None:
    raise RuntimeError(f"jaxnorm's TPU kernels cannot run: {why}. Use impl='xla'.")
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu
  return {
      "pallas_call": _find(pl, ("pallas_call",), "pallas_call"),
      "BlockSpec": _find(pl, ("BlockSpec",), "BlockSpec"),
      "Squeezed": _find(pl, ("Squeezed",), "Squeezed (a squeezed block dimension)"),
      "program_id": _find(pl, ("program_id",), "program_id"),
      "cdiv": _find(pl, ("cdiv",), "cdiv"),
      "CompilerParams": _find(pltpu, ("CompilerParams", "TPUCompilerParams"),
                              "the TPU compiler parameters"),
      "InterpretParams": _find(pltpu, ("InterpretParams", "TPUInterpretParams"),
                               "the TPU interpret mode's parameters"),
  }


def pallas_call(*args, **kwargs):
  """``pl.pallas_call``."""
  return _api()["pallas_call"](*args, **kwargs)


def BlockSpec(*args, **kwargs):  # noqa: N802 (Pallas's name)
  """``pl.BlockSpec``."""
  return _api()["BlockSpec"](*args, **kwargs)


def Squeezed():  # noqa: N802 (Pallas's name)
  """``pl.Squeezed()``: a block dimension of size 1, dropped from the kernel's view."""
  return _api()["Squeezed"]()


def program_id(axis: int):
  """``pl.program_id``."""
  return _api()["program_id"](axis)


def cdiv(a: int, b: int) -> int:
  """``pl.cdiv``."""
  return _api()["cdiv"](a, b)


def CompilerParams(**kwargs):  # noqa: N802 (Pallas's name)
  """``pltpu.CompilerParams``."""
  return _api()["CompilerParams"](**kwargs)


def InterpretParams(**kwargs):  # noqa: N802 (Pallas's name)
  """``pltpu.InterpretParams``: TPU interpret mode."""
  return _api()["InterpretParams"](**kwargs)


@functools.cache
def _custom_vmap_keeps_ordered_effects() -> bool:
  """Whether ``jax.custom_batching.custom_vmap`` lowers a function with an ordered effect (jax
  0.10.2 does; jax 0.8.1 drops the effect's token: ``KeyError: OrderedIOEffect``). Asked by
  lowering (not running) a one-element ordered ``io_callback`` under it, once per process."""
  from jax.experimental import io_callback

  def f(x):
    return io_callback(lambda a: a, jax.ShapeDtypeStruct((), "float32"), x, ordered=True)

  g = jax.custom_batching.custom_vmap(f)
  g.def_vmap(lambda n, batched, x: (f(x), batched[0]))
  try:
    jax.jit(g).lower(jax.ShapeDtypeStruct((), "float32"))
  except KeyError:
    return False
  return True


def interpret_mode():
  """The ``interpret=`` of an interpreted kernel: TPU interpret mode (``InterpretParams()``,
  the TPU's memory and grid simulated) where this JAX can carry its ordered effects through the
  kernels' ``custom_vmap``, else Pallas's generic interpreter (``True``: the same kernel bodies
  and blocks, evaluated as plain JAX ops, without the TPU memory model; jax 0.8.1)."""
  return InterpretParams() if _custom_vmap_keeps_ordered_effects() else True
