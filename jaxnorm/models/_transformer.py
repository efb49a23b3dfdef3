r"""A decoder-only Transformer language model with a switchable normalization layout.

The model exists to study where the normalization goes. Writing :math:`F` for a sub-layer
(causal self-attention or the MLP) and :math:`N` for the normalization, one residual step is

.. math::

   \text{pre:}\quad      & x_{l+1} = x_l + F(N(x_l))      \quad\text{(final norm before the head)}\\
   \text{post:}\quad     & x_{l+1} = N(x_l + F(x_l))      \quad\text{(Vaswani et al., 2017)}\\
   \text{sandwich:}\quad & x_{l+1} = x_l + N'(F(N(x_l)))  \quad\text{(final norm before the head)}\\
   \text{deepnorm:}\quad & x_{l+1} = N(\alpha\, x_l + F(x_l)),  \quad \alpha = (2L)^{1/4}

where :math:`L` is the number of blocks. Every add that is followed by a norm (the
post/deepnorm block outputs, and in the pre/sandwich layouts the add before the next
sub-layer's norm or the final norm) runs as one fused op, ``(N(h), h)`` with
:math:`h = \alpha x + F` (:func:`jaxnorm.add_layer_norm`/``add_rms_norm`` through the
modules' ``residual=`` keyword), unless ``fuse_residual_norm=False``.

``norm_type`` picks LayerNorm or RMSNorm and
``norm_impl`` picks the implementation: ``"jaxnorm"`` (the custom-VJP modules of
:mod:`jaxnorm.nnx`) or ``"flax"`` (Flax's own modules, differentiated by autodiff), so every
result can be A/B-checked against autodiff.

The blocks' parameters are stacked on a leading layer axis (``model.blocks`` is one
:class:`Block` whose every parameter has shape ``(n_layers, ...)``; ``model.block(i)`` is
layer ``i`` alone) and the forward pass scans one block body over them, so the compiled
program, and its compile time, do not grow with depth (``scan_layers=False`` unrolls the same
body over the same parameters).

``qk_norm`` normalizes every head's query and key over the head dimension right after their
projection (and before the rotary embedding), :math:`q_h \mapsto N_q(q_h)`,
:math:`k_h \mapsto N_k(k_h)`, with one scale per head or one shared by every head
(``qk_norm_scale``). ``norm_scaling`` multiplies the output of the input norms of block
:math:`l = 1..L` by :math:`1/\sqrt{l}` (Sun et al. 2025's LayerNorm Scaling):
:math:`x_{l+1} = x_l + F(N(x_l)/\sqrt{l})` in the Pre-LN layout.

With ``collect_stats`` the model also returns, per layer, the largest attention logit
:math:`\max_{b,h,t,s\le t} q_{bht}\cdot k_{bhs}/\sqrt{D_h}` and the mean attention entropy
:math:`-\frac{1}{BHT}\sum_{b,h,t}\sum_{s\le t} p_{bhts}\log p_{bhts}` (nats), the two
quantities Wortsman et al. (2023) follow for the attention-logit-growth instability.

Initialization is a switch because the Pre-/Post-Norm results depend on it:

* ``init="xavier"``: the setting analysed by Xiong et al. (2020): Xavier-normal weight
  matrices, :math:`W \sim \mathcal N(0, 2 / (n_\text{in} + n_\text{out}))` (each of
  :math:`W^Q, W^K, W^V` as its own :math:`d \times d` matrix), unit-variance token and
  position embeddings, zero biases. ``qk_zero_init=True`` sets :math:`W^Q = W^K = 0`, their
  theory setting in which attention starts uniform.
* ``init="small"``: GPT-2 style, :math:`\mathcal N(0, 0.02^2)` for every weight and
  embedding, the residual projections (:math:`W^O` and the second MLP matrix) scaled by
  :math:`1/\sqrt{2L}`.
* ``norm_position="deepnorm"`` multiplies the initial :math:`W^V`, :math:`W^O` and both MLP
  matrices by DeepNet's :math:`\beta = (8L)^{-1/4}` (and :math:`W^Q, W^K` not at all); it
  replaces GPT-2's :math:`1/\sqrt{2L}` residual scaling, which is then not applied.

This module holds the blocks and the model; the sub-layers, the initializers, the norm
factory and the statistics helpers they use are in :mod:`jaxnorm.models._layers`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _concrete_checks

from jaxnorm.models._config import WEIGHT_GROUPS, TransformerConfig, deepnorm_alpha_beta
from jaxnorm.models._layers import (
    MLP,
    CausalSelfAttention,
    _add_normed,
    _embed_std,
    _make_norm,
    _normed,
    _Stats,
    _xavier,
)


class Block(nnx.Module):
  """One Transformer block (attention then MLP) in the layout of ``config.norm_position``."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.norm_position = config.norm_position
    self.fused = config.fused
    gain = 1.0
    self.residual_scale = 1.0  # DeepNorm's alpha: h = alpha x + F(x).
    if config.norm_position == "deepnorm":
      self.residual_scale, gain = deepnorm_alpha_beta(config.n_layers)
    self.attn = CausalSelfAttention(config, v_gain=gain, rngs=rngs)
    self.mlp = MLP(config, gain=gain, rngs=rngs)
    self.attn_norm = _make_norm(config, rngs, role="attention")
    self.mlp_norm = _make_norm(config, rngs)
    if config.norm_position == "sandwich":
      self.attn_out_norm = _make_norm(config, rngs, role="attention")
      self.mlp_out_norm = _make_norm(config, rngs)

  def __call__(self, x: jax.Array, stats: _Stats | None = None, norm_scale=1.0) -> jax.Array:
    r"""Maps the residual stream ``x: (B, T, d)`` to the next one.

    ``norm_scale`` multiplies the outputs of the input norms (Pre-LN/Sandwich: LayerNorm
    Scaling's :math:`1/\sqrt{l}` for layer ``l``, passed in by the model).
    """
    pos = self.norm_position
    if self.fused:
      if pos in ("pre", "sandwich"):
        x, pending = self.step(x, None, stats, norm_scale)
        return x + pending
      y, _ = _add_normed(self.attn_norm, self.attn(x, stats), x, stats, self.residual_scale)
      y, _ = _add_normed(self.mlp_norm, self.mlp(y), y, stats, self.residual_scale)
      return y
    s = norm_scale
    if pos == "pre":
      x = x + self.attn(_normed(self.attn_norm, x, stats, s), stats)
      x = x + self.mlp(_normed(self.mlp_norm, x, stats, s))
    elif pos == "post":
      x = _normed(self.attn_norm, x + self.attn(x, stats), stats)
      x = _normed(self.mlp_norm, x + self.mlp(x), stats)
    elif pos == "sandwich":
      a = self.attn(_normed(self.attn_norm, x, stats, s), stats)
      x = x + _normed(self.attn_out_norm, a, stats)
      x = x + _normed(self.mlp_out_norm, self.mlp(_normed(self.mlp_norm, x, stats, s)), stats)
    else:  # deepnorm
      x = _normed(self.attn_norm, self.residual_scale * x + self.attn(x, stats), stats)
      x = _normed(self.mlp_norm, self.residual_scale * x + self.mlp(x), stats)
    return x

  def step(self, x: jax.Array, pending: jax.Array | None, stats: _Stats | None = None,
           norm_scale=1.0) -> tuple[jax.Array, jax.Array]:
    r"""Pre-LN/Sandwich block on a stream with one add still pending: ``(x', pending')``.

    The stream is :math:`x + \text{pending}` (``pending`` is the previous sub-layer's
    output, None for none); each add is fused with the norm that follows it:
    ``y, x = N(pending, residual=x)``, then ``pending = F(y)`` (Sandwich: ``N'(F(y))``). The
    caller adds the last ``pending`` with the next block's first norm or the final norm.
    ``norm_scale`` multiplies the input norms' outputs (as in :meth:`__call__`).
    """
    sandwich = self.norm_position == "sandwich"
    y, x = _add_normed(self.attn_norm, pending, x, stats, out_scale=norm_scale)
    a = self.attn(y, stats)
    if sandwich:
      a = _normed(self.attn_out_norm, a, stats)
    y, x = _add_normed(self.mlp_norm, a, x, stats, out_scale=norm_scale)
    m = self.mlp(y)
    if sandwich:
      m = _normed(self.mlp_out_norm, m, stats)
    return x, m


