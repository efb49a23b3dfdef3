r"""Internal API: what the forward and backward Pallas kernels share.

Used by :mod:`jaxnorm.backends.triton.forward`, :mod:`jaxnorm.backends.triton.backward` and the
callers that launch them (:mod:`jaxnorm.backends.triton.backend`, ``tests/_kernel_api.py``). Names
without a leading underscore are the package's internal API. Everything here trusts its arguments:
they were checked once, by the public op or by the tests' checked kernel API.

A tile is ``block_rows`` rows by ``block_d`` columns of the ``(rows, d)`` input, loaded masked
and promoted to float32; rows wider than one block loop over column blocks (:func:`col_loop`).
The effective scale is :math:`\gamma = s` or :math:`1 + s` (``zero_centered_scale``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax import lax
import jax.numpy as jnp
import numpy as np
from jaxnorm.backends.triton import compat as pl

from jaxnorm import _math
from jaxnorm._casting import cast_plan
from jaxnorm.backends.triton.config import BlockConfig, default_block_config


_F32_PLAN = cast_plan("float32", jnp.float32)  # every stage in float32: nothing rounds


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """Static configuration of one kernel launch (hashable: it parametrizes the jitted launches)."""

  rows: int
  d: int
  center: bool  # LayerNorm (True) or RMSNorm (False).
  has_scale: bool
  has_bias: bool  # forward: add a bias; backward: produce dbias.
  epsilon: float
  outside: bool  # epsilon_placement == "outside".
  zero_centered_scale: bool
  block: BlockConfig
  residual_scale: float = 1.0  # alpha of the residual add (the add_norm kernels only).
  # casting= (jaxnorm._casting.CastPlan): where the affine stage rounds; None for "float32".
  cast: Any = None
  op: str = ""  # the op's name in jaxnorm.OPS (the launches' names: "jaxnorm_<op>_fwd", ...).


def kernel_spec(rows: int, d: int, dtype, *, center: bool, has_scale: bool, has_bias: bool,
                epsilon: float, epsilon_placement: str, zero_centered_scale: bool,
                residual_scale: float = 1.0, block: BlockConfig | None = None,
                cast=None, op: str = "") -> KernelSpec:
  """The :class:`KernelSpec` of a ``(rows, d)`` input; ``block`` None: the default heuristic.

  ``cast``: the call's :class:`jaxnorm._casting.CastPlan`; the "float32" mode's is stored as
  None (one spec, and one compiled kernel, for a call with and without it).
  """
  return KernelSpec(rows=rows, d=d, center=center, has_scale=has_scale, has_bias=has_bias,
                    epsilon=epsilon, outside=epsilon_placement == "outside",
                    zero_centered_scale=zero_centered_scale,
                    block=block if block is not None else default_block_config(rows, d, dtype),
                    residual_scale=residual_scale,
                    cast=None if cast == _F32_PLAN else cast, op=op)


def iota(n: int):
  """``[0, n)`` as int32 (the kernels' one index dtype, see :func:`ds`)."""
  return jnp.arange(n, dtype=jnp.int32)


def fori(n, body, init):
  """``lax.fori_loop(0, n, body, init)`` with an int32 loop index (see :func:`ds`)."""
  return lax.fori_loop(jnp.int32(0), jnp.int32(n), body, init)


def ds(start, size: int):
  """``pl.ds(start, size)`` with an int32 start, whatever ``jax_enable_x64`` says: every index
  of one load or store then has the same dtype (program ids are int32, and a Python ``0`` would
  be int64 under x64), which interpret mode's ``dynamic_slice`` requires."""
  return pl.ds(np.int32(start) if isinstance(start, int) else start.astype(jnp.int32), size)


def tile(spec: KernelSpec, row0, col0):
  """Row/column slices of one tile and its masks: (rows_ds, cols_ds, row_ok, col_ok, mask)."""
  br, bd = spec.block.block_rows, spec.block.block_d
  row_ok = row0 + iota(br) < spec.rows  # (br,)
  col_ok = col0 + iota(bd) < spec.d  # (bd,)
  mask = row_ok[:, None] & col_ok[None, :]  # (br, bd)
  return ds(row0, br), ds(col0, bd), row_ok, col_ok, mask


def load(ref, idx, mask):
  """Masked load (zeros outside the array) promoted to float32."""
  return pl.load(ref.at[idx], mask=mask, other=0.0).astype(jnp.float32)


def gamma_row(spec: KernelSpec, scale_ref, cols, col_ok):
  """The effective scale of a column block as a (1, block_d) float32 row, or None."""
  if not spec.has_scale:
    return None
  s = load(scale_ref, (cols,), col_ok)
  # Formed (and rounded) as the casting mode forms it, by the one rule of jaxnorm._casting
  # (the "float32" mode: in float32, 1 + s where the scale is zero-centred).
  return plan_of(spec).gamma_of(s, spec.zero_centered_scale)[None, :]


def plan_of(spec: KernelSpec):
  """The launch's :class:`jaxnorm._casting.CastPlan` (the all-float32 one for "float32")."""
  return spec.cast if spec.cast is not None else _F32_PLAN


def rstd(spec: KernelSpec, var):
  """The normalizer ``1/sqrt(v + eps)`` or ``1/(sqrt(v) + eps)`` (:func:`jaxnorm._math.rstd`)."""
  return _math.rstd(var, spec.epsilon, spec.outside)


def col_loop(spec: KernelSpec, body, init):
  """Folds ``body(col0, carry)`` over the column blocks (a plain call for a single block)."""
  bd = spec.block.block_d
  if spec.block.num_col_blocks == 1:
    return body(0, init)
  return fori(spec.block.num_col_blocks, lambda j, c: body(j * bd, c), init)


def compiler_params(spec: KernelSpec):
  """Triton ``CompilerParams`` (they select the Triton lowering on GPUs, not Mosaic GPU)."""
  return pl.compiler_params(num_warps=spec.block.num_warps, num_stages=spec.block.num_stages)


def backward_config(cfg: BlockConfig) -> BlockConfig:
  """``cfg`` with the backward's own rows/warps/stages (where set) in the forward's fields."""
  own = {"block_rows": cfg.bwd_block_rows, "num_warps": cfg.bwd_num_warps,
         "num_stages": cfg.bwd_num_stages}
  own = {k: val for k, val in own.items() if val is not None}
  return dataclasses.replace(cfg, bwd_block_rows=None, bwd_num_warps=None, bwd_num_stages=None,
                             **own)
