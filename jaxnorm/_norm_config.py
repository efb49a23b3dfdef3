"""Internal API: the one static description of a norm call, :class:`NormConfig`.

Built once per call by :func:`jaxnorm.ops.norm.args.prepare` (plain ops, layers, models, the
Jacobian) or :func:`jaxnorm.ops.norm.args.prepare_add` (the residual add + norm ops), validated
there, and trusted everywhere below: the backends (:mod:`jaxnorm.backends.table`: the XLA formulas
of :mod:`jaxnorm.backends.xla.formulas`, the kernel launches, which derive their
:class:`jaxnorm.backends.triton.common.KernelSpec` from it) and the differentiation rules
(:mod:`jaxnorm.ops.norm.rules`). A residual add + norm call is the same description with
:attr:`add` set. Hashable: it is a static argument of ``jax.custom_jvp`` and a parameter of the
tangent primitive. Imports nothing of jaxnorm but :mod:`jaxnorm._casting` and the op declarations
(the kernel backend's config is carried, not imported).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxnorm._casting import CastPlan, cast_plan
from jaxnorm._norm_ops import NormOp


@dataclasses.dataclass(frozen=True)
class AddConfig:
  """The residual add of an add + norm call, :math:`h = x + \\alpha r` (``NormConfig.add``)."""

  residual_scale: float  # alpha in h = x + alpha * residual.
  h_dtype: Any  # dtype h is stored in (residual_dtype).
  x_dtype: Any  # dtype of x (its cotangent's dtype).
  residual_dtype: Any  # dtype of the residual input (its cotangent's dtype).
  x_vma: frozenset  # mesh axes x varies over inside shard_map.
  residual_vma: frozenset  # mesh axes residual varies over inside shard_map.


@dataclasses.dataclass(frozen=True)
class NormConfig:
  """Static configuration of one call (hashable; a ``nondiff_argnums`` value)."""

  op: NormOp  # The op's declaration: jaxnorm._norm_ops.LAYER_NORM or RMS_NORM (OPS[name].decl).
  epsilon: float  # Python float >= 0.
  epsilon_placement: str  # "inside": rsqrt(v + eps). "outside": 1 / (sqrt(v) + eps).
  zero_centered_scale: bool  # gamma = 1 + scale instead of scale.
  axis_name: Any  # Mesh axis name(s) that split the feature axis, or None.
  axis_index_groups: Any  # Tuple of tuples, or None.
  out_dtype: Any  # NumPy dtype of y.
  bias_dtype: Any  # NumPy dtype of bias (for its cotangent), or None when there is no bias.
  bias_shape: Any  # Shape of the prepared bias, (heads..., d) (for its cotangent), or None.
  bias_vma: frozenset  # Mesh axes bias varies over inside shard_map (empty outside).
  # A backend's name ("xla", "triton", "tpu"), or "per_platform": each platform's backend of
  # jaxnorm.backends.table.PLATFORM_BACKENDS that takes the call where the program is lowered
  # for it, XLA elsewhere (impl="auto"; decided per lowering platform).
  impl: str
  # One config per backend the call runs on besides XLA, as sorted (name, config) pairs (the
  # public backend_config=, routed by config class, or the class's default: the Triton
  # backend's PallasConfig, the TPU backend's TpuConfig), set by jaxnorm.ops.norm.args.prepare
  # on every call (jaxnorm.backends.table.call_config); () for XLA. The dispatch hands each
  # backend its own config alone as backend_config (jaxnorm.backends.table.run).
  backend_config: Any = ()
  cast: CastPlan | None = None  # The affine stage's dtypes (casting=); None: "float32".
  add: AddConfig | None = None  # The residual add of add_layer_norm/add_rms_norm, or None.
  # Sizes of the per-head axes of scale/bias (x's axes just before the normalized ones that the
  # parameters also span); () when they are shared by every row. See :func:`_norm_args.flat_params`.
  heads: tuple = ()
  # The op's own options (NormOp.options) as sorted (name, value) pairs, each checked once
  # (e.g. LayerNorm's ("use_fast_variance", False)). Read with :meth:`option`.
  options: tuple = ()

  def option(self, name: str):
    """The value of the op's option ``name`` (see :class:`jaxnorm._norm_ops.Option`)."""
    return dict(self.options)[name]

  def plan(self, x_dtype) -> CastPlan:
    """The :class:`CastPlan` of this call (``"float32"`` when none was set)."""
    return self.cast if self.cast is not None else cast_plan("float32", x_dtype)

  @property
  def has_add(self) -> bool:
    """Whether this is a residual add + norm call (outputs ``y`` and ``h``)."""
    return self.add is not None

  @property
  def h_dtype(self):
    """The dtype of ``h`` (residual add + norm calls only)."""
    return self.add.h_dtype

  @property
  def residual_scale(self) -> float:
    """alpha of the residual add (residual add + norm calls only)."""
    return self.add.residual_scale
