"""Internal API: every Pallas name the kernels use, fenced in one module.

Pallas is experimental and its API moves between JAX releases (the Triton ``CompilerParams``
were ``TritonCompilerParams`` before jax 0.7; masked ``load``/``store`` live in the Triton
backend's module). The kernel modules (:mod:`~jaxnorm.backends.triton.common`,
:mod:`~jaxnorm.backends.triton.forward`, :mod:`~jaxnorm.backends.triton.backward`) import Pallas
through this module only, as the rest of the package reaches JAX internals through
:mod:`jaxnorm._jax_compat`; a JAX whose Pallas lacks a name fails here, when a kernel is first
traced, with a ``RuntimeError`` naming the JAX version and what is missing, instead of an
``AttributeError`` inside a kernel. Importing it imports ``jax.experimental.pallas``: only
:func:`jaxnorm.backends.triton.backend.kernels` and the checked kernel API do.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["cdiv", "compiler_params", "ds", "load", "next_power_of_2", "pallas_call",
           "program_id", "store"]


def _find(module, names: tuple[str, ...], what: str):
  """The first of ``names`` that ``module`` has; ``RuntimeError`` if it has none."""
  for name in names:
    if hasattr(module, name):
      return getattr(module, name)
  raise RuntimeError(
      f"jaxnorm's Pallas kernels do not know where jax {jax.__version__} keeps {what} (looked "
      f"for {', '.join(f'{module.__name__}.{n}' for n in names)}); they are known to work with "
      f"jax 0.8.1 to 0.10.x. Use impl='xla', or a JAX release in that range.")


pallas_call = _find(pl, ("pallas_call",), "pallas_call")
program_id = _find(pl, ("program_id",), "program_id")
cdiv = _find(pl, ("cdiv",), "cdiv")
next_power_of_2 = _find(pl, ("next_power_of_2",), "next_power_of_2")
ds = _find(pl, ("ds",), "ds (a dynamic slice of a ref)")
_load = _find(plgpu, ("load",), "the Triton backend's masked load")
_store = _find(plgpu, ("store",), "the Triton backend's masked store")
_CompilerParams = _find(plgpu, ("CompilerParams", "TritonCompilerParams"),
                        "the Triton compiler parameters")


def load(ref, *, mask, other):
  """Masked load of ``ref`` (a ``ref.at[...]`` view): ``other`` where ``mask`` is False."""
  return _load(ref, mask=mask, other=other)


def store(ref, value, *, mask):
  """Masked store of ``value`` into ``ref`` (a ``ref.at[...]`` view)."""
  _store(ref, value, mask=mask)


def compiler_params(*, num_warps: int, num_stages: int):
  """The Triton compiler parameters (they select the Triton lowering, not Mosaic GPU)."""
  return _CompilerParams(num_warps=num_warps, num_stages=num_stages)
