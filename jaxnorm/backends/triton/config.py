r"""The launch configuration of the Pallas kernels, and whether they can run a call.

Light on purpose: no ``jax.experimental.pallas`` import, so deciding ``impl``
(:func:`jaxnorm.backends.table.resolve_impl`) costs nothing. The kernels take their block sizes from
:func:`block_config`, the one place that decides them (a per-device tuned table goes there),
unless a :class:`PallasConfig` carries a :class:`BlockConfig` of its own; :func:`supported` says
whether the kernels can run a call, with the dtype and backend rule of :func:`kernel_problem`
(:data:`KERNEL_DTYPES`, and :data:`GPU_BACKENDS`, the backend names the Triton kernels compile
for: the Pallas checks live in their backend). :data:`GPU_PLATFORMS` are the
lowering-platform names of the same GPUs. Public here (re-exported by
:mod:`jaxnorm`): :class:`PallasConfig`, :class:`BlockConfig`, :func:`default_block_config`,
:func:`pallas_compiles_on`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from jaxnorm.backends.triton import compat

__all__ = [
    "GPU_BACKENDS",
    "GPU_PLATFORMS",
    "KERNEL_DTYPES",
    "BlockConfig",
    "PallasConfig",
    "block_config",
    "default_block_config",
    "gated_refusal",
    "kernel_problem",
    "pallas_compiles_on",
    "supported",
]

#: What the Triton kernels take: the input/parameter dtypes, and the JAX backends they compile
#: for (interpret mode runs them anywhere).
KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
GPU_BACKENDS = ("gpu", "cuda", "rocm")
#: The lowering platforms (``jax.export`` / ``lax.platform_dependent`` names) the kernels run on.
GPU_PLATFORMS = ("cuda", "rocm")

# Columns one program holds at once: a row of 8192 float32 values is 32 KiB of registers across
# the program's threads; wider rows loop over column blocks.
MAX_BLOCK_D = 8192
# Elements of one (block_rows, block_d) tile that the heuristic aims for with short rows, so a
# program has enough independent loads in flight.
TARGET_TILE = 4096
MAX_BLOCK_ROWS = 64
# Columns per program in the parameter-reduction kernel, and rows of partials per step.
REDUCE_BLOCK_D = 256
REDUCE_BLOCK_ROWS = 32


def pallas_compiles_on(backend: str | None = None) -> bool:
  """Whether the Pallas (Triton) kernels compile on ``backend`` (default: JAX's default backend).

  True for the GPU backends (:data:`GPU_BACKENDS`); elsewhere run them with
  ``PallasConfig(interpret=True)``. False everywhere on a JAX whose Pallas has no Triton backend
  (:func:`jaxnorm.backends.triton.compat.missing`).
  """
  if compat.missing() is not None:
    return False
  return (jax.default_backend() if backend is None else backend) in GPU_BACKENDS


def _next_power_of_2(n: int) -> int:
  """The smallest power of two >= ``n`` (1 for ``n <= 1``), as ``pl.next_power_of_2``."""
  return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
  """``ceil(a / b)`` for positive ints, as ``pl.cdiv``."""
  return -(-a // b)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  """Launch configuration of the kernels for one (rows, d, dtype, device).

  Attributes:
    block_d: columns of a tile (a power of two, ``>= d`` unless the kernels loop).
    num_col_blocks: ``cdiv(d, block_d)``; more than one means the column loop.
    block_rows: rows of a tile (a power of two).
    num_warps: Triton warps per program (32 threads each).
    num_stages: Triton software-pipelining depth of the loops over row tiles / column blocks.
    bwd_block_rows, bwd_num_warps, bwd_num_stages: the same three settings for the backward dx
      kernel (None: the forward's).
    bwd_programs: programs of the backward dx kernel; each owns one row of the float32
      ``(bwd_programs, d)`` partial sums of ``dscale``/``dbias``.
    reduce_block_d: columns per program of the partial-sum reduction kernel.
    reduce_block_rows: partial rows the reduction kernel adds per step.
  """

  block_d: int
  num_col_blocks: int
  block_rows: int
  num_warps: int
  bwd_programs: int
  reduce_block_d: int
  reduce_block_rows: int
  num_stages: int = 1
  bwd_block_rows: int | None = None
  bwd_num_warps: int | None = None
  bwd_num_stages: int | None = None


@dataclasses.dataclass(frozen=True)
class PallasConfig:
  """How ``impl="pallas"`` (or "auto" when it picks the kernels) runs the Pallas kernels.

  Passed to the ops as ``pallas=``; hashable, part of the op's static configuration.

  Attributes:
    interpret: run the kernels in Pallas interpret mode (any backend, slowly: for tests and
      for checking the kernels on a CPU). With ``impl="pallas"`` off a GPU this is required.
    block: a :class:`BlockConfig` to launch the kernels with instead of the heuristic of
      :func:`block_config` (for tuning); None: the heuristic.

  Example:
    >>> import jax.numpy as jnp, jaxnorm
    >>> y = jaxnorm.rms_norm(jnp.ones((4, 8)), impl="pallas",
    ...                      pallas=jaxnorm.PallasConfig(interpret=True))
  """

  interpret: bool = False
  block: BlockConfig | None = None

  def __post_init__(self):
    if not isinstance(self.interpret, bool):
      raise TypeError(f"PallasConfig.interpret must be a bool, got {self.interpret!r}.")
    if self.block is not None and not isinstance(self.block, BlockConfig):
      raise TypeError(f"PallasConfig.block must be a BlockConfig or None, got "
                      f"{type(self.block).__name__}; start from jaxnorm.default_block_config("
                      f"rows, d, dtype) and dataclasses.replace it.")


@functools.lru_cache(maxsize=256)
def block_config(rows: int, d: int, dtype: Any, device_kind: str = "",
                 core_count: int | None = None) -> BlockConfig:
  r"""The block-size heuristic of every kernel in this module (cached per key).

  * ``block_d = min(next_pow2(d), MAX_BLOCK_D)``: the whole row in registers when it fits.
  * ``block_rows = clamp(TARGET_TILE // block_d, 1, MAX_BLOCK_ROWS)``, at most
    ``next_pow2(rows)``: short rows are batched so a tile has about 4096 elements.
  * ``num_warps = clamp(block_rows * block_d // 1024, 1, 4)``: about 32 elements per thread,
    at most 4 warps (more warps or more rows per program did not help on an H100).
  * ``bwd_num_warps = 4`` up to 4096 elements per tile, 16 above: the backward keeps four
    tile-sized float32 arrays live, which spill with 4 warps at d = 8192.
  * ``bwd_programs = min(row_tiles, 2 * core_count)``: two programs per SM keep enough loads
    in flight, and the float32 partial sums they write and the reduction reads back add
    ``16 P / (3 rows itemsize)`` to the backward's traffic for LayerNorm (half for RMSNorm); at
    most 8 programs where the device does not report its core count (interpret mode on a CPU).

  The measurements behind these rules are in ``docs/perf-notes.md`` ("The kernels' block
  rules").

  ``dtype`` and ``device_kind`` are part of the cache key so that a per-device or per-dtype
  table (e.g. from autotuning on a GPU) can replace the rules above without changing callers.

  Args:
    rows: number of rows (tokens) of ``x: (rows, d)``.
    d: feature size.
    dtype: dtype of ``x``.
    device_kind: ``jax.Device.device_kind`` of the device that runs the kernels.
    core_count: number of SMs (``jax.Device.core_count`` on a GPU), or None.

  Returns:
    The :class:`BlockConfig`.
  """
  del dtype, device_kind  # One set of rules so far (measured on an H100 only).
  block_d = min(_next_power_of_2(d), MAX_BLOCK_D)
  block_rows = max(1, min(TARGET_TILE // block_d, MAX_BLOCK_ROWS, _next_power_of_2(rows)))
  num_warps = max(1, min(block_rows * block_d // 1024, 4))
  # The backward holds x, dy, x_hat and g of a tile: past 4096 elements, 4 warps spill.
  bwd_num_warps = 4 if block_rows * block_d <= 4096 else 16
  row_tiles = _cdiv(rows, block_rows)
  max_programs = 2 * core_count if core_count else 8
  return BlockConfig(
      block_d=block_d,
      num_col_blocks=_cdiv(d, block_d),
      block_rows=block_rows,
      num_warps=num_warps,
      bwd_programs=max(1, min(row_tiles, max_programs)),
      reduce_block_d=min(REDUCE_BLOCK_D, _next_power_of_2(d)),
      reduce_block_rows=REDUCE_BLOCK_ROWS,
      bwd_num_warps=bwd_num_warps,
  )


def default_block_config(rows: int, d: int, dtype) -> BlockConfig:
  """:func:`block_config` for ``x: (rows, d)`` of ``dtype`` on the default device."""
  device = jax.devices()[0]
  core_count = getattr(device, "core_count", None) if device.platform in GPU_BACKENDS else None
  return block_config(rows, d, jnp.dtype(dtype).name, str(getattr(device, "device_kind", "")),
                      core_count)


def supported(x_shape, dtype, *, backend: str | None = None) -> tuple[bool, str]:
  """Whether the kernels can run ``x: (rows, d)`` of ``dtype``, and why not if they cannot.

  Args:
    x_shape: shape of the 2-D input ``(rows, d)``.
    dtype: dtype of the input.
    backend: if given (e.g. ``jax.default_backend()``), also check that it can compile the
      kernels (a GPU); None skips that check (interpret mode runs anywhere).

  Returns:
    ``(True, "")`` or ``(False, reason)``.
  """
  shape = tuple(x_shape)
  if len(shape) != 2:
    return False, f"the kernels take a 2-D input (rows, d), got shape {shape}"
  if shape[0] == 0 or shape[1] == 0:
    return False, f"the input is empty (shape {shape})"
  reason = kernel_problem(dtypes=(("x", dtype),), backend=backend)
  return (False, reason) if reason is not None else (True, "")


def gated_refusal(d: int, group_size: int | None, dtype) -> str | None:
  """Why the gated kernels cannot take rows of ``d`` features in groups of ``group_size``.

  Args:
    d: the feature size (the trailing axis of ``x`` and ``z``).
    group_size: features per group, or None for one group of ``d``.
    dtype: the dtype the inputs (``x``, ``z``, ``scale``) promote to, or one input's: float32,
      bfloat16 or float16 are taken (the op has refused 8-bit floats before; any float64 input
      promotes to float64, refused here).

  Returns:
    The reason (a phrase without a final period), or None when the kernels can run the call.
    Any group size that divides ``d`` is taken (widths that are not powers of two are masked,
    groups wider than one block loop over column blocks).
  """
  if not isinstance(d, int) or isinstance(d, bool) or d < 1:
    return f"the gated kernels need a positive feature size d, got {d!r}"
  if group_size is not None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
      return f"the gated kernels need a positive int group_size, got {group_size!r}"
    if d % group_size:
      return (f"the gated kernels need group_size to divide the feature size: "
              f"{d} % {group_size} = {d % group_size}")
  try:
    dt = jnp.dtype(dtype)
  except TypeError:
    return f"the gated kernels take float32, bfloat16 or float16 inputs, got {dtype!r}"
  return kernel_problem(dtypes=(("inputs", dt),))


def kernel_problem(*, dtypes: Sequence[tuple[str, Any]] = (), backend: str | None = None
                   ) -> str | None:
  """Why the Pallas kernels cannot take these dtypes or run on ``backend``; None if they can.

  The one statement of what the kernels support, read by every caller that decides or checks
  ``impl="triton"`` (the backend's refusals, the fused ops' :meth:`add_refusal`,
  :func:`supported`, the lowering's platform check, the checked kernel API), which wrap the
  reason in their own error.

  Args:
    dtypes: ``(argument name, dtype)`` pairs; each must be one of :data:`KERNEL_DTYPES`.
    backend: a JAX backend name, or None not to check it (interpret mode runs anywhere).

  Returns:
    The reason (a phrase without a final period), or None.
  """
  for name, dtype in dtypes:
    dt = jnp.dtype(dtype)
    if dt not in KERNEL_DTYPES:
      return f"the Pallas kernels take float32, bfloat16 or float16 {name}, got {dt.name}"
  if backend is not None and backend not in GPU_BACKENDS:
    return (f"the Pallas kernels need a GPU (Triton backend) and the backend is {backend!r}; "
            f"run them in interpret mode elsewhere (slowly, for testing): "
            f"pallas=jaxnorm.PallasConfig(interpret=True) for the ops and layers, "
            f"interpret=True for the kernel functions")
  return None
