r"""Training harness: one jitted AdamW step, divergence as a result, sharding, orbax resume.

:func:`train` trains a :class:`jaxnorm.models.TransformerLM` on a byte-level corpus
(:mod:`experiments.data`) and writes, incrementally, ``out_dir/config.json`` and
``out_dir/metrics.jsonl`` (one JSON object per logged step and per evaluation), so nothing that
was logged is lost when a run dies. With ``checkpoint_every > 0`` it saves orbax checkpoints to
``out_dir/ckpt`` and, when started again on the same ``out_dir``, resumes from the latest one and
reproduces the loss curve of an uninterrupted run exactly (batches depend only on the seed and
the step index).

The optimizer is AdamW (optax) with linear warm-up over ``W`` steps followed by

.. math::

   \eta_s = \eta \sqrt{\frac{\tau}{\tau + s - W - 1}} \;\text{(inverse\_sqrt)}, \qquad
   \eta_s = \eta\Big(0.1 + 0.9 \cdot \tfrac12\big(1 + \cos\tfrac{\pi (s - W - 1)}{S - W}\big)\Big)
   \;\text{(cosine)}

for update ``s = W+1..S`` (``tau = W``, or ``max(1, S // 10)`` when ``W = 0``; ``constant``
keeps :math:`\eta`), optional global-norm clipping, and weight decay on matrices only.

Each step reports the loss, the global gradient norm (before clipping), the per-layer gradient
norms of every block's ``attn_qkv``, ``attn_out``, ``mlp_in`` and ``mlp_out`` matrix, the
update/parameter norm ratio :math:`\|\Delta\theta\| / \|\theta\|`, and optionally the mean squared
residual entering each norm and the "model update" :math:`\|f(x;\theta_s) - f(x;\theta_0)\|` on a
fixed batch (DeepNet, Admin) -- all computed inside the jitted step.

A NaN/Inf loss or a loss above ``divergence_loss`` stops the run and is recorded as
``"diverged_at": k``; it is a result, never an exception.

Command line: ``python -m experiments train --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments import data as data_lib
from jaxnorm.models import TransformerConfig, TransformerLM, block_weight_paths
from jaxnorm.models._transformer import DTYPES, INITS, NORM_IMPLS, NORM_POSITIONS, NORM_TYPES
from jaxnorm.models._transformer import POSITIONS, WEIGHT_GROUPS

__all__ = [
    "SCHEDULES",
    "TrainConfig",
    "compare_norm_impl",
    "compiled_steps",
    "grad_norms_at_init",
    "learning_rate_schedule",
    "main",
    "make_mesh",
    "model_update_size",
    "throughput",
    "train",
]

SCHEDULES = ("inverse_sqrt", "cosine", "constant")
EVAL_SEED = 1_000_003  # the validation batches are the same for every run (any training seed)
COSINE_FLOOR = 0.1     # cosine decays to this fraction of the peak learning rate


def _check_int(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int):
    raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}.")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}.")


def _check_float(name: str, value: Any, *, low: float, high: float | None = None,
                 low_open: bool = False) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f"{name} must be a finite number, got {value!r}.")
  if value < low or (low_open and value == low) or (high is not None and value >= high):
    bound = f"{'>' if low_open else '>='} {low}" + (f" and < {high}" if high is not None else "")
    raise ValueError(f"{name} must be {bound}, got {value}.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run (validated on construction).

  Attributes:
    model: the :class:`~jaxnorm.models.TransformerConfig`.
    steps: number of optimizer updates.
    batch_size: sequences per batch (global, over all devices).
    seq_len: tokens per sequence (<= ``model.max_len``).
    lr: peak learning rate.
    warmup: linear warm-up steps (0: none).
    schedule: decay after warm-up: ``"inverse_sqrt"``, ``"cosine"`` or ``"constant"``.
    b1, b2: AdamW betas.
    weight_decay: decoupled weight decay, applied to matrices (ndim >= 2) only.
    clip_norm: global-norm clipping threshold (``None``: no clipping).
    seed: seeds the initialization and the training batch stream.
    eval_every: evaluate on the validation batches every this many steps (0: only at the end).
    eval_batches: number of validation batches (fixed across runs).
    checkpoint_every: orbax checkpoint every this many steps (0: no checkpoints, no resume).
    divergence_loss: a loss above this (or NaN/Inf) stops the run as diverged.
    data: a UTF-8 text file, or ``None`` for the default stdlib corpus.
    log_grad_norms: log per-layer gradient norms.
    log_update_size: log the logits change on a fixed batch after each step.
    log_residual_norms: log E||x||^2/d of every norm input (``residual_sq_norm``) each step.
    log_every: write a metrics line every this many steps (the divergence check runs every
      step regardless).
    decay_timescale: ``tau`` of the inverse-sqrt decay (``None``: ``warmup`` or ``steps // 10``).
    fsdp: with a mesh, shard parameters and optimizer state over the devices (FSDP-style)
      instead of replicating them.
  """

  model: TransformerConfig
  steps: int = 300
  batch_size: int = 16
  seq_len: int = 128
  lr: float = 1e-3
  warmup: int = 0
  schedule: str = "inverse_sqrt"  # | "cosine" | "constant"
  b1: float = 0.9
  b2: float = 0.98
  weight_decay: float = 0.01
  clip_norm: float | None = None
  seed: int = 0
  eval_every: int = 50
  eval_batches: int = 4
  checkpoint_every: int = 0
  divergence_loss: float = 20.0
  data: str | None = None
  log_grad_norms: bool = True
  log_update_size: bool = False
  log_residual_norms: bool = False
  log_every: int = 1
  decay_timescale: int | None = None
  fsdp: bool = False

  def __post_init__(self):
    if not isinstance(self.model, TransformerConfig):
      raise TypeError(f"model must be a TransformerConfig, got {type(self.model).__name__}.")
    _check_int("steps", self.steps, 0)
    _check_int("batch_size", self.batch_size, 1)
    _check_int("seq_len", self.seq_len, 1)
    if self.seq_len > self.model.max_len:
      raise ValueError(f"seq_len={self.seq_len} exceeds the model's max_len="
                       f"{self.model.max_len}; raise model.max_len or lower seq_len.")
    _check_float("lr", self.lr, low=0.0, low_open=True)
    _check_int("warmup", self.warmup, 0)
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}.")
    _check_float("b1", self.b1, low=0.0, high=1.0)
    _check_float("b2", self.b2, low=0.0, high=1.0)
    _check_float("weight_decay", self.weight_decay, low=0.0)
    if self.clip_norm is not None:
      _check_float("clip_norm", self.clip_norm, low=0.0, low_open=True)
    _check_int("seed", self.seed, 0)
    _check_int("eval_every", self.eval_every, 0)
    _check_int("eval_batches", self.eval_batches, 1)
    _check_int("checkpoint_every", self.checkpoint_every, 0)
    _check_float("divergence_loss", self.divergence_loss, low=0.0, low_open=True)
    if self.data is not None and not isinstance(self.data, (str, os.PathLike)):
      raise TypeError(f"data must be a path string or None, got {type(self.data).__name__}.")
    _check_int("log_every", self.log_every, 1)
    if self.decay_timescale is not None:
      _check_int("decay_timescale", self.decay_timescale, 1)

  def to_dict(self) -> dict:
    """JSON-serializable nested dict (the content of ``config.json``)."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "TrainConfig":
    """Inverse of :meth:`to_dict`."""
    d = dict(d)
    d["model"] = TransformerConfig(**d["model"])
    return cls(**d)


# ----------------------------------------------------------------------------------------------
# Optimizer.


def _schedule_hyperparams(config: TrainConfig) -> dict[str, float]:
  """The numbers that shape the schedule, as floats (they live in the optimizer state)."""
  w, total = config.warmup, config.steps
  tau = config.decay_timescale or (w if w > 0 else max(1, total // 10))
  return {"peak_lr": float(config.lr), "warmup": float(w), "total": float(total),
          "tau": float(tau)}


def _lr_at(kind: str, count, peak_lr, warmup, total, tau):
  """Learning rate of update ``count + 1`` (``count`` = updates already done)."""
  s = jnp.asarray(count, jnp.float32) + 1.0  # 1-based update index
  warm = peak_lr * s / jnp.maximum(warmup, 1.0)
  after = s - warmup - 1.0  # 0 at the first update after warm-up (peak learning rate)
  if kind == "inverse_sqrt":
    decay = peak_lr * jnp.sqrt(tau / (tau + jnp.maximum(after, 0.0)))
  elif kind == "cosine":
    frac = jnp.clip(after / jnp.maximum(total - warmup, 1.0), 0.0, 1.0)
    decay = peak_lr * (COSINE_FLOOR + (1.0 - COSINE_FLOOR) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
  else:
    decay = peak_lr * jnp.ones_like(s)
  return jnp.where(s <= warmup, warm, decay)


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
  """The learning rate as a function of optax's update count (0 for the first update).

  See the module docstring for the formulas.
  """
  return functools.partial(_lr_at, config.schedule, **_schedule_hyperparams(config))


def _adamw(kind: str):
  def make(peak_lr, warmup, total, tau, b1, b2, weight_decay):
    schedule = functools.partial(_lr_at, kind, peak_lr=peak_lr, warmup=warmup, total=total,
                                 tau=tau)
    return optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay,
                       mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params))
  return make


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  """AdamW with the schedule, optional clipping, weight decay on matrices only.

  The learning rate, the schedule's shape (warm-up, length, timescale), the betas and the
  weight decay are injected hyper-parameters (``optax.inject_hyperparams``): they are arrays
  in the optimizer state, not constants of the compiled step, so runs that differ only in
  them (learning-rate or warm-up sweeps) share one compilation.
  """
  tx = optax.inject_hyperparams(_adamw(config.schedule))(
      **_schedule_hyperparams(config), b1=float(config.b1), b2=float(config.b2),
      weight_decay=float(config.weight_decay))
  if config.clip_norm is None:
    return tx
  return optax.chain(optax.clip_by_global_norm(config.clip_norm), tx)


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


def _get(tree, path):
  return functools.reduce(lambda t, k: t[k], path, tree)


def _loss(graphdef, params, inputs, targets, collect_stats=False):
  out = nnx.merge(graphdef, params)(inputs, collect_stats=collect_stats)
  logits, stats = out if collect_stats else (out, None)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
  return loss, stats


def _build_steps(graphdef, paths, config: TrainConfig, tx: optax.GradientTransformation):
  """The (un-jitted) train and eval step functions."""
  collect = config.log_residual_norms

  def train_step(params, opt_state, inputs, targets, fixed_inputs=None, ref_logits=None):
    (loss, stats), grads = jax.value_and_grad(
        functools.partial(_loss, graphdef, collect_stats=collect), has_aux=True)(
            params, inputs, targets)
    updates, opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "update_ratio": optax.tree.norm(updates) / optax.tree.norm(params),
        "lr": _current_lr(config.schedule, opt_state),
    }
    if config.log_grad_norms:
      for group in WEIGHT_GROUPS:
        metrics[group] = jnp.stack([jnp.linalg.norm(_get(grads, p)) for p in paths[group]])
    if collect:
      metrics["residual_sq_norm"] = stats["residual_sq_norm"]
    if fixed_inputs is not None:
      metrics["update_size"] = _logit_change(graphdef, new_params, fixed_inputs, ref_logits)
    return new_params, opt_state, metrics

  def eval_step(params, inputs, targets):
    return _loss(graphdef, params, inputs, targets)[0]

  return train_step, eval_step


def _current_lr(kind: str, opt_state):
  """The learning rate of the update just applied, from the (possibly chained) state."""
  is_inject = lambda x: hasattr(x, "hyperparams") and hasattr(x, "count")  # noqa: E731
  state = next(x for x in jax.tree.leaves(opt_state, is_leaf=is_inject) if is_inject(x))
  h = state.hyperparams
  return _lr_at(kind, state.count - 1, h["peak_lr"], h["warmup"], h["total"], h["tau"])


def _logit_change(graphdef, params, inputs, ref_logits):
  r"""RMS over positions of :math:`\|f(x;\theta)_{bt} - f(x;\theta_0)_{bt}\|_2`."""
  delta = nnx.merge(graphdef, params)(inputs) - ref_logits
  return jnp.sqrt(jnp.mean(jnp.sum(jnp.square(delta), axis=-1)))


# ----------------------------------------------------------------------------------------------
# Sharding.


def make_mesh(devices=None, axis_name: str = "data") -> jax.sharding.Mesh:
  """A 1-D mesh over ``devices`` (default: all devices, all processes) named ``axis_name``."""
  devices = jax.devices() if devices is None else list(devices)
  return jax.sharding.Mesh(np.asarray(devices), (axis_name,))


def _param_spec(x, n: int, axes) -> P:
  """FSDP: shard the largest dimension divisible by the mesh size, else replicate."""
  dims = [i for i in np.argsort(x.shape)[::-1] if x.shape[i] % n == 0 and x.shape[i] >= n]
  if not dims:
    return P()
  spec = [None] * x.ndim
  spec[int(dims[0])] = axes
  return P(*spec)


class _Placement:
  """Where arrays live: one device (``mesh=None``) or a mesh (batch split over all axes)."""

  def __init__(self, mesh, fsdp: bool, batch_size: int):
    self.mesh = mesh
    self.fsdp = fsdp
    if mesh is None:
      return
    axes = tuple(mesh.axis_names)
    self.axes = axes if len(axes) > 1 else axes[0]
    n = mesh.devices.size
    if batch_size % n:
      raise ValueError(f"batch_size={batch_size} must be divisible by the number of devices in "
                       f"the mesh ({n}) for data parallelism; use a multiple of {n}.")
    self.batch = NamedSharding(mesh, P(self.axes))
    self.replicated = NamedSharding(mesh, P())

  def tree_shardings(self, tree):
    if self.mesh is None:
      return None
    if not self.fsdp:
      return jax.tree.map(lambda _: self.replicated, tree)
    n = self.mesh.devices.size
    return jax.tree.map(
        lambda x: NamedSharding(self.mesh, _param_spec(x, n, self.axes)) if len(x.shape) else
        self.replicated, tree)

  def put_tree(self, tree):
    if self.mesh is None:
      return jax.device_put(tree)
    return jax.device_put(tree, self.tree_shardings(tree))

  def put_batch(self, x: np.ndarray):
    """A global batch (identical on every process) as an array sharded over the batch axis."""
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.make_array_from_callback(x.shape, self.batch, lambda idx: x[idx])


# Fields of TrainConfig that do not change the compiled steps (they are host-side only).
# Neither do the injected optimizer hyper-parameters (see make_optimizer).
_HOST_ONLY = dict(seed=0, eval_every=0, eval_batches=1, checkpoint_every=0,
                  divergence_loss=1.0, data=None, log_every=1, steps=0, lr=1.0, warmup=0,
                  b1=0.9, b2=0.98, weight_decay=0.0, decay_timescale=None)


@functools.lru_cache(maxsize=32)
def _compiled_steps_cached(key: TrainConfig, mesh):
  abstract = nnx.eval_shape(lambda: TransformerLM(key.model, rngs=nnx.Rngs(0)))
  graphdef, paths = nnx.graphdef(abstract), block_weight_paths(abstract)
  tx = make_optimizer(key)
  train_step, eval_step = _build_steps(graphdef, paths, key, tx)
  if mesh is None:
    return jax.jit(train_step, donate_argnums=(0, 1)), jax.jit(eval_step), graphdef
  placement = _Placement(mesh, key.fsdp, key.batch_size)
  params = nnx.to_pure_dict(nnx.state(abstract))
  ps = placement.tree_shardings(params)
  os_ = placement.tree_shardings(jax.eval_shape(tx.init, params))
  b, r = placement.batch, placement.replicated
  in_sh = (ps, os_, b, b) + ((b, b) if key.log_update_size else ())
  train = jax.jit(train_step, in_shardings=in_sh, out_shardings=(ps, os_, r),
                  donate_argnums=(0, 1))
  ev = jax.jit(eval_step, in_shardings=(ps, b, b), out_shardings=r)
  return train, ev, graphdef


def compiled_steps(config: TrainConfig, mesh=None):
  """The jitted ``(train_step, eval_step, graphdef)`` of a config, cached per process.

  Runs that differ only in host-side settings (seed, evaluation, checkpoint and logging
  intervals, data) or in the injected optimizer hyper-parameters (learning rate, warm-up,
  number of steps, betas, weight decay) share one compilation, so seed and learning-rate
  sweeps and resumed runs compile once.

  ``train_step(params, opt_state, inputs, targets[, fixed_inputs, ref_logits])`` returns
  ``(params, opt_state, metrics)`` and donates ``params`` and ``opt_state``;
  ``eval_step(params, inputs, targets)`` returns the mean loss.
  """
  return _compiled_steps_cached(dataclasses.replace(config, **_HOST_ONLY), mesh)


# ----------------------------------------------------------------------------------------------
# Logging helpers.


def _to_py(x):
  """Device metrics -> JSON-able Python values (non-finite floats become strings)."""
  x = np.asarray(x)
  if x.ndim == 0:
    v = float(x)
    return v if math.isfinite(v) else repr(v)
  return [_to_py(e) for e in x]


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


class _Progress:
  """tqdm bar on a terminal; plain log lines (about 20 per run) otherwise."""

  def __init__(self, progress: bool | None, start: int, total: int):
    tty = sys.stderr.isatty()
    self.bar_on = tty if progress is None else bool(progress)
    self.lines_on = (progress is None and not tty)
    self.every = max(1, total // 20)
    self.bar = None
    if self.bar_on:
      from tqdm.auto import tqdm
      self.bar = tqdm(total=total, initial=start, desc="train", unit="step", file=sys.stderr,
                      dynamic_ncols=True)

  def update(self, step: int, total: int, loss: float, tokens_per_s: float) -> None:
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
      self.bar.update(1)
    elif self.lines_on and (step % self.every == 0 or step == total):
      print(f"step {step}/{total}  loss {loss:.4f}  tokens/s {tokens_per_s:,.0f}",
            file=sys.stderr, flush=True)

  def message(self, text: str) -> None:
    if self.bar is not None:
      self.bar.write(text, file=sys.stderr)
    elif self.lines_on:
      print(text, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


# ----------------------------------------------------------------------------------------------
# Training.


def _diverged(loss: float, threshold: float) -> bool:
  return not math.isfinite(loss) or loss > threshold


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
    ``{"final_val_loss", "diverged", "diverged_at", "tokens_per_s", "steps_done",
    "val_curve": [(step, val_loss)], "train_curve": [(step, loss)], "init", "corpus"}``.
    ``final_val_loss`` is ``None`` for a diverged run.
  """
  if not isinstance(config, TrainConfig):
    raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}.")
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  corpus = corpus if corpus is not None else data_lib.load_corpus(config.data)
  placement = _Placement(mesh, config.fsdp, config.batch_size)
  mc = config.model

  graphdef, params, paths = init_params(mc, config.seed)
  tx = make_optimizer(config)
  opt_state = tx.init(params)
  params, opt_state = placement.put_tree(params), placement.put_tree(opt_state)

  # Resume from the latest checkpoint of the same config.
  manager, start = None, 0
  if config.checkpoint_every > 0:
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
    if latest is not None:
      target = {"params": params, "opt_state": opt_state}
      abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
      restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
      params, opt_state, start = restored["params"], restored["opt_state"], int(latest)

  if _is_main_process():
    record = {"train": config.to_dict(), "init": mc.init, "corpus": corpus.describe(),
              "devices": 1 if mesh is None else int(mesh.devices.size),
              "processes": jax.process_count(), "backend": jax.default_backend()}
    (out_dir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
  writer = _MetricsWriter(out_dir / "metrics.jsonl", keep_until=start if start else None)
  if not start:
    writer.lines.clear()

  train_step, eval_step, _ = compiled_steps(config, mesh)
  eval_data = [data_lib.batch_at(corpus.valid, i, batch_size=config.batch_size,
                                 seq_len=config.seq_len, seed=EVAL_SEED)
               for i in range(config.eval_batches)]
  eval_data = [(placement.put_batch(x), placement.put_batch(y)) for x, y in eval_data]
  extra = ()
  if config.log_update_size:
    fixed = eval_data[0][0]
    ref_logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, fixed)
    extra = (fixed, ref_logits)

  def evaluate(step: int) -> float:
    val = float(np.mean([float(eval_step(params, x, y)) for x, y in eval_data]))
    writer.write({"step": step, "val_loss": val if math.isfinite(val) else repr(val)})
    return val

  bar = _Progress(progress, start, config.steps)
  diverged_at, tokens, timed_s, val = None, 0, 0.0, None
  if start == 0:
    val = evaluate(0)
  end = config.steps if stop_after is None else min(config.steps, start + stop_after)
  tokens_per_step = config.batch_size * config.seq_len
  try:
    for step in range(start + 1, end + 1):
      inputs, targets = data_lib.batch_at(corpus.train, step - 1, batch_size=config.batch_size,
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
        line = {"step": step, **{k: _to_py(v) for k, v in metrics.items()}, "tokens_per_s": tps}
        writer.write(line)
      bar.update(step, config.steps, loss, tps)
      if _diverged(loss, config.divergence_loss):
        diverged_at = step
        writer.write({"step": step, "event": "diverged", "loss": _to_py(loss)})
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
  finally:
    bar.close()
    writer.close()
    if manager is not None:
      manager.wait_until_finished()
      manager.close()

  lines = writer.lines
  train_curve = [(l["step"], l["loss"]) for l in lines if "loss" in l and "event" not in l]
  val_curve = [(l["step"], l["val_loss"]) for l in lines if "val_loss" in l]
  steps_done = diverged_at if diverged_at is not None else end
  if diverged_at is None and val is None and val_curve:
    val = val_curve[-1][1]
  summary = {
      "final_val_loss": (None if diverged_at is not None or end < config.steps
                         else (val if isinstance(val, float) and math.isfinite(val) else None)),
      "diverged": diverged_at is not None,
      "diverged_at": diverged_at,
      "tokens_per_s": tokens / timed_s if timed_s > 0 else None,
      "steps_done": steps_done,
      "val_curve": val_curve,
      "train_curve": train_curve,
      "init": mc.init,
      "corpus": corpus.describe(),
  }
  if _is_main_process():
    (out_dir / "summary.json").write_text(json.dumps(summary) + "\n")
  return summary


# ----------------------------------------------------------------------------------------------
# Instrumentation at initialization and throughput.


def grad_norms_at_init(model_config: TransformerConfig, corpus: data_lib.Corpus, *,
                       batch_size: int, seq_len: int, seed: int, n_batches: int) -> dict:
  """Per-layer gradient norms and residual norms at initialization, averaged over batches.

  Returns:
    ``{"attn_qkv": [...], "attn_out": [...], "mlp_in": [...], "mlp_out": [...]}`` (one value
    per layer: the Frobenius norm of that layer's weight-matrix gradient), ``"grad_norm"`` (the
    global norm) and ``"residual_sq_norm"`` (E||x||^2/d of every norm input, in order), each the
    mean over ``n_batches`` training batches, for the model initialized with ``seed``.
  """
  _check_int("n_batches", n_batches, 1)
  graphdef, params, paths = init_params(model_config, seed)

  @jax.jit
  def one(params, inputs, targets):
    (_, stats), grads = jax.value_and_grad(
        functools.partial(_loss, graphdef, collect_stats=True), has_aux=True)(
            params, inputs, targets)
    out = {g: jnp.stack([jnp.linalg.norm(_get(grads, p)) for p in paths[g]])
           for g in WEIGHT_GROUPS}
    out["grad_norm"] = optax.tree.norm(grads)
    out["residual_sq_norm"] = stats["residual_sq_norm"]
    return out

  results = []
  for i in range(n_batches):
    x, y = data_lib.batch_at(corpus.train, i, batch_size=batch_size, seq_len=seq_len, seed=seed)
    results.append(jax.device_get(one(params, jnp.asarray(x), jnp.asarray(y))))
  mean = jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0), *results)
  return {k: _to_py(v) for k, v in mean.items()}


