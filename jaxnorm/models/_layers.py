r"""The Transformer's layers and their helpers: initializers, norms, attention, MLP, statistics.

:mod:`jaxnorm.models._transformer` builds its blocks and the model from these. Here are

* the initializers of ``config.init`` (:func:`_weight_init`, :func:`_qkv_init`,
  :func:`_embed_std`) and the factory of every norm of the model (:func:`_make_norm`,
  :func:`_make_qk_norm`);
* :class:`CausalSelfAttention` (with the rotary embedding :func:`_rotary`) and :class:`MLP`,
  the two sub-layers :math:`F` of a block;
* what a forward pass records when collecting statistics (:class:`_Stats`) and the norm calls
  that record it (:func:`_normed`, :func:`_add_normed`; the DyT/Derf saturated fraction above
  :data:`SATURATION_ARG`).

The layout, the parameter initialization and the statistics are described in the docstring of
:mod:`jaxnorm.models._transformer`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import nnx as jaxnorm_nnx
from jaxnorm.ops.table import NORM_FAMILY, POINTWISE_FAMILY, layer_replacements, lookup
from jaxnorm.models._config import TransformerConfig


def _xavier(gain: float = 1.0):
  """Untruncated Xavier/Glorot normal with a gain: std = gain * sqrt(2 / (fan_in + fan_out))."""
  return jax.nn.initializers.variance_scaling(gain * gain, "fan_avg", "normal")


def _weight_init(config: TransformerConfig, *, gain: float = 1.0, residual: bool = False):
  """Initializer of a weight matrix for ``config.init``, times ``gain``.

  ``residual`` marks a projection into the residual stream (W^O, second MLP matrix): GPT-2
  scales those by 1/sqrt(2L) under ``init="small"`` unless DeepNorm's beta is used instead.
  """
  if config.init == "xavier":
    return _xavier(gain)
  std = 0.02 * gain
  if residual and config.norm_position != "deepnorm":
    std /= math.sqrt(2.0 * config.n_layers)
  return jax.nn.initializers.normal(std)


def _qkv_init(config: TransformerConfig, v_gain: float):
  """Initializer of the one (d, 3d) [W^Q | W^K | W^V] kernel, each part initialized alone."""
  qk_init = jax.nn.initializers.zeros if config.qk_zero_init else _weight_init(config)
  v_init = _weight_init(config, gain=v_gain)

  def init(key, shape, dtype=jnp.float32):
    d_in, d_out3 = shape
    d_out = d_out3 // 3
    kq, kk, kv = jax.random.split(key, 3)
    parts = [qk_init(kq, (d_in, d_out), dtype), qk_init(kk, (d_in, d_out), dtype),
             v_init(kv, (d_in, d_out), dtype)]
    return jnp.concatenate(parts, axis=1)

  return init


def _embed_std(config: TransformerConfig) -> float:
  return 1.0 if config.init == "xavier" else 0.02


# ----------------------------------------------------------------------------------------------
# Layers.


def _make_norm(config: TransformerConfig, rngs: nnx.Rngs, *, norm_type: str | None = None,
               num_features: int | None = None, role: str = "other", **axes) -> nnx.Module:
  """One normalization module from ``norm_type`` and ``norm_impl``.

  By default a norm of ``config.norm_type`` over the ``d_model`` features of the last axis;
  ``norm_type``, ``num_features`` and ``axes`` (``reduction_axes``/``feature_axes``, the
  layers' keywords) build the QK norms. ``role`` ("attention" or "other") picks a DyT/Derf
  layer's initial alpha from ``config.pointwise_alpha``. An op's family (:data:`jaxnorm.OPS`)
  picks the builder; a name not in the table raises a ``ValueError`` naming ``norm_type``.
  """
  op = lookup(norm_type or config.norm_type, "norm_type", among=layer_replacements())
  num_features = num_features or config.d_model
  return _NORM_BUILDERS[op.family](config, rngs, op, num_features, role, **axes)


def _make_pointwise(config, rngs, op, num_features, role, **axes) -> nnx.Module:
  """A DyT/Derf layer (``op``'s class in :mod:`jaxnorm.nnx`), alpha by ``role``."""
  alpha = config.pointwise_alpha[0 if role == "attention" else 1]
  axes.pop("reduction_axes", None)  # pointwise: nothing is reduced
  return getattr(jaxnorm_nnx, op.layer)(num_features, alpha_init_value=alpha,
                                        dtype=jnp.dtype(config.dtype), rngs=rngs, **axes)


def _make_statistics_norm(config, rngs, op, num_features, role, **axes) -> nnx.Module:
  """A LayerNorm/RMSNorm layer: ``op``'s class of :mod:`jaxnorm.nnx`, or of Flax's
  :mod:`flax.nnx` with ``norm_impl="flax"`` (the same class names)."""
  del role
  module = nnx if config.norm_impl == "flax" else jaxnorm_nnx
  kw = {} if config.norm_impl == "flax" else {"casting": config.casting,
                                               "memory_efficient": config.norm_memory_efficient}
  return getattr(module, op.layer)(num_features, epsilon=config.epsilon,
                                   dtype=jnp.dtype(config.dtype), rngs=rngs, **axes, **kw)


# How the model builds a norm of each family of jaxnorm.OPS.
_NORM_BUILDERS = {POINTWISE_FAMILY: _make_pointwise, NORM_FAMILY: _make_statistics_norm}


def _make_qk_norm(config: TransformerConfig, rngs: nnx.Rngs) -> nnx.Module:
  """A query or key norm over the head dimension of ``(B, T, H, Dh)``.

  ``qk_norm_scale="per_head"``: Flax's per-head spelling, ``feature_axes=(-2, -1)`` and
  ``reduction_axes=-1``, with a ``(H * Dh,)`` scale (one weight per head and feature);
  ``"shared"``: a ``(Dh,)`` scale broadcast over the heads.
  """
  if config.qk_norm_scale == "per_head":
    return _make_norm(config, rngs, norm_type=config.qk_norm,
                      num_features=config.n_heads * config.head_dim, feature_axes=(-2, -1),
                      reduction_axes=-1, role="attention")
  return _make_norm(config, rngs, norm_type=config.qk_norm, num_features=config.head_dim,
                    role="attention")


class _Stats:
  """What one forward pass records when collecting statistics (lists of scalar arrays).

  Attributes:
    residual: E||x||^2 / d of every norm input, in forward order.
    saturation: for a DyT/Derf norm, the fraction of its input's entries whose argument
      :math:`|\\alpha x + s|` exceeds :data:`SATURATION_ARG` (:func:`_saturation`), in the same
      order (empty for LayerNorm/RMSNorm models).
    max_logit: the largest attention logit of every attention layer.
    entropy: the mean attention entropy (nats) of every attention layer.
  """

  def __init__(self):
    self.residual: list = []
    self.saturation: list = []
    self.max_logit: list = []
    self.entropy: list = []


def _rotary(x: jax.Array) -> jax.Array:
  r"""Rotary position embedding (RoPE, half-split layout) of ``x: (B, T, H, Dh)``.

  .. math::

     (x_1, x_2) \mapsto (x_1 \cos\theta_t - x_2 \sin\theta_t,\;
                         x_2 \cos\theta_t + x_1 \sin\theta_t),\quad
     \theta_{t,i} = t \cdot 10000^{-2i / D_h}
  """
  _, t, _, dh = x.shape
  half = dh // 2
  inv_freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / dh)  # (Dh/2,)
  theta = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]    # (T, Dh/2)
  cos = jnp.cos(theta)[None, :, None, :]                                  # (1, T, 1, Dh/2)
  sin = jnp.sin(theta)[None, :, None, :]
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :half], xf[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class CausalSelfAttention(nnx.Module):
  r"""Multi-head causal self-attention with one QKV projection (a (d, 3d) kernel).

  .. math::

     \mathrm{Attn}(x) = \mathrm{concat}_h\Big(\mathrm{softmax}\big(
        \tfrac{Q_h K_h^\top}{\sqrt{D_h}} + M\big) V_h\Big) W^O,
     \quad M_{ts} = -\infty \text{ for } s > t
  """

  def __init__(self, config: TransformerConfig, *, v_gain: float, rngs: nnx.Rngs):
    d, dtype = config.d_model, jnp.dtype(config.dtype)
    self.n_heads, self.head_dim = config.n_heads, config.head_dim
    self.rotary = config.positions == "rotary"
    self.qk_norm = config.qk_norm != "none"
    if self.qk_norm:
      self.q_norm = _make_qk_norm(config, rngs)
      self.k_norm = _make_qk_norm(config, rngs)
    self.qkv = nnx.Linear(d, 3 * d, kernel_init=_qkv_init(config, v_gain), dtype=dtype, rngs=rngs)
    self.out = nnx.Linear(d, d, kernel_init=_weight_init(config, gain=v_gain, residual=True),
                          dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array, stats: _Stats | None = None) -> jax.Array:
    """Attends causally over ``x: (B, T, d)``; returns ``(B, T, d)``.

    With ``stats``, appends the largest attention logit and the mean attention entropy.
    """
    b, t, d = x.shape
    qkv = self.qkv(x).reshape(b, t, 3, self.n_heads, self.head_dim)  # (B, T, 3, H, Dh)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]               # (B, T, H, Dh)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    if self.rotary:
      q, k = _rotary(q), _rotary(k)
    scores = jnp.einsum("bthd,bshd->bhts", q, k).astype(jnp.float32)  # (B, H, T, T)
    scores = scores / math.sqrt(self.head_dim)
    causal = jnp.tril(jnp.ones((t, t), dtype=jnp.bool_))[None, None]   # (1, 1, T, T)
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    if stats is not None:
      stats.max_logit.append(jnp.max(scores))  # masked entries hold finfo.min
      logp = jax.nn.log_softmax(scores, axis=-1)     # masked: p = 0, p log p = 0 (finite)
      stats.entropy.append(-jnp.mean(jnp.sum(jnp.exp(logp) * logp, axis=-1)))
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    y = jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, d)      # (B, T, d)
    return self.out(y)


