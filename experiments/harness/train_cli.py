"""Command line of one training run: ``python -m experiments train --help``.

Builds a :class:`~experiments.harness.train_config.TrainConfig` from the options and runs
:func:`experiments.harness.train.train` (or, with ``--compare-norm-impl``,
:func:`experiments.harness.probes.compare_norm_impl`).
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib

import jax

from experiments.harness import data as data_lib
from experiments.harness import distributed
from experiments.harness.probes import compare_norm_impl
from experiments.harness.sharding import make_mesh
from experiments.harness.train import train
from experiments.harness.train_config import SCHEDULES, TrainConfig
from jaxnorm.models import (
  DTYPES,
  INITS,
  NORM_IMPLS,
  NORM_POSITIONS,
  NORM_TYPES,
  POSITIONS,
  QK_NORM_SCALES,
  QK_NORMS,
  TransformerConfig,
)

__all__ = ["build_parser", "main"]


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
  m.add_argument("--norm-type", choices=NORM_TYPES, default="layer_norm")
  m.add_argument("--norm-impl", choices=NORM_IMPLS, default="jaxnorm")
  m.add_argument("--layers", type=_positive_int, default=4, help="number of blocks")
  m.add_argument("--d-model", type=_positive_int, default=128)
  m.add_argument("--heads", type=_positive_int, default=4)
  m.add_argument("--d-ff", type=_positive_int, default=None, help="MLP width (default 4*d-model)")
  m.add_argument("--init", choices=INITS, default="xavier")
  m.add_argument("--qk-zero-init", action="store_true", help="start with W^Q = W^K = 0")
  m.add_argument("--no-fuse-residual-norm", dest="fuse_residual_norm", action="store_false",
                 help="set fuse_residual_norm off: each residual add and the norm after it "
                      "run as two ops, not one fused add+norm op (jaxnorm modules)")
  m.add_argument("--positions", choices=POSITIONS, default="learned")
  m.add_argument("--epsilon", type=_nonneg_float, default=1e-6)
  m.add_argument("--dtype", choices=DTYPES, default="float32", help="compute dtype")
  m.add_argument("--qk-norm", choices=QK_NORMS, default="none",
                 help="normalize queries and keys per head (after the projections, before RoPE)")
  m.add_argument("--qk-norm-scale", choices=QK_NORM_SCALES, default="per_head",
                 help="one QK-norm scale per head, or one shared by the heads")
  m.add_argument("--norm-scaling", action="store_true",
                 help="LayerNorm Scaling: the input norms of layer l output N(x)/sqrt(l)")
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
  t.add_argument("--no-log-attention", dest="log_attention", action="store_false",
                 help="do not log the per-layer largest attention logit and attention entropy")
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
        dtype=args.dtype, fuse_residual_norm=args.fuse_residual_norm, qk_norm=args.qk_norm,
        qk_norm_scale=args.qk_norm_scale, norm_scaling=args.norm_scaling)
    config = TrainConfig(
        model=model, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
        lr=args.lr, warmup=args.warmup, schedule=args.schedule, b1=args.b1, b2=args.b2,
        weight_decay=args.weight_decay, clip_norm=args.clip_norm, seed=args.seed,
        eval_every=args.eval_every, eval_batches=args.eval_batches,
        checkpoint_every=args.checkpoint_every, divergence_loss=args.divergence_loss,
        data=args.data, log_update_size=args.log_update_size,
        log_residual_norms=args.log_residual_norms, log_attention=args.log_attention,
        fsdp=args.fsdp)
  except (TypeError, ValueError) as e:
    parser.error(str(e))

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
