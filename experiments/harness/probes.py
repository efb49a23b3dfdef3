r"""Probes of a model without a full training run: gradient norms at initialization, the
"model update" of the first steps, and training-step throughput (jaxnorm vs Flax norms).

They reuse the training step of :mod:`experiments.harness.train` (:func:`~experiments.harness.train.compiled_steps`,
shared compilation cache), so what they measure is what training runs.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.harness import data as data_lib
from experiments.harness.train import EVAL_SEED, compiled_steps, init_params, layer_grad_norms, loss_and_stats, to_py
from experiments.harness.train_config import TrainConfig, check_int, make_optimizer
from jaxnorm.models import TransformerConfig, TransformerLM, block_weight_paths

__all__ = ["UPDATE_OUTPUTS", "compare_norm_impl", "grad_norms_at_init", "model_update_size",
           "throughput"]


def grad_norms_at_init(model_config: TransformerConfig, corpus: data_lib.Corpus, *,
                       batch_size: int, seq_len: int, seed: int, n_batches: int) -> dict:
  r"""Per-layer norms of the expected gradient and residual norms at initialization.

  The "expected gradient" of Xiong et al. (Theorem 1) is the norm of the batch-mean gradient,

  .. math::

     \Big\| \mathbb E_\text{batch}\, \frac{\partial \mathcal L}{\partial W} \Big\|_F
     \approx \Big\| \frac1n \sum_{i=1}^{n} g_i \Big\|_F ,

  not the mean of per-batch norms :math:`\frac1n\sum_i \|g_i\|_F` (which is never smaller).

  Returns:
    ``{"attn_qkv": [...], "attn_out": [...], "mlp_in": [...], "mlp_out": [...]}`` (one value
    per layer: the Frobenius norm of the batch-mean gradient of that layer's weight matrix),
    ``"grad_norm"`` (the global norm of the batch-mean gradient) and ``"residual_sq_norm"``
    (E||x||^2/d of every norm input, in forward order, averaged over the batches), over
    ``n_batches`` training batches, for the model initialized with ``seed``.
  """
  check_int("n_batches", n_batches, 1)
  _, params, _ = init_params(model_config, seed)
  one, norms = _grad_fns(model_config)
  total, residual = None, []
  for i in range(n_batches):
    x, y = data_lib.batch_at(corpus.train, i, batch_size=batch_size, seq_len=seq_len, seed=seed)
    grads, res = one(params, jnp.asarray(x), jnp.asarray(y))
    total = grads if total is None else jax.tree.map(jnp.add, total, grads)
    residual.append(np.asarray(res))
  out = jax.device_get(norms(jax.tree.map(lambda g: g / n_batches, total)))
  out["residual_sq_norm"] = np.mean(np.stack(residual), axis=0)
  return {k: to_py(v) for k, v in out.items()}


@functools.lru_cache(maxsize=8)
def _grad_fns(model_config: TransformerConfig):
  """The jitted ``(one, norms)`` of :func:`grad_norms_at_init`, one per config and process.

  ``one(params, inputs, targets)`` is the gradient and the norm-input statistics of one batch;
  ``norms(grads)`` the per-layer and global norms. Seeds share them (one compilation).
  """
  abstract = nnx.eval_shape(lambda: TransformerLM(model_config, rngs=nnx.Rngs(0)))
  graphdef, paths = nnx.graphdef(abstract), block_weight_paths(abstract)

  @jax.jit
  def one(params, inputs, targets):
    (_, stats), grads = jax.value_and_grad(
        functools.partial(loss_and_stats, graphdef, collect_stats=True), has_aux=True)(
            params, inputs, targets)
    return grads, stats["residual_sq_norm"]

  @jax.jit
  def norms(grads):
    out = layer_grad_norms(grads, paths)
    out["grad_norm"] = optax.tree.norm(grads)
    return out

  return one, norms


UPDATE_OUTPUTS = ("hidden", "logits")


def model_update_size(model_config: TransformerConfig, train_config: TrainConfig,
                      corpus: data_lib.Corpus, *, steps: int = 1, on: str = "hidden",
                      relative: bool = True) -> list[float]:
  r"""DeepNet's "model update" :math:`\|F(x;\theta_s) - F(x;\theta_0)\|` after each of the first
  ``steps`` updates.

  .. math::

     u_s = \frac{\big(\frac{1}{BT}\sum_{b,t} \|F(x;\theta_s)_{bt} - F(x;\theta_0)_{bt}\|_2^2\big)^{1/2}}
                {\big(\frac{1}{BT}\sum_{b,t} \|F(x;\theta_0)_{bt}\|_2^2\big)^{1/2}}

  (the denominator only with ``relative``) on a fixed validation batch ``x`` (the first
  evaluation batch), training with ``train_config`` (its ``model`` is replaced by
  ``model_config``) from the initialization of its seed. ``on="hidden"`` takes :math:`F` as
  the final hidden state, the head's input (after the final norm for Pre-LN and Sandwich), as
  DeepNet does; ``on="logits"`` the logits.

  Raises:
    ValueError: ``on`` is not one of :data:`UPDATE_OUTPUTS`, or ``steps < 1``.
  """
  check_int("steps", steps, 1)
  if on not in UPDATE_OUTPUTS:
    raise ValueError(f"on must be one of {UPDATE_OUTPUTS}, got {on!r}.")
  config = dataclasses.replace(train_config, model=model_config, steps=max(steps, 1),
                               log_update_size=False)
  graphdef, params, _ = init_params(model_config, config.seed)
  opt_state = make_optimizer(config).init(params)
  train_step = compiled_steps(config)[0]
  fixed = jnp.asarray(data_lib.batch_at(corpus.valid, 0, batch_size=config.batch_size,
                                        seq_len=config.seq_len, seed=EVAL_SEED)[0])
  forward = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x, return_hidden=(on == "hidden")))

  @jax.jit
  def change(p, ref):
    delta = forward(p, fixed) - ref
    size = jnp.sqrt(jnp.mean(jnp.sum(jnp.square(delta), axis=-1)))
    return size / jnp.sqrt(jnp.mean(jnp.sum(jnp.square(ref), axis=-1))) if relative else size

  ref = forward(params, fixed)
  sizes = []
  for step in range(steps):
    x, y = data_lib.batch_at(corpus.train, step, batch_size=config.batch_size,
                             seq_len=config.seq_len, seed=config.seed)
    params, opt_state, _ = train_step(params, opt_state, jnp.asarray(x), jnp.asarray(y))
    sizes.append(float(change(params, ref)))
  return sizes


def throughput(model_config: TransformerConfig, *, batch_size: int = 16, seq_len: int = 128,
               steps: int = 20, seed: int = 0, corpus: data_lib.Corpus | None = None,
               **train_kwargs) -> dict:
  """Training tokens/s of the jitted train step (compilation excluded) for one model config.

  ``train_kwargs`` are further :class:`TrainConfig` fields (``lr``, ``warmup``, ...);
  ``log_attention`` is off unless given (the attention statistics are not part of the step
  whose speed is measured, and its numbers stay comparable with those taken before them). The step
  is the one :func:`train` uses (:func:`compiled_steps`, shared cache), so ``compile_s`` is
  near zero when that config was compiled before in this process.

  Returns:
    ``{"tokens_per_s", "step_ms", "compile_s", "norm_impl", "norm_type"}``.
  """
  check_int("steps", steps, 1)
  corpus = corpus if corpus is not None else data_lib.load_corpus()
  train_kwargs.setdefault("log_attention", False)
  config = TrainConfig(model=model_config, steps=steps, batch_size=batch_size, seq_len=seq_len,
                       seed=seed, **train_kwargs)
  _, params, _ = init_params(model_config, seed)
  opt_state = make_optimizer(config).init(params)
  train_step = compiled_steps(config)[0]
  data = [tuple(map(jnp.asarray, data_lib.batch_at(corpus.train, i, batch_size=batch_size,
                                                   seq_len=seq_len, seed=seed)))
          for i in range(min(steps, 8))]
  t0 = time.perf_counter()
  params, opt_state, m = train_step(params, opt_state, *data[0])
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for i in range(steps):
    params, opt_state, m = train_step(params, opt_state, *data[i % len(data)])
  jax.block_until_ready((params, m))
  dt = time.perf_counter() - t0
  return {"tokens_per_s": steps * batch_size * seq_len / dt, "step_ms": 1e3 * dt / steps,
          "compile_s": compile_s, "norm_impl": model_config.norm_impl,
          "norm_type": model_config.norm_type}


def compare_norm_impl(model_config: TransformerConfig, *, repeats: int = 3, **kwargs) -> dict:
  """Throughput of the same model with jaxnorm vs Flax norms, measured side by side.

  The two are measured alternately ``repeats`` times and the best of each is kept (less
  sensitive to background load). Keyword arguments go to :func:`throughput`.

  Returns:
    ``{"jaxnorm": {...}, "flax": {...}, "ratio": jaxnorm tokens/s / flax tokens/s}``.
  """
  check_int("repeats", repeats, 1)
  best = {}
  for _ in range(repeats):
    for impl in ("jaxnorm", "flax"):
      r = throughput(dataclasses.replace(model_config, norm_impl=impl), **kwargs)
      if impl not in best or r["tokens_per_s"] > best[impl]["tokens_per_s"]:
        r["compile_s"] = best.get(impl, r)["compile_s"]  # the first call compiled
        best[impl] = r
  best["ratio"] = best["jaxnorm"]["tokens_per_s"] / best["flax"]["tokens_per_s"]
  return best
