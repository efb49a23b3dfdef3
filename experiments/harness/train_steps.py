r"""The training step: the model as a pure function of a parameter dict, and the jitted train
and eval steps of a :class:`~experiments.harness.train_config.TrainConfig`, cached per process.

:func:`experiments.harness.train.train` runs these steps in its loop, and
:mod:`experiments.harness.probes` reuses them (gradient norms at init, throughput); both import
them from :mod:`experiments.harness.train`, which re-exports the public names.

Contract: :func:`compiled_steps` gives one compilation per config up to its host-side fields
(:data:`_HOST_ONLY`) and mesh; ``train_step`` reports the loss, the gradient norms, the
update/parameter ratio, the learning rate and, as the config asks, the per-layer gradient
norms, residual norms, attention statistics and model update, all inside the jitted step.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from experiments.harness.sharding import Placement
from experiments.harness.train_config import TrainConfig, current_lr, make_optimizer
from jaxnorm.models import WEIGHT_GROUPS, TransformerConfig, TransformerLM, block_weight_paths

__all__ = ["compiled_steps", "init_params", "layer_grad_norms", "loss_and_stats"]


# ----------------------------------------------------------------------------------------------
# Model as a pure function of a parameter dict.


def init_params(model_config: TransformerConfig, seed: int):
  """Builds the model (eagerly: each initializer op compiles once per shape and process).

  Returns:
    ``(graphdef, params, paths)``: the model's graph definition, its parameters as a pure
    nested dict, and :func:`~jaxnorm.models.block_weight_paths` of the model.
  """
  model = TransformerLM(model_config, rngs=nnx.Rngs(seed))
  graphdef, state = nnx.split(model)
  return graphdef, nnx.to_pure_dict(state), block_weight_paths(model)


def layer_grad_norms(grads, paths) -> dict:
  """The Frobenius norm of every block's weight-matrix gradient, per group of ``paths``.

  Returns:
    ``{group: (n_layers,) array}`` for each group of
    :data:`~jaxnorm.models.WEIGHT_GROUPS` (``attn_qkv``, ``attn_out``, ``mlp_in``, ``mlp_out``).
  """
  get = lambda path: functools.reduce(lambda t, k: t[k], path, grads)  # noqa: E731
  out = {}
  for group in WEIGHT_GROUPS:
    # The blocks are stacked: every path of a group is (*stacked_kernel, layer).
    stacked = get(paths[group][0][:-1]).astype(jnp.float32)                # (L, fan_in, fan_out)
    out[group] = jnp.sqrt(jnp.sum(jnp.square(stacked), axis=tuple(range(1, stacked.ndim))))
  return out


def loss_and_stats(graphdef, params, inputs, targets, collect_stats=False, z_loss=0.0):
  r"""Mean next-token cross-entropy of the model ``nnx.merge(graphdef, params)``, plus the z-loss.

  With ``z_loss > 0`` the returned objective is :math:`	ext{CE} + z\,\overline{(\log Z)^2}`
  (:math:`\log Z` = logsumexp of a position's logits) and ``stats`` also holds ``"ce"``, the
  cross-entropy alone (what is logged and evaluated).

  Returns:
    ``(loss, stats)``: ``stats`` is the model's statistics dict (``residual_sq_norm``,
    ``attn_max_logit``, ``attn_entropy``) when ``collect_stats``, else ``None`` (a dict with
    ``"ce"`` alone when only ``z_loss`` asks for one).
  """
  out = nnx.merge(graphdef, params)(inputs, collect_stats=collect_stats)
  logits, stats = out if collect_stats else (out, None)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
  if not z_loss:
    return ce, stats
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  stats = dict(stats or {})
  stats["ce"] = ce
  return ce + z_loss * jnp.mean(jnp.square(log_z)), stats


def _build_steps(graphdef, paths, config: TrainConfig, tx: optax.GradientTransformation):
  """The (un-jitted) train and eval step functions."""
  collect = config.log_residual_norms or config.log_attention

  def train_step(params, opt_state, inputs, targets, fixed_inputs=None, ref_logits=None):
    (loss, stats), grads = jax.value_and_grad(
        functools.partial(loss_and_stats, graphdef, collect_stats=collect, z_loss=config.z_loss),
        has_aux=True)(params, inputs, targets)
    if config.z_loss:               # log the cross-entropy alone (comparable with every other run)
      loss = stats.pop("ce")
    updates, opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "update_ratio": optax.tree.norm(updates) / optax.tree.norm(params),
        "lr": current_lr(config.schedule, opt_state),
    }
    if config.log_grad_norms:
      metrics.update(layer_grad_norms(grads, paths))
    if config.log_residual_norms:
      metrics["residual_sq_norm"] = stats["residual_sq_norm"]
    if config.log_attention:
      metrics["attn_max_logit"] = stats["attn_max_logit"]
      metrics["attn_entropy"] = stats["attn_entropy"]
    if fixed_inputs is not None:
      metrics["update_size"] = _logit_change(graphdef, new_params, fixed_inputs, ref_logits)
    return new_params, opt_state, metrics

  def eval_step(params, inputs, targets):
    loss, stats = loss_and_stats(graphdef, params, inputs, targets,
                                 collect_stats=config.log_attention)
    if not config.log_attention:
      return loss, None
    return loss, {"attn_max_logit": stats["attn_max_logit"],
                  "attn_entropy": stats["attn_entropy"]}

  return train_step, eval_step


def _logit_change(graphdef, params, inputs, ref_logits):
  r"""RMS over positions of :math:`\|f(x;\theta)_{bt} - f(x;\theta_0)_{bt}\|_2`."""
  delta = nnx.merge(graphdef, params)(inputs) - ref_logits
  return jnp.sqrt(jnp.mean(jnp.sum(jnp.square(delta), axis=-1)))


# ----------------------------------------------------------------------------------------------
# Compiled steps, cached per process.


# Fields of TrainConfig that do not change the compiled steps (they are host-side only).
# Neither do the injected optimizer hyper-parameters (see make_optimizer).
_HOST_ONLY = dict(seed=0, eval_every=0, eval_batches=1, checkpoint_every=0,
                  divergence_loss=1.0, data=None, log_every=1, steps=0, lr=1.0, warmup=0,
                  b1=0.9, b2=0.98, weight_decay=0.0, decay_timescale=None, train_bytes=None,
                  eval_train=False, alt_eval_steps=())


@functools.lru_cache(maxsize=32)
def _compiled_steps_cached(key: TrainConfig, mesh):
  abstract = nnx.eval_shape(lambda: TransformerLM(key.model, rngs=nnx.Rngs(0)))
  graphdef, paths = nnx.graphdef(abstract), block_weight_paths(abstract)
  tx = make_optimizer(key)
  train_step, eval_step = _build_steps(graphdef, paths, key, tx)
  if mesh is None:
    return jax.jit(train_step, donate_argnums=(0, 1)), jax.jit(eval_step), graphdef
  placement = Placement(mesh, key.fsdp, key.batch_size)
  params = nnx.to_pure_dict(nnx.state(abstract))
  ps = placement.tree_shardings(params)
  os_ = placement.tree_shardings(jax.eval_shape(tx.init, params))
  b, r = placement.batch, placement.replicated
  in_sh = (ps, os_, b, b) + ((b, b) if key.log_update_size else ())
  train = jax.jit(train_step, in_shardings=in_sh, out_shardings=(ps, os_, r),
                  donate_argnums=(0, 1))
  ev = jax.jit(eval_step, in_shardings=(ps, b, b), out_shardings=r)
  return train, ev, graphdef


@functools.lru_cache(maxsize=32)
def train_eval_cached(model_config: TransformerConfig):
  """The jitted ``step(params, inputs, targets) -> (loss, saturation)`` scoring a trained model of
  ``model_config`` (``eval_train``; ``saturation`` None for LayerNorm/RMSNorm), cached per process."""
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: TransformerLM(model_config, rngs=nnx.Rngs(0))))

  def step(params, inputs, targets):
    loss, stats = loss_and_stats(graphdef, params, inputs, targets, collect_stats=True)
    return loss, stats.get("saturation")

  return jax.jit(step)


def compiled_steps(config: TrainConfig, mesh=None):
  """The jitted ``(train_step, eval_step, graphdef)`` of a config, cached per process.

  Runs that differ only in host-side settings (seed, evaluation, checkpoint and logging
  intervals, data) or in the injected optimizer hyper-parameters (learning rate, warm-up,
  number of steps, betas, weight decay) share one compilation, so seed and learning-rate
  sweeps and resumed runs compile once.

  ``train_step(params, opt_state, inputs, targets[, fixed_inputs, ref_logits])`` returns
  ``(params, opt_state, metrics)`` and donates ``params`` and ``opt_state``;
  ``eval_step(params, inputs, targets)`` returns ``(mean loss, attention)``, ``attention``
  the per-layer ``{"attn_max_logit", "attn_entropy"}`` of the batch (None without
  ``log_attention``).
  """
  return _compiled_steps_cached(dataclasses.replace(config, **_HOST_ONLY), mesh)