def model_update_size(model_config: TransformerConfig, train_config: TrainConfig,
                      corpus: data_lib.Corpus, *, steps: int = 1) -> list[float]:
  r"""The "model update" of DeepNet/Admin after each of the first ``steps`` updates.

  .. math::

     u_s = \Big(\frac{1}{BT}\sum_{b,t} \|f(x;\theta_s)_{bt} - f(x;\theta_0)_{bt}\|_2^2\Big)^{1/2}

  on a fixed validation batch ``x`` (the first evaluation batch), training with
  ``train_config`` (its ``model`` is replaced by ``model_config``).
  """
  _check_int("steps", steps, 1)
  config = dataclasses.replace(train_config, model=model_config, steps=max(steps, 1),
                               log_update_size=True)
  graphdef, params, _ = init_params(model_config, config.seed)
  opt_state = make_optimizer(config).init(params)
  train_step = compiled_steps(config)[0]
  fixed = jnp.asarray(data_lib.batch_at(corpus.valid, 0, batch_size=config.batch_size,
                                        seq_len=config.seq_len, seed=EVAL_SEED)[0])
  ref = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, fixed)
  sizes = []
  for step in range(steps):
    x, y = data_lib.batch_at(corpus.train, step, batch_size=config.batch_size,
                             seq_len=config.seq_len, seed=config.seed)
    params, opt_state, metrics = train_step(params, opt_state, jnp.asarray(x), jnp.asarray(y),
                                            fixed, ref)
    sizes.append(float(metrics["update_size"]))
  return sizes