class MLP(nnx.Module):
  r"""Position-wise feed-forward network.

  .. math::

     \mathrm{MLP}(x) = \phi(x W_1 + b_1) W_2 + b_2, \qquad \phi = \mathrm{GELU}
     \text{ or } \mathrm{ReLU} \text{ (``config.activation``)}
  """

  def __init__(self, config: TransformerConfig, *, gain: float, rngs: nnx.Rngs):
    dtype = jnp.dtype(config.dtype)
    self.act = jax.nn.relu if config.activation == "relu" else jax.nn.gelu
    self.fc_in = nnx.Linear(config.d_model, config.d_ff,
                            kernel_init=_weight_init(config, gain=gain), dtype=dtype, rngs=rngs)
    self.fc_out = nnx.Linear(config.d_ff, config.d_model,
                             kernel_init=_weight_init(config, gain=gain, residual=True),
                             dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the MLP to ``x: (B, T, d)``."""
    return self.fc_out(self.act(self.fc_in(x)))


def _scaled(y: jax.Array, out_scale) -> jax.Array:
  """``y * out_scale`` in ``y``'s dtype (``y`` itself for the Python float 1.0)."""
  if isinstance(out_scale, float) and out_scale == 1.0:
    return y
  return y * jnp.asarray(out_scale, y.dtype)


# The argument beyond which a DyT/Derf activation counts as saturated: |alpha x + s| > 2
# (tanh(2) = 0.964, erf(2) = 0.995). Verma 2026 ("When Does Removing LayerNorm Help?",
# arXiv:2604.23434) reports the fraction of DyT pre-tanh activations |alpha x| above 2 (its
# artifact's activation_analysis.py and results/activation_analysis.json: thresholds 1-3; the
# abstract's 49% / 23% at the threshold 2).
SATURATION_ARG = 2.0


def _saturation(norm: nnx.Module, h: jax.Array) -> jax.Array:
  r"""The fraction of entries of ``h`` whose DyT/Derf argument :math:`|\alpha h + s|` exceeds
  :data:`SATURATION_ARG` (``s`` = 0 for DyT)."""
  arg = norm.alpha[...].astype(jnp.float32) * h.astype(jnp.float32)
  if getattr(norm, "shift", None) is not None:
    arg = arg + norm.shift[...].astype(jnp.float32)
  return jnp.mean((jnp.abs(arg) > SATURATION_ARG).astype(jnp.float32))


def _record(norm: nnx.Module, h: jax.Array, stats: _Stats) -> None:
  """Appends E||h||^2 / d of a norm input (and, for DyT/Derf, its saturated fraction)."""
  stats.residual.append(jnp.mean(jnp.square(h.astype(jnp.float32))))
  if hasattr(norm, "alpha"):
    stats.saturation.append(_saturation(norm, h))


def _normed(norm: nnx.Module, x: jax.Array, stats: _Stats | None,
            out_scale=1.0) -> jax.Array:
  """``out_scale * N(x)``, first recording E||x||^2 / d of its input when collecting stats
  (and, for a DyT/Derf norm, the fraction of saturated entries: :func:`_saturation`)."""
  if stats is not None:
    _record(norm, x, stats)
  return _scaled(norm(x), out_scale)


def _add_normed(norm: nnx.Module, delta: jax.Array | None, x: jax.Array, stats: _Stats | None,
                residual_scale: float = 1.0, out_scale=1.0) -> tuple[jax.Array, jax.Array]:
  r"""``(s N(h), h)`` with :math:`h = \alpha x + \delta` (``h = x`` when ``delta`` is None).

  :math:`\alpha` is ``residual_scale`` and :math:`s` is ``out_scale`` (LayerNorm Scaling's
  :math:`1/\sqrt{l}`); the add and the norm are one op (the module's ``residual=``
  keyword). Records E||h||^2 / d like :func:`_normed`.
  """
  if delta is None:
    return _normed(norm, x, stats, out_scale), x
  y, h = norm(delta, residual=x, residual_scale=residual_scale)
  if stats is not None:
    _record(norm, h, stats)
  return _scaled(y, out_scale), h
