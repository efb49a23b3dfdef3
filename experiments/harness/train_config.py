r"""Configuration of a training run and its optimizer: :class:`TrainConfig`, the schedule, AdamW.

The optimizer is AdamW (optax) with linear warm-up over ``W`` steps followed by

.. math::

   \eta_s = \eta \sqrt{\frac{\tau}{\tau + s - W - 1}} \;\text{(inverse\_sqrt)}, \qquad
   \eta_s = \eta\Big(0.1 + 0.9 \cdot \tfrac12\big(1 + \cos\tfrac{\pi (s - W - 1)}{S - W}\big)\Big)
   \;\text{(cosine)}

for update ``s = W+1..S`` (``constant`` keeps :math:`\eta`), optional global-norm clipping,
and weight decay on matrices only.

The decay timescale :math:`\tau` is the explicit setting ``decay_timescale``; by default it is
``max(1, S // 10)`` whatever the warm-up, so runs that differ only in the warm-up decay on the
same timescale. (Until issue 10, ``tau`` was ``W`` with warm-up and ``S // 10`` without, which
gave paired with/without warm-up runs different learning-rate areas.)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxnorm.models import TransformerConfig

__all__ = [
    "SCHEDULES",
    "TrainConfig",
    "check_int",
    "current_lr",
    "decay_mask",
    "describe_schedule",
    "learning_rate_schedule",
    "make_optimizer",
]

SCHEDULES = ("inverse_sqrt", "cosine", "constant")
COSINE_FLOOR = 0.1     # cosine decays to this fraction of the peak learning rate


def check_int(name: str, value: Any, minimum: int) -> None:
  """Raises ``TypeError`` unless ``value`` is a Python int, ``ValueError`` if it is below ``minimum``."""
  if isinstance(value, bool) or not isinstance(value, int):
    raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}.")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}.")


def _check_float(name: str, value: Any, *, low: float, high: float | None = None,
                 low_open: bool = False) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f"{name} must be a Python number, got {type(value).__name__} {value!r}.")
  if not math.isfinite(value):
    raise ValueError(f"{name} must be a finite number, got {value!r}.")
  if value < low or (low_open and value == low) or (high is not None and value >= high):
    bound = f"{'>' if low_open else '>='} {low}" + (f" and < {high}" if high is not None else "")
    raise ValueError(f"{name} must be {bound}, got {value}.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  r"""One training run (validated on construction).

  Attributes:
    model: the :class:`~jaxnorm.models.TransformerConfig`.
    steps: number of optimizer updates.
    batch_size: sequences per batch (global, over all devices).
    seq_len: tokens per sequence (<= ``model.max_len``).
    lr: peak learning rate.
    warmup: linear warm-up steps (0: none).
    schedule: decay after warm-up: ``"inverse_sqrt"``, ``"cosine"`` or ``"constant"``.
    b1, b2: AdamW betas.
    weight_decay: decoupled weight decay, applied to weight matrices and embeddings only: never
      to biases, norm scales or other per-channel vectors, whatever their rank (stacked blocks
      give a norm scale the shape ``(n_layers, d)``; :func:`decay_mask`).
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
    log_attention: log, per layer, the largest attention logit (``attn_max_logit``) and the
      mean attention entropy in nats (``attn_entropy``) of every training step, and of the
      validation batches at every evaluation (``val_attn_max_logit``: the largest over the
      batches, ``val_attn_entropy``: the mean), all computed inside the jitted steps.
    log_every: write a metrics line every this many steps (the divergence check runs every
      step regardless).
    decay_timescale: ``tau`` of the inverse-sqrt decay (``None``: ``max(1, steps // 10)``,
      independent of the warm-up; set it explicitly, and equal, in runs a comparison pairs).
    fsdp: with a mesh, shard parameters and optimizer state over the devices (FSDP-style)
      instead of replicating them.
    train_bytes: the number of unique training bytes the batch stream draws its windows from
      (:func:`~experiments.harness.data.train_subset`: nested random chunks of the training split);
      ``None``: the whole split. The number of steps, and so the bytes processed, do not change:
      fewer unique bytes means more epochs over them (Verma 2026's design).
    alt_eval_steps: steps at which the model is also scored on the second set of validation windows
      (``val_curve_alt`` of the summary; the last step always is): the measured evaluation noise of a
      loss read before the end of the run, e.g. at the points of a training-length ladder.
    eval_train: at the end, also evaluate the final model on ``eval_batches`` fixed batches of the
      training bytes it was trained on (``final_train_loss``) and, for a DyT/Derf model, the
      fraction of saturated activations per norm input on them (``final_saturation``).
    z_loss: weight of the auxiliary z-loss :math:`z \cdot \overline{(\log Z)^2}` (:math:`\log Z`
      the log-partition of each position's logits; Wortsman et al. 2023 use 1e-4); 0: none.
      The logged ``loss`` and the validation loss stay the cross-entropy alone.
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
  log_attention: bool = True
  log_every: int = 1
  decay_timescale: int | None = None
  fsdp: bool = False
  z_loss: float = 0.0
  train_bytes: int | None = None
  alt_eval_steps: tuple = ()
  eval_train: bool = False

  def __post_init__(self):
    if not isinstance(self.model, TransformerConfig):
      raise TypeError(f"model must be a TransformerConfig, got {type(self.model).__name__}.")
    check_int("steps", self.steps, 0)
    check_int("batch_size", self.batch_size, 1)
    check_int("seq_len", self.seq_len, 1)
    if self.seq_len > self.model.max_len:
      raise ValueError(f"seq_len={self.seq_len} exceeds the model's max_len="
                       f"{self.model.max_len}; raise model.max_len or lower seq_len.")
    _check_float("lr", self.lr, low=0.0, low_open=True)
    check_int("warmup", self.warmup, 0)
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}.")
    _check_float("b1", self.b1, low=0.0, high=1.0)
    _check_float("b2", self.b2, low=0.0, high=1.0)
    _check_float("weight_decay", self.weight_decay, low=0.0)
    if self.clip_norm is not None:
      _check_float("clip_norm", self.clip_norm, low=0.0, low_open=True)
    check_int("seed", self.seed, 0)
    check_int("eval_every", self.eval_every, 0)
    check_int("eval_batches", self.eval_batches, 1)
    check_int("checkpoint_every", self.checkpoint_every, 0)
    _check_float("divergence_loss", self.divergence_loss, low=0.0, low_open=True)
    if self.data is not None and not isinstance(self.data, (str, os.PathLike)):
      raise TypeError(f"data must be a path string or None, got {type(self.data).__name__}.")
    check_int("log_every", self.log_every, 1)
    for name in ("log_grad_norms", "log_update_size", "log_residual_norms", "log_attention"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}.")
    _check_float("z_loss", self.z_loss, low=0.0)
    if self.decay_timescale is not None:
      check_int("decay_timescale", self.decay_timescale, 1)
    if self.train_bytes is not None:
      check_int("train_bytes", self.train_bytes, 1)
    if not isinstance(self.alt_eval_steps, (tuple, list)):
      raise TypeError(f"alt_eval_steps must be a tuple of steps, got {type(self.alt_eval_steps).__name__}.")
    for step in self.alt_eval_steps:
      check_int("alt_eval_steps[i]", step, 1)
      if step > self.steps:
        raise ValueError(f"alt_eval_steps must lie in 1..steps={self.steps}, got {step}.")
    if not isinstance(self.eval_train, bool):
      raise TypeError(f"eval_train must be a bool, got {type(self.eval_train).__name__}.")

  def to_dict(self) -> dict:
    """JSON-serializable nested dict (the content of ``config.json``), as JSON reads it back (tuples such
    as the model's ``pointwise_alpha`` become lists), so a resumed run compares equal to its saved config."""
    return json.loads(json.dumps(dataclasses.asdict(self)))

  @classmethod
  def from_dict(cls, d: dict) -> "TrainConfig":
    """Inverse of :meth:`to_dict`."""
    d = dict(d)
    d["model"] = TransformerConfig(**d["model"])
    d["alt_eval_steps"] = tuple(d.get("alt_eval_steps", ()))
    return cls(**d)


def _schedule_hyperparams(config: TrainConfig) -> dict[str, float]:
  """The numbers that shape the schedule, as floats (they live in the optimizer state)."""
  w, total = config.warmup, config.steps
  tau = config.decay_timescale or max(1, total // 10)
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


def describe_schedule(config: TrainConfig) -> str:
  """One line saying what schedule a run had, for reports.

  Example: ``"inverse_sqrt, peak 0.001, warm-up 40, tau 50, 200 steps"``.
  """
  if not isinstance(config, TrainConfig):
    raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}.")
  h = _schedule_hyperparams(config)
  tau = f", tau {int(h['tau'])}" if config.schedule == "inverse_sqrt" else ""
  return (f"{config.schedule}, peak {config.lr:g}, warm-up {config.warmup}{tau}, "
          f"{config.steps} steps")


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
  """The learning rate as a function of optax's update count (0 for the first update).

  See the module docstring for the formulas.
  """
  return functools.partial(_lr_at, config.schedule, **_schedule_hyperparams(config))


# Leaf names never decayed: biases and norm scales, and the DyT/Derf scalars alpha and shift (issue 36;
# they are rank 0, or (n_layers,) when stacked, so the rank test alone already spares them).
NO_DECAY_NAMES = ("bias", "scale", "alpha", "shift")


def decay_mask(params):
  """Which leaves weight decay applies to: ``True`` for a leaf of rank >= 2 whose name (its last
  key) is not one of :data:`NO_DECAY_NAMES`; biases, norm scales and DyT/Derf's alpha and shift are
  never decayed, also when scanned blocks stack them into ``(n_layers, d)`` / ``(n_layers,)`` arrays."""
  def keep(path, p):
    last = path[-1]
    name = getattr(last, "key", getattr(last, "name", None))
    return p.ndim >= 2 and name not in NO_DECAY_NAMES
  return jax.tree_util.tree_map_with_path(keep, params)


def _adamw(kind: str):
  def make(peak_lr, warmup, total, tau, b1, b2, weight_decay):
    schedule = functools.partial(_lr_at, kind, peak_lr=peak_lr, warmup=warmup, total=total,
                                 tau=tau)
    return optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay,
                       mask=decay_mask)
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



def current_lr(kind: str, opt_state):
  """The learning rate of the update just applied, from the (possibly chained) state."""
  is_inject = lambda x: hasattr(x, "hyperparams") and hasattr(x, "count")  # noqa: E731
  state = next(x for x in jax.tree.leaves(opt_state, is_leaf=is_inject) if is_inject(x))
  h = state.hyperparams
  return _lr_at(kind, state.count - 1, h["peak_lr"], h["warmup"], h["total"], h["tau"])