def throughput(model_config: TransformerConfig, *, batch_size: int = 16, seq_len: int = 128,
               steps: int = 20, seed: int = 0, corpus: data_lib.Corpus | None = None,
               **train_kwargs) -> dict:
  """Training tokens/s of the jitted train step (compilation excluded) for one model config.

  ``train_kwargs`` are further :class:`TrainConfig` fields (``lr``, ``warmup``, ...). The step
  is the one :func:`train` uses (:func:`compiled_steps`, shared cache), so ``compile_s`` is
  near zero when that config was compiled before in this process.

  Returns:
    ``{"tokens_per_s", "step_ms", "compile_s", "norm_impl", "norm_type"}``.
  """
  _check_int("steps", steps, 1)
  corpus = corpus if corpus is not None else data_lib.load_corpus()
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
  _check_int("repeats", repeats, 1)
  best = {}
  for _ in range(repeats):
    for impl in ("jaxnorm", "flax"):
      r = throughput(dataclasses.replace(model_config, norm_impl=impl), **kwargs)
      if impl not in best or r["tokens_per_s"] > best[impl]["tokens_per_s"]:
        r["compile_s"] = best.get(impl, r)["compile_s"]  # the first call compiled
        best[impl] = r
  best["ratio"] = best["jaxnorm"]["tokens_per_s"] / best["flax"]["tokens_per_s"]
  return best


