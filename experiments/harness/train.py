r"""Training harness: one jitted AdamW step, divergence as a result, sharding, orbax resume.

:func:`train` trains a :class:`jaxnorm.models.TransformerLM` on a byte-level corpus
(:mod:`experiments.harness.data`) and writes, incrementally, ``out_dir/config.json`` and
``out_dir/metrics.jsonl`` (one JSON object per logged step and per evaluation), so nothing that
was logged is lost when a run dies. With ``checkpoint_every > 0`` it saves orbax checkpoints to
``out_dir/ckpt`` and, when started again on the same ``out_dir``, resumes from the latest one and
reproduces the loss curve of an uninterrupted run exactly (batches depend only on the seed and
the step index).

The configuration, schedule and optimizer are in :mod:`experiments.harness.train_config`, device
placement in :mod:`experiments.harness.sharding`, the model as a function of its parameters and the
jitted steps in :mod:`experiments.harness.train_steps` (re-exported here), probes that reuse the step
(gradient norms at init, throughput) in :mod:`experiments.harness.probes`, and the command line in
:mod:`experiments.harness.train_cli`. This module is the loop, its logging and evaluation, top to bottom.

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

import functools
import json
import math
import pathlib
import sys
import time

import jax
import numpy as np
from flax import nnx

from experiments.harness import data as data_lib
from experiments.harness import preflight
from experiments.harness import progress as progress_lib
from experiments.harness.sharding import Placement
from experiments.harness.train_config import TrainConfig, make_optimizer
from experiments.harness.train_steps import (
    train_eval_cached,
    compiled_steps,
    init_params,
    layer_grad_norms,
    loss_and_stats,
)

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


def _evaluate(config: TrainConfig, eval_step, eval_data: list[tuple], writer: _MetricsWriter, params,
              step: int) -> float:
  """The validation loss of ``params`` on ``eval_data``, written as ``step``'s line (attention stats too)."""
  outs = jax.device_get([eval_step(params, x, y) for x, y in eval_data])
  val = float(np.mean([float(loss) for loss, _ in outs]))
  line = {"step": step, "val_loss": val if math.isfinite(val) else repr(val)}
  if config.log_attention:  # the largest logit over the batches, the mean entropy
    line["val_attn_max_logit"] = to_py(np.max([a["attn_max_logit"] for _, a in outs], axis=0))
    line["val_attn_entropy"] = to_py(np.mean([a["attn_entropy"] for _, a in outs], axis=0))
  writer.write(line)
  return val


def _evaluate_alt(config: TrainConfig, eval_step, corpus: data_lib.Corpus, placement: Placement,
                  writer: _MetricsWriter, params, step: int) -> None:
  """``val_loss_alt`` of ``step``: the loss on a second set of validation windows (its noise, measured)."""
  alt = jax.device_get([eval_step(params, x, y)[0]
                        for x, y in _eval_batches(config, corpus, placement, ALT_EVAL_SEED)])
  v = float(np.mean([float(a) for a in alt]))
  writer.write({"step": step, "val_loss_alt": v if math.isfinite(v) else repr(v)})


def _progress_bar(config: TrainConfig, start: int, progress: bool | None) -> progress_lib.Progress:
  """The run's progress: a bar on a terminal (or as ``progress`` says), plain lines on stderr otherwise."""
  tty = sys.stderr.isatty()
  return progress_lib.Progress(config.steps, desc="train", bar=tty if progress is None else bool(progress),
                               log=progress_lib.stderr_line if (progress is None and not tty) else None,
                               every=config.steps // 20, initial=start, unit="step")


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

  evaluate = functools.partial(_evaluate, config, eval_step, eval_data, writer)
  evaluate_alt = functools.partial(_evaluate_alt, config, eval_step, corpus, placement, writer)
  bar = _progress_bar(config, start, progress)
  diverged_at, tokens, timed_s, val = None, 0, 0.0, None
  if start == 0:
    val = evaluate(params, 0)
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
      bar.update(step, text=f"step {step}/{config.steps}  loss {loss:z.4f}  tokens/s {tps:z,.0f}",
                 postfix={"loss": f"{loss:z.4f}", "tok_s": f"{tps:z,.0f}"})
      if _diverged(loss, config.divergence_loss):
        diverged_at = step
        writer.write({"step": step, "event": "diverged", "loss": to_py(loss)})
        bar.message(f"diverged at step {step}: loss {loss}")
        break
      if step != config.steps and ((config.eval_every and step % config.eval_every == 0)
                                   or step in config.alt_eval_steps):
        val = evaluate(params, step)
        if step in config.alt_eval_steps:
          evaluate_alt(params, step)
      if manager is not None and (step % config.checkpoint_every == 0 or step == config.steps):
        import orbax.checkpoint as ocp
        manager.save(step, args=ocp.args.StandardSave({"params": params,
                                                       "opt_state": opt_state}))
    else:
      if end == config.steps and config.steps > start:
        val = evaluate(params, config.steps)
        evaluate_alt(params, config.steps)
        if config.eval_train:
          writer.write(_evaluate_train(config, corpus, placement, params))
  finally:
    bar.close()
  return diverged_at, val, tokens, timed_s


def _evaluate_train(config: TrainConfig, corpus: data_lib.Corpus, placement: Placement, params) -> dict:
  """The final model on ``eval_batches`` fixed batches of its own training bytes (``eval_train``): the
  metrics line ``{"step", "train_eval_loss"[, "saturation"]}``, ``saturation`` the per-norm-input
  fraction of saturated DyT/Derf activations averaged over the batches (absent for LayerNorm/RMSNorm)."""
  step = train_eval_cached(config.model)
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
  val_curve_alt = [(l["step"], l["val_loss_alt"]) for l in lines if "val_loss_alt" in l]
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
      # the second set of validation windows at ``alt_eval_steps`` and the last step
      "val_curve_alt": val_curve_alt,
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

  Raises:
    ValueError: :func:`experiments.harness.preflight.check_run` refuses the run before anything
      is allocated (data too short for ``seq_len``, bytes out of the vocabulary, not enough
      memory).

  Returns:
    ``{"final_val_loss", "final_val_loss_alt", "diverged", "diverged_at", "tokens_per_s", "steps_done",
    "val_curve": [(step, val_loss)], "train_curve": [(step, loss)], "init", "corpus"}``.
    ``final_val_loss`` is ``None`` for a diverged run.
  """
  if not isinstance(config, TrainConfig):
    raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}.")
  corpus = corpus if corpus is not None else data_lib.load_corpus(config.data)
  preflight.check_run(config, corpus, 1 if mesh is None else int(mesh.devices.size))
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
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
