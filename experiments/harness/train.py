r"""Training harness: one jitted AdamW step, divergence as a result, sharding, orbax resume.

:func:`train` trains a :class:`jaxnorm.models.TransformerLM` on a byte-level corpus
(:mod:`experiments.harness.data`) and writes, incrementally, ``out_dir/config.json`` and
``out_dir/metrics.jsonl`` (one JSON object per logged step and per evaluation), so nothing that
was logged is lost when a run dies. With ``checkpoint_every > 0`` it saves orbax checkpoints to
``out_dir/ckpt`` and, when started again on the same ``out_dir``, resumes from the latest one and
reproduces the loss curve of an uninterrupted run exactly (batches depend only on the seed and
the step index).

The configuration, schedule and optimizer are in :mod:`experiments.harness.train_config`, device
placement in :mod:`experiments.harness.sharding`, probes that reuse the step (gradient norms at init,
throughput) in :mod:`experiments.harness.probes`, and the command line in :mod:`experiments.harness.train_cli`.
This module is the step and the loop, top to bottom.

Each step reports the loss, the global gradient norm (before clipping), the per-layer gradient
norms of every block's ``attn_qkv``, ``attn_out``, ``mlp_in`` and ``mlp_out`` matrix, the
update/parameter norm ratio :math:`\|\Delta\theta\| / \|\theta\|`, per layer the largest
attention logit and the mean attention entropy (``log_attention``, on by default; also on the
validation batches of every evaluation), and optionally the mean squared residual entering
each norm and the "model update" :math:`\|f(x;\theta_s) - f(x;\theta_0)\|` on a fixed batch
(DeepNet, Admin) -- all computed inside the jitted step.

A NaN/Inf loss or a loss above ``divergence_loss`` stops the run and is recorded as
``"diverged_at": k``; it is a result, never an exception.

Command line: ``python -m experiments train --help`` (:mod:`experiments.harness.train_cli`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.harness import data as data_lib
from experiments.harness import progress as progress_lib
from experiments.harness.sharding import Placement
from experiments.harness.train_config import TrainConfig, current_lr, make_optimizer
from jaxnorm.models import WEIGHT_GROUPS, TransformerConfig, TransformerLM, block_weight_paths

__all__ = [
    "EVAL_SEED",
    "compiled_steps",
    "eval_unigram_nats",
    "init_params",
    "layer_grad_norms",
    "loss_and_stats",
    "to_py",
    "train",
]

EVAL_SEED = 1_000_003  # the validation batches are the same for every run (any training seed)
TRAIN_EVAL_SEED = 3_000_003  # eval_train: the fixed batches of the training bytes the final model is scored on
ALT_EVAL_SEED = 2_000_003  # a second set of validation windows, read once at the end: the evaluation noise


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
                  eval_train=False)


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
def _train_eval_cached(model_config: TransformerConfig):
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


# ----------------------------------------------------------------------------------------------
# Logging helpers.


def to_py(x):
  """Device metrics -> JSON-able Python values (non-finite floats become strings)."""
  x = np.asarray(x)
  if x.ndim == 0:
    v = float(x)
    return v if math.isfinite(v) else repr(v)
  return [to_py(e) for e in x]


def _is_main_process() -> bool:
  return jax.process_index() == 0


class _MetricsWriter:
  """Appends JSON lines to ``metrics.jsonl`` and flushes each one (safe against kills)."""

  def __init__(self, path: pathlib.Path, keep_until: int | None):
    self.path = path
    self.enabled = _is_main_process()
    self.lines: list[dict] = []
    if keep_until is not None and path.exists():
      for raw in path.read_text().splitlines():
        try:
          line = json.loads(raw)
        except json.JSONDecodeError:
          break  # a line cut by a kill: everything after it is lost anyway
        if line.get("step", 0) <= keep_until:
          self.lines.append(line)
    if self.enabled:
      with open(path, "w") as f:
        for line in self.lines:
          f.write(json.dumps(line) + "\n")
      self._f = open(path, "a")

  def write(self, line: dict) -> None:
    self.lines.append(line)
    if self.enabled:
      self._f.write(json.dumps(line) + "\n")
      self._f.flush()

  def close(self) -> None:
    if self.enabled:
      self._f.close()


# ----------------------------------------------------------------------------------------------
# Training.


def _diverged(loss: float, threshold: float) -> bool:
  return not math.isfinite(loss) or loss > threshold


def _restore(config: TrainConfig, out_dir: pathlib.Path, params, opt_state):
  """Opens the run's checkpoints (if ``checkpoint_every > 0``) and restores the latest one.

  Returns:
    ``(manager, params, opt_state, start)``: the orbax manager (``None`` without checkpoints),
    the restored (or given) state, and the step it was saved at (0 for a fresh run).

  Raises:
    ValueError: ``out_dir`` holds checkpoints of a different config.
  """
  if config.checkpoint_every <= 0:
    return None, params, opt_state, 0
  import orbax.checkpoint as ocp
  ckpt_dir = (out_dir / "ckpt").absolute()
  cfg_path = out_dir / "config.json"
  if ckpt_dir.exists() and cfg_path.exists():
    saved = json.loads(cfg_path.read_text())
    if saved.get("train") != config.to_dict():
      raise ValueError(f"out_dir {str(out_dir)!r} holds checkpoints of a different config; "
                       f"use a fresh out_dir or the same config to resume.")
  manager = ocp.CheckpointManager(
      ckpt_dir, options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  latest = manager.latest_step()
  if latest is None:
    return manager, params, opt_state, 0
  target = {"params": params, "opt_state": opt_state}
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
  return manager, restored["params"], restored["opt_state"], int(latest)


def eval_unigram_nats(config: TrainConfig, corpus: data_lib.Corpus) -> float:
  """The unigram plateau of ``config``'s validation loss: the loss of the byte-frequency model on
  exactly the validation batches every evaluation of such a run reads
  (:func:`~experiments.harness.data.unigram_cross_entropy_nats`; the batches depend on
  ``batch_size``, ``seq_len`` and ``eval_batches`` only, never on the training seed)."""
  targets = [y for _, y in _eval_data(config, corpus)]
  return data_lib.unigram_cross_entropy_nats(corpus, np.concatenate([t.ravel() for t in targets]))


def _eval_data(config: TrainConfig, corpus: data_lib.Corpus, seed: int = EVAL_SEED) -> list[tuple]:
  """The validation batches ``[(inputs, targets)]`` (host arrays) every evaluation of ``config`` reads."""
  return [data_lib.batch_at(corpus.valid, i, batch_size=config.batch_size, seq_len=config.seq_len, seed=seed)
          for i in range(config.eval_batches)]


def _eval_batches(config: TrainConfig, corpus: data_lib.Corpus, placement: Placement,
                  seed: int = EVAL_SEED) -> list[tuple]:
  """The fixed validation batches ``[(inputs, targets)]`` of every evaluation, placed on the mesh."""
  return [(placement.put_batch(x), placement.put_batch(y)) for x, y in _eval_data(config, corpus, seed)]


def _train_loop(config: TrainConfig, corpus: data_lib.Corpus, mesh, placement: Placement, graphdef,
                params, opt_state, *, manager, writer: _MetricsWriter, start: int, end: int,
                progress: bool | None) -> tuple[int | None, float | None, int, float]:
  """Runs steps ``start + 1 .. end`` with evaluations, logging and checkpoints.

  Returns:
    ``(diverged_at, val, tokens, timed_s)``: the step of divergence (``None``), the last
    validation loss (``None`` if none was computed here), and the tokens and seconds of the
    timed steps (the first step of a call, which compiles, is not timed).
  """
  train_step, eval_step, _ = compiled_steps(config, mesh)
  eval_data = _eval_batches(config, corpus, placement)
  train_data = data_lib.train_subset(corpus.train, config.train_bytes)
  extra = ()
  if config.log_update_size:
    fixed = eval_data[0][0]
    ref_logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, fixed)
    extra = (fixed, ref_logits)

  def evaluate(step: int) -> float:
    outs = jax.device_get([eval_step(params, x, y) for x, y in eval_data])
    val = float(np.mean([float(loss) for loss, _ in outs]))
    line = {"step": step, "val_loss": val if math.isfinite(val) else repr(val)}
    if config.log_attention:  # the largest logit over the batches, the mean entropy
      line["val_attn_max_logit"] = to_py(np.max([a["attn_max_logit"] for _, a in outs], axis=0))
      line["val_attn_entropy"] = to_py(np.mean([a["attn_entropy"] for _, a in outs], axis=0))
    writer.write(line)
    return val

  tty = sys.stderr.isatty()
  bar = progress_lib.Progress(config.steps, desc="train", bar=tty if progress is None else bool(progress),
                              log=progress_lib.stderr_line if (progress is None and not tty) else None,
                              every=config.steps // 20, initial=start, unit="step")
  diverged_at, tokens, timed_s, val = None, 0, 0.0, None
  if start == 0:
    val = evaluate(0)
  tokens_per_step = config.batch_size * config.seq_len
  try:
    for step in range(start + 1, end + 1):
      inputs, targets = data_lib.batch_at(train_data, step - 1, batch_size=config.batch_size,
                                          seq_len=config.seq_len, seed=config.seed)
      t0 = time.perf_counter()
      params, opt_state, metrics = train_step(params, opt_state, placement.put_batch(inputs),
                                              placement.put_batch(targets), *extra)
      metrics = jax.device_get(metrics)
      if step > start + 1:  # the first step of a call includes compilation
        timed_s += time.perf_counter() - t0
        tokens += tokens_per_step
      tps = tokens / timed_s if timed_s > 0 else 0.0
      loss = float(metrics["loss"])
      if step % config.log_every == 0 or step == end or _diverged(loss, config.divergence_loss):
        line = {"step": step, **{k: to_py(v) for k, v in metrics.items()}, "tokens_per_s": tps}
        writer.write(line)
      bar.update(step, text=f"step {step}/{config.steps}  loss {loss:.4f}  tokens/s {tps:,.0f}",
                 postfix={"loss": f"{loss:.4f}", "tok_s": f"{tps:,.0f}"})
      if _diverged(loss, config.divergence_loss):
        diverged_at = step
        writer.write({"step": step, "event": "diverged", "loss": to_py(loss)})
        bar.message(f"diverged at step {step}: loss {loss}")
        break
      if config.eval_every and step % config.eval_every == 0 and step != config.steps:
        val = evaluate(step)
      if manager is not None and (step % config.checkpoint_every == 0 or step == config.steps):
        import orbax.checkpoint as ocp
        manager.save(step, args=ocp.args.StandardSave({"params": params,
                                                       "opt_state": opt_state}))
    else:
      if end == config.steps and config.steps > start:
        val = evaluate(config.steps)
        # The same final model on a second set of validation windows: how much the loss moves
        # with the sample alone (the reports' evaluation noise, measured, not assumed).
        alt = jax.device_get([eval_step(params, x, y)[0]
                              for x, y in _eval_batches(config, corpus, placement, ALT_EVAL_SEED)])
        v = float(np.mean([float(a) for a in alt]))
        writer.write({"step": config.steps, "val_loss_alt": v if math.isfinite(v) else repr(v)})
        if config.eval_train:
          writer.write(_evaluate_train(config, corpus, placement, params))
  finally:
    bar.close()
  return diverged_at, val, tokens, timed_s


def _evaluate_train(config: TrainConfig, corpus: data_lib.Corpus, placement: Placement, params) -> dict:
  """The final model on ``eval_batches`` fixed batches of its own training bytes (``eval_train``): the
  metrics line ``{"step", "train_eval_loss"[, "saturation"]}``, ``saturation`` the per-norm-input
  fraction of saturated DyT/Derf activations averaged over the batches (absent for LayerNorm/RMSNorm)."""
  step = _train_eval_cached(config.model)
  data = data_lib.train_subset(corpus.train, config.train_bytes)
  outs = jax.device_get([step(params, placement.put_batch(x), placement.put_batch(y)) for x, y in (
      data_lib.batch_at(data, i, batch_size=config.batch_size, seq_len=config.seq_len, seed=TRAIN_EVAL_SEED)
      for i in range(config.eval_batches))])
  loss = float(np.mean([float(l) for l, _ in outs]))
  line = {"step": config.steps, "train_eval_loss": loss if math.isfinite(loss) else repr(loss)}
  if outs[0][1] is not None:
    line["saturation"] = to_py(np.mean([np.asarray(s) for _, s in outs], axis=0))
  return line


def _summary(config: TrainConfig, corpus: data_lib.Corpus, lines: list[dict], *, diverged_at: int | None,
             val: float | None, end: int, tokens: int, timed_s: float) -> dict:
  """The summary :func:`train` returns, from the metrics lines and the loop's results."""
  train_curve = [(l["step"], l["loss"]) for l in lines if "loss" in l and "event" not in l]
  val_curve = [(l["step"], l["val_loss"]) for l in lines if "val_loss" in l]
  alt = [l["val_loss_alt"] for l in lines if "val_loss_alt" in l]
  train_eval = [l for l in lines if "train_eval_loss" in l]
  finished = diverged_at is None and end == config.steps
  steps_done = diverged_at if diverged_at is not None else end
  if diverged_at is None and val is None and val_curve:
    val = val_curve[-1][1]
  return {
      "final_val_loss": (None if diverged_at is not None or end < config.steps
                         else (val if isinstance(val, float) and math.isfinite(val) else None)),
      "diverged": diverged_at is not None,
      "diverged_at": diverged_at,
      "tokens_per_s": tokens / timed_s if timed_s > 0 else None,
      "steps_done": steps_done,
      "val_curve": val_curve,
      "train_curve": train_curve,
      # the final model on a second set of validation windows (None unless the run finished)
      "final_val_loss_alt": (alt[-1] if alt and isinstance(alt[-1], float) and diverged_at is None
                             and end == config.steps else None),
      "init": config.model.init,
      "corpus": corpus.describe(),
      # eval_train: the final model on its own training bytes (None unless asked and finished)
      "final_train_loss": (train_eval[-1]["train_eval_loss"] if train_eval and finished
                           and isinstance(train_eval[-1]["train_eval_loss"], float) else None),
      "final_saturation": (train_eval[-1].get("saturation") if train_eval and finished else None),
      "train_bytes": int(data_lib.train_subset(corpus.train, config.train_bytes).size),
  }