# ----------------------------------------------------------------------------------------------
# Command line.


def _number(cast, lower: float, strict: bool, what: str):
  """An argparse ``type=`` that parses with ``cast`` and requires a finite value above ``lower``
  (``> lower`` when ``strict``, else ``>=``), with an error that says what was expected."""

  def parse(text: str):
    try:
      value = cast(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    ok = math.isfinite(value) and (value > lower if strict else value >= lower)
    if not ok:
      raise argparse.ArgumentTypeError(
          f"expected {what} ({'>' if strict else '>='} {lower:g}), got {text}")
    return value

  return parse


_positive_int = _number(int, 0, True, "a positive integer")
_nonneg_int = _number(int, 0, False, "a non-negative integer")
_positive_float = _number(float, 0, True, "a positive number")
_nonneg_float = _number(float, 0, False, "a non-negative number")


def _beta(text: str) -> float:
  v = _nonneg_float(text)
  if v >= 1:
    raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
  return v


def build_parser() -> argparse.ArgumentParser:
  """The ``python -m experiments train`` argument parser (every option has a laptop default)."""
  p = argparse.ArgumentParser(
      prog="python -m experiments train",
      description="Train a byte-level Transformer LM (Pre-/Post-Norm study) on CPU/GPU/TPU.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  m = p.add_argument_group("model")
  m.add_argument("--norm-position", choices=NORM_POSITIONS, default="pre")
  m.add_argument("--norm-type", choices=NORM_TYPES, default="layernorm")
  m.add_argument("--norm-impl", choices=NORM_IMPLS, default="jaxnorm")
  m.add_argument("--layers", type=_positive_int, default=4, help="number of blocks")
  m.add_argument("--d-model", type=_positive_int, default=128)
  m.add_argument("--heads", type=_positive_int, default=4)
  m.add_argument("--d-ff", type=_positive_int, default=None, help="MLP width (default 4*d-model)")
  m.add_argument("--init", choices=INITS, default="xavier")
  m.add_argument("--qk-zero-init", action="store_true", help="start with W^Q = W^K = 0")
  m.add_argument("--positions", choices=POSITIONS, default="learned")
  m.add_argument("--epsilon", type=_nonneg_float, default=1e-6)
  m.add_argument("--dtype", choices=DTYPES, default="float32", help="compute dtype")
  t = p.add_argument_group("training")
  t.add_argument("--steps", type=_nonneg_int, default=300)
  t.add_argument("--batch-size", type=_positive_int, default=16)
  t.add_argument("--seq-len", type=_positive_int, default=128)
  t.add_argument("--lr", type=_positive_float, default=1e-3)
  t.add_argument("--warmup", type=_nonneg_int, default=0)
  t.add_argument("--schedule", choices=SCHEDULES, default="inverse_sqrt")
  t.add_argument("--b1", type=_beta, default=0.9)
  t.add_argument("--b2", type=_beta, default=0.98)
  t.add_argument("--weight-decay", type=_nonneg_float, default=0.01)
  t.add_argument("--clip-norm", type=_positive_float, default=None)
  t.add_argument("--seed", type=_nonneg_int, default=0)
  t.add_argument("--eval-every", type=_nonneg_int, default=50)
  t.add_argument("--eval-batches", type=_positive_int, default=4)
  t.add_argument("--checkpoint-every", type=_nonneg_int, default=0,
                 help="orbax checkpoint interval (0: none); re-running resumes")
  t.add_argument("--divergence-loss", type=_positive_float, default=20.0)
  t.add_argument("--data", default=None, help="UTF-8 text file (default: stdlib sources)")
  t.add_argument("--log-update-size", action="store_true")
  t.add_argument("--log-residual-norms", action="store_true")
  t.add_argument("--out", default=None,
                 help="run folder (default results/train/<position>-<type>-<impl>-s<seed>)")
  t.add_argument("--no-progress", action="store_true", help="no bar and no log lines")
  s = p.add_argument_group("scale-out")
  s.add_argument("--devices", type=_nonneg_int, default=0,
                 help="data-parallel over this many devices (0: all; 1: no mesh)")
  s.add_argument("--fsdp", action="store_true", help="shard parameters over the mesh too")
  s.add_argument("--coordinator-address", default=None,
                 help="multi-process: host:port of process 0 (or $JAX_COORDINATOR_ADDRESS)")
  s.add_argument("--num-processes", type=_positive_int, default=None,
                 help="multi-process: number of processes (or $JAX_NUM_PROCESSES)")
  s.add_argument("--process-id", type=_nonneg_int, default=None,
                 help="multi-process: this process's index (or $JAX_PROCESS_ID)")
  b = p.add_argument_group("benchmark")
  b.add_argument("--compare-norm-impl", action="store_true",
                 help="instead of training, print tokens/s of jaxnorm vs flax norms")
  return p


def main(argv: list[str] | None = None) -> int:
  """Entry point of ``python -m experiments train``; returns the exit status."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.data is not None and not pathlib.Path(args.data).is_file():
    parser.error(f"--data: file {args.data!r} does not exist or is not a file")
  try:
    model = TransformerConfig(
        max_len=args.seq_len, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
        d_ff=args.d_ff or 4 * args.d_model, norm_position=args.norm_position,
        norm_type=args.norm_type, norm_impl=args.norm_impl, init=args.init,
        qk_zero_init=args.qk_zero_init, positions=args.positions, epsilon=args.epsilon,
        dtype=args.dtype)
    config = TrainConfig(
        model=model, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
        lr=args.lr, warmup=args.warmup, schedule=args.schedule, b1=args.b1, b2=args.b2,
        weight_decay=args.weight_decay, clip_norm=args.clip_norm, seed=args.seed,
        eval_every=args.eval_every, eval_batches=args.eval_batches,
        checkpoint_every=args.checkpoint_every, divergence_loss=args.divergence_loss,
        data=args.data, log_update_size=args.log_update_size,
        log_residual_norms=args.log_residual_norms, fsdp=args.fsdp)
  except (TypeError, ValueError) as e:
    parser.error(str(e))

  from experiments import distributed
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)

  if args.compare_norm_impl:
    res = compare_norm_impl(model, batch_size=args.batch_size, seq_len=args.seq_len,
                            steps=max(5, min(args.steps, 30)), seed=args.seed)
    print(f"{'norm_impl':>10} {'tokens/s':>12} {'step ms':>9} {'compile s':>10}")
    for impl in ("jaxnorm", "flax"):
      r = res[impl]
      print(f"{impl:>10} {r['tokens_per_s']:>12,.0f} {r['step_ms']:>9.2f} {r['compile_s']:>10.2f}")
    print(f"ratio jaxnorm/flax tokens/s: {res['ratio']:.3f} ({model.norm_type}, "
          f"{model.n_layers} layers, d_model {model.d_model}, batch {args.batch_size}x"
          f"{args.seq_len}, backend {jax.default_backend()})")
    return 0

  n_dev = jax.device_count() if args.devices == 0 else args.devices
  if n_dev > jax.device_count():
    parser.error(f"--devices {n_dev} exceeds the {jax.device_count()} available devices")
  mesh = make_mesh(jax.devices()[:n_dev]) if n_dev > 1 else None
  out = args.out or os.path.join(
      "results", "train",
      f"{args.norm_position}-{args.norm_type}-{args.norm_impl}-L{args.layers}-s{args.seed}")
  try:
    corpus = data_lib.load_corpus(args.data)
  except (OSError, ValueError) as e:
    parser.error(f"--data: {e}")
  baseline = data_lib.unigram_entropy_nats(corpus)
  summary = train(config, out, progress=False if args.no_progress else None, mesh=mesh,
                  corpus=corpus)
  if summary["diverged"]:
    print(f"diverged at step {summary['diverged_at']} (run recorded in {out})")
  else:
    tps = summary["tokens_per_s"]
    print(f"final val loss {summary['final_val_loss']:.4f} nats/byte (unigram baseline "
          f"{baseline:.4f}) after {summary['steps_done']} steps; "
          f"{(tps or 0):,.0f} tokens/s; run in {out}")
  return 0
