"""Checks a training run makes before it allocates anything: the data, the token range, the memory.

:func:`check_run` is called by :func:`experiments.harness.train.train` before the model is
built, so that a run that cannot work stops with one clear ``ValueError`` (which the command line
prints as one line) rather than an out-of-memory error from XLA, an error about a split the user
never chose, or a NaN from out-of-range token ids recorded as a divergence.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx

from experiments.harness import data as data_lib
from experiments.harness.train_config import TrainConfig
from jaxnorm.models import TransformerLM

__all__ = ["available_memory", "check_run", "estimate_bytes"]

# Bytes of optimizer-visible copies of each parameter: the parameter, its gradient and AdamW's
# two moments (float32).
_PARAM_COPIES = 4


def check_data(config: TrainConfig, corpus: data_lib.Corpus) -> None:
  """Every batch the run reads exists and holds ids the model embeds.

  Raises:
    ValueError: a split is not longer than ``seq_len + 1`` bytes (the message gives the data's
      size and both splits'), or a byte is ``>= vocab_size`` (the batches' ids would be out of
      the embedding's range; checked on the whole corpus, so on every batch).
  """
  need = config.seq_len + 1
  train = data_lib.train_subset(corpus.train, config.train_bytes)
  for split, data in (("training", train), ("validation", corpus.valid)):
    if data.size <= need:
      raise ValueError(
          f"the data ({corpus.name}) is too short for --seq-len {config.seq_len}: it has "
          f"{corpus.n_bytes} bytes, split into {corpus.train.size} training and "
          f"{corpus.valid.size} validation bytes, and the {split} windows need more than "
          f"{need} bytes ({data.size} there). Use a smaller --seq-len or more data.")
  vocab = config.model.vocab_size
  for split, data in (("training", corpus.train), ("validation", corpus.valid)):
    top = int(data.max()) if data.size else 0
    if top >= vocab:
      raise ValueError(f"the {split} data holds byte {top}, out of the model's vocab_size="
                       f"{vocab}; every token id must be in [0, {vocab}).")


def estimate_bytes(config: TrainConfig) -> int:
  """A lower bound of the memory one training step needs on one device, in bytes.

  The parameters with their gradient and AdamW's moments (the shapes from an abstract build of
  the model, nothing allocated), each block's ``(batch, seq, d_model)`` activations kept for the
  backward, and one layer's attention scores ``(batch, heads, seq, seq)`` in float32.
  """
  mc = config.model
  shapes = nnx.eval_shape(lambda: TransformerLM(mc, rngs=nnx.Rngs(0)))
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(shapes)))
  item = np.dtype(mc.dtype).itemsize
  tokens = config.batch_size * config.seq_len
  activations = tokens * mc.d_model * mc.n_layers * item * 4
  scores = config.batch_size * mc.n_heads * config.seq_len ** 2 * 4
  return n_params * 4 * _PARAM_COPIES + activations + scores


def available_memory() -> tuple[int | None, str]:
  """``(bytes, what)``: the first device's memory limit on an accelerator, the host's physical
  memory on a CPU; ``(None, ...)`` where neither is known."""
  dev = jax.devices()[0]
  if dev.platform != "cpu":
    stats = dev.memory_stats() or {}
    limit = stats.get("bytes_limit")
    return (int(limit) if limit else None), f"{dev.device_kind} memory"
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host memory"
  except (ValueError, OSError, AttributeError):
    return None, "host memory"


def check_memory(config: TrainConfig, devices: int = 1) -> None:
  """Refuses a run whose :func:`estimate_bytes` (per device: the batch split over ``devices``)
  exceeds :func:`available_memory`.

  Raises:
    ValueError: naming the estimate, the memory and the options that set it.
  """
  need = estimate_bytes(config) // max(devices, 1)
  have, what = available_memory()
  if have is not None and need > have:
    gib = 2 ** 30
    raise ValueError(
        f"this run needs at least {need / gib:z,.1f} GiB per device (--seq-len "
        f"{config.seq_len}, --batch-size {config.batch_size}, --d-model "
        f"{config.model.d_model}, --layers {config.model.n_layers}: parameters, optimizer "
        f"state, activations and the (seq, seq) attention scores), more than the "
        f"{have / gib:z,.1f} GiB of {what}; lower --seq-len or --batch-size.")


def check_run(config: TrainConfig, corpus: data_lib.Corpus, devices: int = 1) -> None:
  """:func:`check_memory` and :func:`check_data`: everything a run checks before allocating."""
  check_memory(config, devices)
  check_data(config, corpus)
