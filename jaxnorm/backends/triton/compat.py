"""Internal API: every Pallas name the kernels use, fenced in one module, and whether this JAX
has them.

Pallas is experimental and its API moves between JAX releases (the Triton ``CompilerParams``
were ``TritonCompilerParams`` before jax 0.7; masked ``load``/``store`` live in the Triton
backend's module), and JAX 0.11.0 deprecated Pallas's Triton backend ("will be removed in a
future version"). The kernel modules (:mod:`~jaxnorm.backends.triton.common`,
:mod:`~jaxnorm.backends.triton.forward`, :mod:`~jaxnorm.backends.triton.backward`,
:mod:`~jaxnorm.backends.triton.gated`) import Pallas through this module only, as the rest of the
package reaches JAX internals through :mod:`jaxnorm._jax_compat`.

* :func:`missing` says, without importing Pallas, why this JAX cannot run the kernels (its
  Pallas has no ``jax.experimental.pallas.triton``), or None: the Triton backend asks it when a
  call chooses its backend (:meth:`~jaxnorm.backends.triton.backend.TritonBackend.unavailable`),
  so ``impl="auto"`` runs XLA and ``impl="triton"`` is refused on such a JAX.
* The Pallas names (:data:`__all__`) are looked up when a kernel first calls one, not when this
  module is imported: importing it leaves ``jax.experimental.pallas`` unimported. A JAX whose
  Pallas lacks a name fails then with a ``RuntimeError`` naming the JAX version and what is
  missing, instead of an ``AttributeError`` inside a kernel.
"""

from __future__ import annotations

import functools

import jax

from jaxnorm.backends._kernel_common import find_submodule, lookup

__all__ = ["cdiv", "compiler_params", "ds", "load", "missing", "next_power_of_2",
           "pallas_call", "program_id", "store"]

#: The JAX releases the kernels were run with (the oldest supported, the newest tried on a GPU).
KNOWN = "jax 0.8.1 to 0.11.2"
_TRITON = "jax.experimental.pallas.triton"


@functools.cache
def missing() -> str | None:
  """Why this JAX cannot run the Triton kernels (a phrase naming its version), or None.

  Asks :func:`jaxnorm.backends._kernel_common.find_submodule`, which imports no Pallas and
  finds the module absent where it or Pallas is blocked. Cached: the answer does not change
  within a process.
  """
  if find_submodule("jax.experimental.pallas", "triton") is not None:
    return None
  return (f"jax {jax.__version__}'s Pallas has no Triton backend ({_TRITON}; deprecated in "
          f"jax 0.11.0); the kernels run with {KNOWN}")


# The first of the names a module has; else a RuntimeError naming the JAX version.
_find = functools.partial(lookup, who="jaxnorm's Pallas kernels",
                          tail=f"they are known to work with {KNOWN}. Use impl='xla', or a JAX "
                               f"release in that range.")


@functools.cache
def _api() -> dict:
  """The Pallas names the kernels use, imported and looked up on first use."""
  why = missing()
  if why is not None:
    raise RuntimeError(f"jaxnorm's Pallas kernels cannot run: {why}. Use impl='xla'.")
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu
  return {
      "pallas_call": _find(pl, ("pallas_call",), "pallas_call"),
      "program_id": _find(pl, ("program_id",), "program_id"),
      "cdiv": _find(pl, ("cdiv",), "cdiv"),
      "next_power_of_2": _find(pl, ("next_power_of_2",), "next_power_of_2"),
      "ds": _find(pl, ("ds",), "ds (a dynamic slice of a ref)"),
      "load": _find(plgpu, ("load",), "the Triton backend's masked load"),
      "store": _find(plgpu, ("store",), "the Triton backend's masked store"),
      "CompilerParams": _find(plgpu, ("CompilerParams", "TritonCompilerParams"),
                              "the Triton compiler parameters"),
  }


def pallas_call(*args, **kwargs):
  """``pl.pallas_call``."""
  return _api()["pallas_call"](*args, **kwargs)


def program_id(axis: int):
  """``pl.program_id``: this program's index along the grid axis ``axis``."""
  return _api()["program_id"](axis)


def cdiv(a, b):
  """``pl.cdiv``: ``ceil(a / b)``."""
  return _api()["cdiv"](a, b)


def next_power_of_2(n):
  """``pl.next_power_of_2``."""
  return _api()["next_power_of_2"](n)


def ds(start, size):
  """``pl.ds``: the dynamic slice ``[start, start + size)`` of a ref."""
  return _api()["ds"](start, size)


def load(ref, *, mask, other):
  """Masked load of ``ref`` (a ``ref.at[...]`` view): ``other`` where ``mask`` is False."""
  return _api()["load"](ref, mask=mask, other=other)


def store(ref, value, *, mask):
  """Masked store of ``value`` into ``ref`` (a ``ref.at[...]`` view)."""
  _api()["store"](ref, value, mask=mask)


def compiler_params(*, num_warps: int, num_stages: int):
  """The Triton compiler parameters (they select the Triton lowering, not Mosaic GPU)."""
  return _api()["CompilerParams"](num_warps=num_warps, num_stages=num_stages)
