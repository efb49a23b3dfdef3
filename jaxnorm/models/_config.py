r"""The configuration of :class:`jaxnorm.models.TransformerLM`: its switches and their checks.

:class:`TransformerConfig` holds every size and switch of the model (validated when it is
built); :func:`deepnorm_alpha_beta` gives DeepNet's constants for a decoder-only stack,

.. math::

   \alpha = (2L)^{1/4}, \qquad \beta = (8L)^{-1/4}.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxnorm import _validation as v
from jaxnorm._casting import CASTINGS
from jaxnorm.ops.table import NORM_FAMILY, POINTWISE_FAMILY, layer_replacements, names

NORM_POSITIONS = ("pre", "post", "sandwich", "deepnorm")
# OPS' one-input ops at import: "layer_norm", "rms_norm", "dyt", "derf". A config checks its
# norm_type and qk_norm against the table itself, so an op registered later is accepted too.
NORM_TYPES = layer_replacements()
NORM_IMPLS = ("jaxnorm", "flax")
INITS = ("xavier", "small")
POSITIONS = ("learned", "rotary")
DTYPES = ("float32", "bfloat16", "float16", "float64")
ACTIVATIONS = ("gelu", "relu")
QK_NORMS = ("none",) + NORM_TYPES  # "none", or an op named as NORM_TYPES
QK_NORM_SCALES = ("per_head", "shared")
# Keys of :func:`block_weight_paths`, in the order of a block's forward pass.
WEIGHT_GROUPS = ("attn_qkv", "attn_out", "mlp_in", "mlp_out")


def _check_memory_efficient(config) -> None:
  """``norm_memory_efficient``: a bool, and True only where it applies (ValueError naming why)."""
  if not v.check_bool("norm_memory_efficient", config.norm_memory_efficient):
    return
  has_layer = bool({config.norm_type, config.qk_norm} & set(names(NORM_FAMILY)))
  refusals = (
      (config.norm_impl == "flax", "norm_impl='flax' (Flax's norms have no such option)"),
      (config.fuse_residual_norm, "fuse_residual_norm=True (the fused add + norm keeps h)"),
      (not has_layer, f"no LayerNorm/RMSNorm layer (norm_type={config.norm_type!r}, "
                      f"qk_norm={config.qk_norm!r})"),
  )
  for refused, why in refusals:
    if refused:
      raise ValueError(f"norm_memory_efficient=True does not apply with {why}; set it to False.")


def _check_pointwise_alpha(value: Any) -> tuple[float, float]:
  """``pointwise_alpha`` as two Python floats (attention, other)."""
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"pointwise_alpha must be a pair (attention, other) of floats, got "
                    f"{value!r}.")
  return tuple(v.check_finite_real("pointwise_alpha", a) for a in value)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of :class:`TransformerLM` (validated on construction).

  Attributes:
    vocab_size: number of token ids (256: byte-level).
    max_len: longest sequence the model accepts (size of the learned position table).
    d_model: width of the residual stream.
    n_layers: number of Transformer blocks :math:`L`.
    n_heads: attention heads; must divide ``d_model``.
    d_ff: hidden width of the MLP.
    norm_position: ``"pre"``, ``"post"``, ``"sandwich"`` or ``"deepnorm"`` (module docstring).
    norm_type: an op of :data:`jaxnorm.OPS`: ``"layer_norm"``, ``"rms_norm"``, or the
      normalization-free ``"dyt"`` (:class:`jaxnorm.nnx.DyT`) or ``"derf"``
      (:class:`jaxnorm.nnx.Derf`), used in every position a norm takes (``epsilon`` and
      ``casting`` do not apply to them; ``norm_impl="flax"`` has no such layer).
    pointwise_alpha: the initial :math:`\alpha` of DyT/Derf layers as ``(attention, other)``:
      the first for the norms of the attention sub-block (and the QK norms), the second for
      the MLP's and the final one, the split of DyT's LLM guidance (Zhu et al. 2025, Sec. 7.2,
      Tables 10-11: 1.0/1.0 at width 1024, 0.8/0.2 at 4096); default ``(0.5, 0.5)``, both
      papers' default.
    norm_impl: ``"jaxnorm"`` (custom VJP, :mod:`jaxnorm.nnx`) or ``"flax"`` (Flax's modules).
    norm_memory_efficient: the LayerNorm/RMSNorm layers keep their output instead of their
      input for the backward (:func:`jaxnorm.layer_norm`'s ``memory_efficient``); needs
      ``norm_impl="jaxnorm"``, ``fuse_residual_norm=False`` (the fused add + norm keeps ``h``)
      and such a layer in the model; default False.
    init: ``"xavier"`` (Xiong et al.) or ``"small"`` (GPT-2, N(0, 0.02)).
    qk_zero_init: start with :math:`W^Q = W^K = 0` (uniform attention at init).
    positions: ``"learned"`` absolute position embeddings or ``"rotary"`` (RoPE on q and k).
    epsilon: the normalization epsilon: a finite number >= 0 (a Python or NumPy scalar) within
      the range of the statistics of ``dtype`` (at most 4.3e37 below float64), checked by the
      ops' rules and stored as a Python float.
    dtype: compute dtype name (parameters are always float32).
    fuse_residual_norm: run every residual add that is followed by a norm as one fused
      add+norm op (same values; one pass over memory instead of two). Applies to the jaxnorm
      modules; Flax's modules (``norm_impl="flax"``) have no fused op, so there the add and
      the norm always run separately.
    activation: the MLP non-linearity, ``"gelu"`` or ``"relu"`` (Xiong et al.'s theory
      setting uses ReLU).
    casting: order of casts of the jaxnorm norms' affine stage, ``"float32"`` (one rounding),
      ``"llama"`` (HF ``LlamaRMSNorm``) or ``"t5"`` (``docs/modules.md``, "Casting modes").
      Flax's modules (``norm_impl="flax"``) have no such option: only ``"float32"`` there.
    embed_scale: multiplies the model input :math:`h_0 = s\\,(E[\text{tokens}] + P)`. With
      ``init="xavier"`` and learned positions, :math:`E\\|h_0\\|^2/d = 2 s^2` at
      initialization, so ``embed_scale = 2 ** -0.5`` gives the unit-variance input of the
      theory setting.
    scan_layers: run the blocks as one ``jax.lax.scan`` over their stacked parameters (one
      traced and compiled block body, so compile time does not grow with depth); ``False``
      unrolls the same computation over the same parameters in a Python loop (a reference,
      and XLA can fuse across layers). Both give the same values to float round-off.
    qk_norm: normalize every head's query and key over the head dimension after their
      projections and before the rotary embedding (as Qwen3 and OLMo 2 do): ``"none"``, or
      an op of :data:`jaxnorm.OPS` as ``norm_type`` names one (``"rms_norm"``,
      ``"layer_norm"``, ``"dyt"``, ``"derf"``). With learned positions, which are added to the
      model input, the norm acts on the projected queries and keys directly. The same
      ``norm_impl``, ``epsilon``, ``dtype`` and ``casting`` as the other norms (``"dyt"`` and
      ``"derf"`` take ``pointwise_alpha``'s first value and no ``epsilon`` or ``casting``).
    qk_norm_scale: ``"per_head"``: one learned scale (and bias: LayerNorm, DyT, Derf) per head
      and feature, Flax's spelling ``feature_axes=(-2, -1), reduction_axes=-1`` with a parameter
      of shape ``(n_heads * head_dim,)``; ``"shared"``: one ``(head_dim,)`` scale shared by
      every head (as Hugging Face's Qwen3 and Gemma 3 do; OLMo 2 normalizes the whole
      ``(n_heads * head_dim)`` projection at once, which neither option reproduces). DyT's and
      Derf's scalar ``alpha`` (and Derf's ``shift``) is one per layer either way.
    norm_scaling: multiply the output of each block's input norms in layer :math:`l`
      (1-indexed) by :math:`1/\\sqrt{l}` (LayerNorm Scaling, Sun et al. 2025, "The Curse of
      Depth in Large Language Models"): Pre-LN and Sandwich only (the input norms; the
      Sandwich output norms, the QK norms and the final norm are not scaled).
  """

  vocab_size: int = 256
  max_len: int = 128
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  d_ff: int = 512
  norm_position: str = "pre"
  norm_type: str = "layer_norm"
  norm_impl: str = "jaxnorm"
  init: str = "xavier"
  qk_zero_init: bool = False
  positions: str = "learned"
  epsilon: float = 1e-6
  dtype: str = "float32"
  fuse_residual_norm: bool = True
  activation: str = "gelu"
  embed_scale: float = 1.0
  scan_layers: bool = True
  casting: str = "float32"
  qk_norm: str = "none"
  qk_norm_scale: str = "per_head"
  norm_scaling: bool = False
  pointwise_alpha: tuple = (0.5, 0.5)
  norm_memory_efficient: bool = False

  def __post_init__(self):
    for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "d_ff"):
      v.check_positive_int(name, getattr(self, name))
    v.check_choice("norm_position", self.norm_position, NORM_POSITIONS)
    v.check_choice("norm_type", self.norm_type, layer_replacements())
    v.check_choice("norm_impl", self.norm_impl, NORM_IMPLS)
    v.check_choice("init", self.init, INITS)
    v.check_choice("positions", self.positions, POSITIONS)
    v.check_choice("dtype", self.dtype, DTYPES)
    v.check_choice("activation", self.activation, ACTIVATIONS)
    v.check_choice("casting", self.casting, CASTINGS)
    v.check_choice("qk_norm", self.qk_norm, ("none",) + layer_replacements())
    v.check_choice("qk_norm_scale", self.qk_norm_scale, QK_NORM_SCALES)
    v.check_bool("norm_scaling", self.norm_scaling)
    object.__setattr__(self, "pointwise_alpha", _check_pointwise_alpha(self.pointwise_alpha))
    pointwise = {self.norm_type, self.qk_norm} & set(names(POINTWISE_FAMILY))
    _check_memory_efficient(self)
    if pointwise and self.norm_impl == "flax":
      raise ValueError(f"norm_impl='flax' has no {sorted(pointwise)} layer (norm_type="
                       f"{self.norm_type!r}, qk_norm={self.qk_norm!r}; Flax ships none); use "
                       f"norm_impl='jaxnorm'.")
    if self.norm_scaling and self.norm_position not in ("pre", "sandwich"):
      raise ValueError(
          f"norm_scaling=True scales the block's input norms (Sun et al. 2025 define it for "
          f"Pre-LN); it needs norm_position 'pre' or 'sandwich', got {self.norm_position!r}.")
    if self.casting != "float32" and self.norm_impl == "flax":
      raise ValueError(f"casting={self.casting!r} needs norm_impl='jaxnorm' (Flax's norms round "
                       f"once, as casting='float32'); got norm_impl='flax'.")
    if isinstance(self.embed_scale, bool) or not isinstance(self.embed_scale, (int, float)):
      raise TypeError(f"embed_scale must be a Python float, got {type(self.embed_scale).__name__} "
                      f"{self.embed_scale!r}.")
    if not math.isfinite(self.embed_scale) or self.embed_scale <= 0:
      raise ValueError(f"embed_scale must be a finite float > 0, got {self.embed_scale!r}.")
    if not isinstance(self.qk_zero_init, bool):
      raise TypeError(f"qk_zero_init must be a bool, got {type(self.qk_zero_init).__name__}.")
    if not isinstance(self.scan_layers, bool):
      raise TypeError(f"scan_layers must be a bool, got {type(self.scan_layers).__name__}.")
    if not isinstance(self.fuse_residual_norm, bool):
      raise TypeError(f"fuse_residual_norm must be a bool, got "
                      f"{type(self.fuse_residual_norm).__name__}.")
    if self.d_model % self.n_heads:
      raise ValueError(
          f"n_heads={self.n_heads} must divide d_model={self.d_model}; pick e.g. "
          f"n_heads={math.gcd(self.d_model, self.n_heads)}."
      )
    if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
      raise ValueError(
          f"positions='rotary' needs an even head size, got d_model/n_heads = "
          f"{self.d_model}/{self.n_heads} = {self.d_model // self.n_heads}."
      )
    # The ops' rules (and what they accept, e.g. np.float32(1e-6)), stored as a Python float;
    # within the range of the statistics of the compute dtype, checked here before any call.
    object.__setattr__(self, "epsilon", v.check_epsilon(self.epsilon))
    v.check_epsilon_range(self.epsilon, self.dtype)

  @property
  def head_dim(self) -> int:
    """Size of one attention head, ``d_model // n_heads``."""
    return self.d_model // self.n_heads

  @property
  def fused(self) -> bool:
    """Whether the residual adds run fused with the norms (``fuse_residual_norm`` and jaxnorm)."""
    return self.fuse_residual_norm and self.norm_impl == "jaxnorm"


def deepnorm_alpha_beta(n_layers: int) -> tuple[float, float]:
  r"""DeepNet's residual up-weighting and initialization down-scaling for a decoder-only model.

  .. math::

     \alpha = (2L)^{1/4}, \qquad \beta = (8L)^{-1/4}

  (Wang et al., 2022, "DeepNet: Scaling Transformers to 1,000 Layers", decoder-only column).

  Args:
    n_layers: the number of blocks :math:`L` (>= 1).

  Returns:
    ``(alpha, beta)`` as Python floats.
  """
  v.check_positive_int("n_layers", n_layers)
  return (2.0 * n_layers) ** 0.25, (8.0 * n_layers) ** -0.25


# ----------------------------------------------------------------------------------------------
# Initializers.