class TransformerLM(nnx.Module):
  r"""Decoder-only Transformer language model.

  .. math::

     h_0 = E[\text{tokens}] + P, \quad h_{l+1} = \mathrm{Block}_l(h_l), \quad
     \text{logits} = \mathrm{Norm}_f(h_L)\, W_\text{head} + b_\text{head}

  (the final norm only for ``"pre"`` and ``"sandwich"``; ``P`` only for learned positions).

  Args:
    config: a :class:`TransformerConfig`.
    rngs: the ``nnx.Rngs`` used to initialize the parameters.

  Example:
    >>> cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, norm_impl="flax")
    >>> model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 8), jnp.int32)).shape
    (2, 8, 256)
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    if not isinstance(config, TransformerConfig):
      raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}.")
    self.config = config
    if config.dtype == "float64" and not jax.config.jax_enable_x64:
      raise ValueError(
          "dtype='float64' needs 64-bit mode, which is off (JAX would silently compute in "
          "float32); enable it with jax.config.update('jax_enable_x64', True) or "
          "JAX_ENABLE_X64=1, or pick dtype='float32'.")
    dtype = jnp.dtype(config.dtype)
    std = _embed_std(config)
    self.embed = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype,
                           embedding_init=jax.nn.initializers.normal(std), rngs=rngs)
    if config.positions == "learned":
      self.pos_embed = nnx.Param(
          jax.nn.initializers.normal(std)(rngs.params(), (config.max_len, config.d_model)))
    self.blocks = _stacked_blocks(config, rngs)
    if config.norm_position in ("pre", "sandwich"):
      self.final_norm = _make_norm(config, rngs)
    head_init = _xavier() if config.init == "xavier" else jax.nn.initializers.normal(0.02)
    self.head = nnx.Linear(config.d_model, config.vocab_size, kernel_init=head_init,
                           dtype=dtype, rngs=rngs)

  def __call__(self, tokens: jax.Array, *, collect_stats: bool = False,
               return_hidden: bool = False):
    """Computes next-token logits (or the final hidden state).

    Args:
      tokens: ``(B, T)`` integer token ids in ``[0, vocab_size)``, ``T <= max_len``. An id out
        of range (negative included) raises a ``ValueError`` where ``tokens`` is concrete;
        where it is traced (``jit``), its embedding is NaN (never a wrapped or clamped row),
        which makes its sequence's logits NaN (its own position's at least); the other
        sequences of the batch are unaffected.
      collect_stats: also return ``{"residual_sq_norm": (n_norm_inputs,), "attn_max_logit":
        (n_layers,), "attn_entropy": (n_layers,)}``: the mean squared entry E||x||^2 / d of
        every normalization input, in forward order, and per layer the largest attention
        logit and the mean attention entropy in nats (module docstring); for DyT/Derf models
        also ``"saturation": (n_norm_inputs,)``, the fraction of each norm input's entries
        with :math:`|\\alpha x + s| >` :data:`~jaxnorm.models._layers.SATURATION_ARG`.
      return_hidden: return the final hidden state ``(B, T, d)``, the input of the head
        (after the final norm for ``"pre"``/``"sandwich"``), instead of the logits.

    Returns:
      float32 logits ``(B, T, vocab_size)`` (or the hidden state with ``return_hidden``), or
      ``(logits, stats)`` when ``collect_stats``.
    """
    cfg = self.config
    if not hasattr(tokens, "dtype") or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise TypeError(
          f"tokens must be an integer array of shape (batch, seq_len), got "
          f"{getattr(tokens, 'dtype', type(tokens).__name__)}; cast with tokens.astype(jnp.int32).")
    if tokens.ndim != 2:
      raise ValueError(f"tokens must have shape (batch, seq_len), got shape {tuple(tokens.shape)}.")
    t = tokens.shape[1]
    if t > cfg.max_len:
      raise ValueError(
          f"tokens has seq_len {t} > max_len {cfg.max_len} of the model; build it with "
          f"TransformerConfig(max_len={t}) or feed shorter sequences.")
    if not _concrete_checks.check_token_ids("tokens", tokens, cfg.vocab_size):
      # Traced ids cannot raise: one out of range (negative included) embeds as NaN (never a
      # wrapped or clamped row), which reaches the logits of its sequence.
      tokens = jnp.where((tokens < 0) | (tokens >= cfg.vocab_size), cfg.vocab_size, tokens)
    x = self.embed(tokens)                                            # (B, T, d)
    if cfg.positions == "learned":
      x = x + self.pos_embed[...][None, :t].astype(x.dtype)
    if cfg.embed_scale != 1.0:
      x = x * jnp.asarray(cfg.embed_scale, x.dtype)
    x, stats = self._run_blocks(x, collect_stats)
    out = x.astype(jnp.float32) if return_hidden else self.head(x).astype(jnp.float32)
    return (out, stats) if collect_stats else out

  def _run_blocks(self, x: jax.Array, collect_stats: bool) -> tuple[jax.Array, dict | None]:
    r"""Runs every block (and the final norm) on ``x: (B, T, d)``; returns ``(x, stats)``.

    One block body, :func:`_block_body`, is either scanned over the stacked parameters
    (``scan_layers``, more than one layer) or called once per layer on the slices of the same
    parameters; the scan's ``xs`` also carry each layer's norm output scale (LayerNorm
    Scaling's :math:`1/\sqrt{l}`, or 1).
    ``stats`` is None unless ``collect_stats``; then the dict of :meth:`__call__`.
    """
    cfg = self.config
    graphdef, state = nnx.split(self.blocks)
    # Fused Pre-LN/Sandwich: each block's last add is fused with the next block's first norm
    # (the final norm last), so the carry is (stream, pending sub-layer output); the first
    # block gets a zero pending output (x + 0 = x exactly).
    carried = cfg.fused and cfg.norm_position in ("pre", "sandwich")
    body = functools.partial(_block_body, graphdef, carried, collect_stats)
    carry = (x, _pending_zeros(x)) if carried else x
    scales = (1.0 / jnp.sqrt(jnp.arange(1, cfg.n_layers + 1, dtype=jnp.float32))
              if cfg.norm_scaling else None)
    if cfg.scan_layers and cfg.n_layers > 1:  # (one layer: the body once, no loop)
      carry, per_layer = jax.lax.scan(body, carry, (state, scales))   # leaves (L, k) or None
    else:
      outs = []
      for i in range(cfg.n_layers):
        carry, out = body(carry, (_layer_slice(state, i), None if scales is None else scales[i]))
        outs.append(out)
      per_layer = jax.tree.map(lambda *a: jnp.stack(a), *outs) if collect_stats else None
    stats = _Stats() if collect_stats else None
    if carried:
      x, _ = _add_normed(self.final_norm, carry[1], carry[0], stats)
    else:
      x = carry
      if cfg.norm_position in ("pre", "sandwich"):
        x = _normed(self.final_norm, x, stats)
    if not collect_stats:
      return x, None
    residual = jnp.concatenate([per_layer["residual"].reshape(-1),
                                jnp.asarray(stats.residual, jnp.float32)])
    out = {"residual_sq_norm": residual, "attn_max_logit": per_layer["max_logit"][:, 0],
           "attn_entropy": per_layer["entropy"][:, 0]}
    if "saturation" in per_layer:
      out["saturation"] = jnp.concatenate([per_layer["saturation"].reshape(-1),
                                           jnp.asarray(stats.saturation, jnp.float32)])
    return x, out

  def block(self, i: int) -> Block:
    """Block ``i`` as a :class:`Block` of its own (its parameters sliced from the stack).

    The slice is a copy: changing it does not change the model.
    """
    if isinstance(i, bool) or not isinstance(i, int):
      raise TypeError(f"i must be a Python int, got {type(i).__name__} {i!r}.")
    if not 0 <= i < self.config.n_layers:
      raise ValueError(f"i must be in [0, n_layers={self.config.n_layers}), got {i}.")
    graphdef, state = nnx.split(self.blocks)
    return nnx.merge(graphdef, _layer_slice(state, i))


@jax.custom_jvp
def _pending_zeros(x):
  """``jnp.zeros_like(x)`` whose tangent is an array of zeros, not JAX's symbolic zero.

  The first pending sub-layer output of the carried (fused) scan. With ``jnp.zeros_like`` its
  tangent is symbolically zero, and the scan's differentiation, which iterates until it knows
  which carry tangents are nonzero, linearizes the whole block body a second time once the
  body's output says that this one is not (issue 62: the cpu preset's training step traced in
  100 ms instead of 70; ``docs/perf-notes.md``). Values and derivatives are those of
  ``jnp.zeros_like``."""
  return jnp.zeros_like(x)


@_pending_zeros.defjvp
def _pending_zeros_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  # A tangent linear in t (so that differentiation treats it as a tangent, not a constant) that
  # is exactly zero even where t is not finite (t * 0 would be NaN there), as is its transpose.
  # A scalar predicate: a full-shape one would need t's sharding under an explicit mesh.
  return jnp.zeros_like(x), jax.lax.select(jnp.zeros((), bool), t, jnp.zeros_like(t))


def _layer_slice(state, i: int):
  """Layer ``i`` of a stacked block state (every leaf indexed on its leading axis)."""
  return jax.tree.map(lambda a: a[i], state)


def _stacked_blocks(config: TransformerConfig, rngs: nnx.Rngs) -> Block:
  """The ``n_layers`` blocks as one :class:`Block` whose parameters have a leading layer axis.

  The blocks are initialized one after the other from ``rngs`` and then stacked, so a seed
  gives the same parameters as the same blocks built one by one (and under ``nnx.eval_shape``
  nothing is computed).
  """
  blocks = [Block(config, rngs=rngs) for _ in range(config.n_layers)]
  graphdef = nnx.graphdef(blocks[0])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
  return nnx.merge(graphdef, stacked)


def _block_body(graphdef, carried: bool, collect_stats: bool, carry, layer):
  """One layer: the block ``nnx.merge(graphdef, layer_state)`` applied to ``carry``.

  ``layer`` is ``(layer_state, norm_scale)`` (``norm_scale`` None: no LayerNorm Scaling).
  ``carry`` is the stream ``x`` or, when ``carried``, ``(x, pending)`` for
  :meth:`Block.step`. Returns ``(carry', stats)`` with ``stats`` this layer's
  ``{"residual": (k,), "max_logit": (1,), "entropy": (1,)}`` (None unless
  ``collect_stats``): the ``xs``/``ys`` of a scan.
  """
  layer_state, norm_scale = layer
  block = nnx.merge(graphdef, layer_state)
  stats = _Stats() if collect_stats else None
  norm_scale = 1.0 if norm_scale is None else norm_scale
  carry = block.step(*carry, stats, norm_scale) if carried else block(carry, stats, norm_scale)
  if not collect_stats:
    return carry, None
  out = {"residual": jnp.stack(stats.residual), "max_logit": jnp.stack(stats.max_logit),
         "entropy": jnp.stack(stats.entropy)}
  if stats.saturation:
    out["saturation"] = jnp.stack(stats.saturation)
  return carry, out


def block_weight_paths(model: TransformerLM) -> dict[str, list[tuple]]:
  """Paths of every block's weight matrices, for per-layer gradient norms.

  The blocks' parameters are stacked on a leading layer axis, so each path ends with the layer
  index into a stacked ``(n_layers, fan_in, fan_out)`` kernel. It indexes the pure parameter
  dict ``nnx.to_pure_dict(nnx.state(model))`` (and any tree of the same structure, such as
  its gradients), e.g. ``("blocks", "attn", "qkv", "kernel", 0)``; ``path[:-1]`` is the
  stacked kernel itself.

  Args:
    model: a :class:`TransformerLM`.

  Returns:
    ``{"attn_qkv": [...], "attn_out": [...], "mlp_in": [...], "mlp_out": [...]}``, each a list
    with one path per layer.
  """
  if not isinstance(model, TransformerLM):
    raise TypeError(f"model must be a TransformerLM, got {type(model).__name__}.")
  n = model.config.n_layers
  leaf = {"attn_qkv": ("attn", "qkv"), "attn_out": ("attn", "out"),
          "mlp_in": ("mlp", "fc_in"), "mlp_out": ("mlp", "fc_out")}
  return {k: [("blocks", *leaf[k], "kernel", i) for i in range(n)] for k in WEIGHT_GROUPS}
