r"""The TPU kernels' configuration and launch rules: :class:`TpuConfig`, the row block, and what
the kernels take (no ``jax.experimental.pallas`` import: deciding ``impl`` costs nothing).

TPU tiling (the Pallas TPU docs, "Blocks and tiling"): the last two dimensions of a block are
multiples of the vector register's ``(sublanes, 128)`` tile or the array's own sizes. Every
kernel here blocks ``(block_rows, d)``: the whole feature axis in one block, so a row's
statistics come from one read of it, and ``block_rows`` a multiple of the dtype's sublane
count (:data:`SUBLANES`: 8 rows for 32-bit, 16 for 16-bit) or all the rows. A feature width
that is not a multiple of 128 is either the block's full width (Mosaic pads it inside VMEM)
or, with ``TpuConfig(pad_features=True)``, padded in HBM to a multiple of 128 and masked in the
kernel (:func:`padded_width`). Rows past the array in the last row block are never read into a
result: they are masked out of the parameter sums, and their stores are dropped.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

__all__ = ["DTYPES", "LANES", "MAX_D", "SUBLANES", "TARGET_TILE", "TpuConfig", "block_rows",
           "padded_width", "refusal_of_dtype", "refusal_of_shape", "vmem_limit_bytes"]

LANES = 128
#: Rows of one vector register tile by dtype size: (8, 128) for 32-bit, (16, 128) for 16-bit.
SUBLANES = {4: 8, 2: 16}
#: The dtypes the kernels take: the TPU computes in neither float16 nor float64.
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
#: Elements of one ``(block_rows, d)`` block the rule aims for: 512 KiB of float32, so the
#: backward's double-buffered blocks and float32 temporaries stay well inside the default
#: scoped VMEM (16 MiB on v5e, 32 MiB on v6e). Not measured on a TPU (docs/tpu.md).
TARGET_TILE = 128 * 1024
#: The widest row one block holds: at the minimum of 16 bfloat16 rows a 32768-wide block is
#: 2 MiB of float32 per temporary. Wider rows are refused (XLA runs them).
MAX_D = 32768
#: The scoped VMEM Mosaic gives a kernel unless asked for more (the smallest default among TPU
#: generations, v5e's 16 MiB), and the most the kernels ask for (below the physical VMEM of
#: every generation since v5e; v4 has 16 MiB in all).
DEFAULT_SCOPED_VMEM = 16 * 1024 * 1024
MAX_VMEM_LIMIT_BYTES = 48 * 1024 * 1024
#: float32 temporaries of a block the kernels hold at once (the backward: x, dy, x_hat, g, dx and
#: a product), an estimate from the kernels' code, not a measurement of Mosaic's allocation.
F32_TEMPORARIES = 6


def vmem_limit_bytes(block_rows: int, width: int, row_itemsizes) -> int | None:
  """The ``vmem_limit_bytes`` to ask Mosaic for, or None (its default) where the estimate fits
  in 3/4 of :data:`DEFAULT_SCOPED_VMEM`: every ``(block_rows, width)`` operand and result
  double-buffered (``row_itemsizes``: their itemsizes) plus :data:`F32_TEMPORARIES` float32
  blocks, times 1.5, capped at :data:`MAX_VMEM_LIMIT_BYTES`."""
  block = block_rows * width
  need = sum(2 * block * n for n in row_itemsizes) + F32_TEMPORARIES * 4 * block
  if need <= DEFAULT_SCOPED_VMEM * 3 // 4:
    return None
  return min(MAX_VMEM_LIMIT_BYTES, need * 3 // 2)


@dataclasses.dataclass(frozen=True)
class TpuConfig:
  """How ``impl="tpu"`` runs the Pallas TPU kernels (the call's ``backend_config=``).

  Hashable: part of the op's static configuration.

  Attributes:
    interpret: run the kernels in Pallas TPU interpret mode
      (``pltpu.InterpretParams()``: the grid, VMEM and the DMAs simulated on any platform;
      slow, for tests and checks on a CPU). Off a TPU without it, a call is an error.
    block_rows: rows per block instead of :func:`block_rows`'s rule (a multiple of the
      dtype's sublane count, :data:`SUBLANES`); None: the rule.
    pad_features: pad a feature width that is not a multiple of 128 with zeros in HBM and mask
      the padding in the kernel, instead of a full-width block that Mosaic pads in VMEM (one
      more copy of each ``(rows, d)`` operand and result; for a Mosaic that refuses the
      unaligned block).

  Example:
    >>> cfg = TpuConfig(interpret=True)
  """

  interpret: bool = False
  block_rows: int | None = None
  pad_features: bool = False

  def __post_init__(self):
    if not isinstance(self.interpret, bool):
      raise TypeError(f"TpuConfig.interpret must be a bool, got {self.interpret!r}.")
    if not isinstance(self.pad_features, bool):
      raise TypeError(f"TpuConfig.pad_features must be a bool, got {self.pad_features!r}.")
    br = self.block_rows
    if br is not None and (not isinstance(br, int) or isinstance(br, bool) or br < 8 or br % 8):
      raise ValueError(f"TpuConfig.block_rows must be None or a positive multiple of 8 (16 for "
                       f"16-bit inputs), got {br!r}.")


def sublanes(dtype) -> int:
  """The sublane count of ``dtype``'s vector tile (8 for 32-bit, 16 for 16-bit)."""
  return SUBLANES[jnp.dtype(dtype).itemsize]


def padded_width(d: int, pad: bool) -> int:
  """The block's width for a feature width ``d``: ``d`` itself, or the next multiple of
  :data:`LANES` with ``pad``."""
  return -(-d // LANES) * LANES if pad else d


def block_rows(rows: int, d: int, dtypes, cfg: TpuConfig) -> int:
  """Rows per block for ``(rows, d)`` operands of ``dtypes``: ``cfg.block_rows``, or
  :data:`TARGET_TILE` elements rounded down to the largest sublane count among ``dtypes``
  (at least that count); all the rows where they fit in one block (a block the array's size).

  A given ``cfg.block_rows`` must be a multiple of that sublane count (a ``ValueError``).
  """
  sub = max(sublanes(dt) for dt in dtypes)
  if cfg.block_rows is not None:
    if cfg.block_rows % sub:
      raise ValueError(f"TpuConfig.block_rows must be a multiple of {sub} for "
                       f"{'/'.join(sorted({jnp.dtype(t).name for t in dtypes}))} operands, got "
                       f"{cfg.block_rows}.")
    br = cfg.block_rows
  else:
    br = max(sub, (TARGET_TILE // padded_width(d, True)) // sub * sub)
  return rows if rows <= br else br


def refusal_of_dtype(name: str, dtype) -> str | None:
  """Why the kernels cannot take ``name`` of ``dtype`` (float32 and bfloat16 only), or None."""
  dt = jnp.dtype(dtype)
  if dt not in DTYPES:
    return (f"the TPU kernels take float32 or bfloat16 {name}, got {dt.name} (TPUs compute in "
            f"neither float16 nor float64)")
  return None


def refusal_of_shape(x2_shape) -> str | None:
  """Why the kernels cannot take ``x: (rows, d)`` (empty, or wider than :data:`MAX_D`), or None."""
  rows, d = x2_shape
  if rows == 0 or d == 0:
    return f"the input is empty (shape {tuple(x2_shape)})"
  if d > MAX_D:
    return (f"the TPU kernels hold a whole row in one VMEM block, up to {MAX_D} features, "
            f"got {d}")
  return None