def train(config: TrainConfig, out_dir: str | pathlib.Path, *, progress: bool | None = None,
          mesh=None, corpus: data_lib.Corpus | None = None,
          stop_after: int | None = None) -> dict:
  """Trains one model; writes ``config.json``, ``metrics.jsonl`` (and ``ckpt/``) to ``out_dir``.

  Args:
    config: the :class:`TrainConfig`.
    out_dir: the run's folder (created). If it holds checkpoints of the same config (and
      ``checkpoint_every > 0``), the run resumes from the latest one.
    progress: ``None``: a tqdm bar on a terminal, plain log lines otherwise; ``True``: the bar;
      ``False``: silent.
    mesh: a :class:`jax.sharding.Mesh` (e.g. :func:`make_mesh`) to train data-parallel over
      its devices (``config.fsdp`` also shards the parameters); ``None``: one device.
    corpus: an already loaded corpus (default: ``data_lib.load_corpus(config.data)``).
    stop_after: stop after this many updates *in this call* without finishing the run (as if
      the process were killed; for resume tests). Checkpoints already written stay.

  Returns:
    ``{"final_val_loss", "final_val_loss_alt", "diverged", "diverged_at", "tokens_per_s", "steps_done",
    "val_curve": [(step, val_loss)], "train_curve": [(step, loss)], "init", "corpus"}``.
    ``final_val_loss`` is ``None`` for a diverged run.
  """
  if not isinstance(config, TrainConfig):
    raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}.")
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  corpus = corpus if corpus is not None else data_lib.load_corpus(config.data)
  placement = Placement(mesh, config.fsdp, config.batch_size)
  mc = config.model

  graphdef, params, paths = init_params(mc, config.seed)
  tx = make_optimizer(config)
  opt_state = tx.init(params)
  params, opt_state = placement.put_tree(params), placement.put_tree(opt_state)
  # Resume from the latest checkpoint of the same config.
  manager, params, opt_state, start = _restore(config, out_dir, params, opt_state)

  if _is_main_process():
    record = {"train": config.to_dict(), "init": mc.init, "corpus": corpus.describe(),
              "devices": 1 if mesh is None else int(mesh.devices.size),
              "processes": jax.process_count(), "backend": jax.default_backend()}
    (out_dir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
  writer = _MetricsWriter(out_dir / "metrics.jsonl", keep_until=start if start else None)
  if not start:
    writer.lines.clear()

  end = config.steps if stop_after is None else min(config.steps, start + stop_after)
  try:
    diverged_at, val, tokens, timed_s = _train_loop(
        config, corpus, mesh, placement, graphdef, params, opt_state, manager=manager, writer=writer,
        start=start, end=end, progress=progress)
  finally:
    writer.close()
    if manager is not None:
      manager.wait_until_finished()
      manager.close()

  summary = _summary(config, corpus, writer.lines, diverged_at=diverged_at, val=val, end=end, tokens=tokens,
                     timed_s=timed_s)
  if _is_main_process():
    (out_dir / "summary.json").write_text(json.dumps(summary) + "\n")
  return summary
