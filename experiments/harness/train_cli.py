"""Command line of one training run: ``python -m experiments train --help``.

Builds a :class:`~experiments.harness.train_config.TrainConfig` from the options and runs
:func:`experiments.harness.train.train` (or, with ``--compare-norm-impl``,
:func:`experiments.harness.probes.compare_norm_impl`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import pathlib

import jax

from experiments import argtypes
from experiments.argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from experiments.harness import data as data_lib
from experiments.harness import distributed
from experiments.harness.probes import compare_norm_impl
from experiments.harness.sharding import make_mesh
from experiments.harness.train import train
from experiments.harness.train_config import SCHEDULES, TrainConfig
from jaxnorm import CASTINGS
from jaxnorm.models import (
  ACTIVATIONS,
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


def _beta(text: str) -> float:
  v = nonneg_float(text)
  if v >= 1:
    raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
  return v


# Option names that differ from their field's name (kept for the commands already in use).
_NAMES = {"n_layers": "layers", "n_heads": "heads"}
# Fields the command line does not expose: set by the command from other options.
_SKIP = {"model", "vocab_size", "max_len"}
# The options' allowed values, where the config module names them.
_CHOICES = {"norm_position": NORM_POSITIONS, "norm_type": NORM_TYPES, "norm_impl": NORM_IMPLS, "init": INITS,
            "positions": POSITIONS, "dtype": DTYPES, "activation": ACTIVATIONS, "casting": CASTINGS,
            "schedule": SCHEDULES, "qk_norm": QK_NORMS, "qk_norm_scale": QK_NORM_SCALES}
# Numeric fields that may be 0 (every other int or float must be positive); the betas are in [0, 1).
_NONNEG = {"steps", "warmup", "seed", "eval_every", "checkpoint_every", "epsilon", "weight_decay"}
_BETAS = {"b1", "b2"}
# The types of the tuple fields: comma-separated on the command line.
_TUPLES = {"pointwise_alpha": argtypes.float_pair, "alt_eval_steps": argtypes.positive_ints}
# The command's own defaults where they differ from the dataclasses'.
_DEFAULTS = {"d_ff": None}
_HELP = {"d_ff": "MLP width (default 4*d-model)", "data": "UTF-8 text file (default: stdlib sources)"}


def _attribute_docs(cls) -> dict[str, str]:
  """``{field: the first sentence of its description}`` from the ``Attributes:`` section of ``cls``."""
  out, name, in_attrs = {}, None, False
  for line in (cls.__doc__ or "").splitlines():
    text = line.strip()
    if text == "Attributes:":
      in_attrs = True
    elif in_attrs and line.startswith("    ") and not line.startswith("      ") and ":" in text \
        and all(n.strip().isidentifier() for n in text.split(":", 1)[0].split(",")):
      names, doc = text.split(":", 1)
      name = [n.strip() for n in names.split(",")]   # "b1, b2: AdamW betas." documents both
      for n in name:
        out[n] = doc.strip()
    elif in_attrs and name and line.startswith("      ") and text:
      for n in name:
        out[n] += " " + text
    elif in_attrs and not text:
      name = None
  clean = {}
  for k, v in out.items():
    v = re.sub(r":\w+:`~?([^`]*)`", r"\1", v).replace("``", "")
    v = "".join(c if c.isprintable() else " " for c in v)
    clean[k] = (v.split(". ")[0].rstrip(".") + ".").replace("%", "%%")
  return clean


def _add_fields(group, cls) -> list[str]:
  """One option per field of the dataclass ``cls`` (its type, default, choices and docstring line).

  Returns:
    The field names added (their ``dest``).
  """
  docs = _attribute_docs(cls)
  added = []
  for f in dataclasses.fields(cls):
    if f.name in _SKIP:
      continue
    opt = "--" + _NAMES.get(f.name, f.name).replace("_", "-")
    default = _DEFAULTS.get(f.name, f.default)
    kw = {"dest": f.name, "help": _HELP.get(f.name, docs.get(f.name))}
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if kind == "bool":
      if default:
        kw["help"] = "turn off (default on): " + (kw["help"] or f.name)
        group.add_argument("--no-" + opt[2:], action="store_false", **kw)
      else:
        group.add_argument(opt, action="store_true", **kw)
    elif kind == "tuple":
      group.add_argument(opt, type=_TUPLES[f.name], default=default, **kw)
    elif f.name in _CHOICES:
      group.add_argument(opt, choices=_CHOICES[f.name], default=default, **kw)
    elif kind.startswith("int"):
      group.add_argument(opt, type=nonneg_int if f.name in _NONNEG else positive_int, default=default, **kw)
    elif kind.startswith("float"):
      cast = _beta if f.name in _BETAS else (nonneg_float if f.name in _NONNEG else positive_float)
      cast = argtypes.epsilon if f.name == "epsilon" else cast
      group.add_argument(opt, type=cast, default=default, **kw)
    else:
      group.add_argument(opt, default=default, **kw)
    added.append(f.name)
  return added


def build_parser() -> argparse.ArgumentParser:
  """The ``python -m experiments train`` argument parser.

  The model and training options are built from the fields of
  :class:`~jaxnorm.models.TransformerConfig` and
  :class:`~experiments.harness.train_config.TrainConfig` (type, default, allowed values, the
  first line of each field's docstring), so a new field becomes an option without being declared
  twice; the parser records the field names in ``model_fields`` and ``train_fields``.
  """
  p = argparse.ArgumentParser(
      prog="python -m experiments train",
      description="Train a byte-level Transformer LM (Pre-/Post-Norm study) on CPU/GPU/TPU.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.model_fields = _add_fields(p.add_argument_group("model"), TransformerConfig)
  t = p.add_argument_group("training")
  p.train_fields = _add_fields(t, TrainConfig)
  t.add_argument("--out", type=argtypes.folder, default=None,
                 help="run folder (default results/train/<position>-<type>-<impl>-s<seed>)")
  t.add_argument("--no-progress", action="store_true", help="no bar and no log lines")
  s = p.add_argument_group("scale-out")
  s.add_argument("--devices", type=nonneg_int, default=0,
                 help="data-parallel over this many devices (0: all; 1: no mesh)")
  s.add_argument("--coordinator-address", default=None,
                 help="multi-process: host:port of process 0 (or $JAX_COORDINATOR_ADDRESS)")
  s.add_argument("--num-processes", type=positive_int, default=None,
                 help="multi-process: number of processes (or $JAX_NUM_PROCESSES)")
  s.add_argument("--process-id", type=nonneg_int, default=None,
                 help="multi-process: this process's index (or $JAX_PROCESS_ID)")
  b = p.add_argument_group("benchmark")
  b.add_argument("--compare-norm-impl", action="store_true",
                 help="instead of training, print tokens/s of jaxnorm vs flax norms")
  return p


def flags_named(parser: argparse.ArgumentParser, text: str) -> list[str]:
  """The options of ``parser`` whose field (``dest``) ``text`` names, as the command line spells
  them (``n_heads`` -> ``--heads``), in the order ``text`` names them."""
  found = {}
  for a in parser._actions:
    m = re.search(rf"\b{re.escape(a.dest)}\b", text) if a.option_strings else None
    if m and a.dest != "help":
      found.setdefault(a.option_strings[0], m.start())
  return sorted(found, key=found.get)


def _refuse(parser: argparse.ArgumentParser, e: Exception) -> None:
  """Exits with argparse's error (status 2) for what the configs or the multi-process setup
  refuse after parsing, naming the options involved: ``--heads/--d-model: n_heads=4 must divide
  d_model=30; ...``."""
  flags = flags_named(parser, str(e))
  parser.error(f"{'/'.join(flags)}: {e}" if flags else str(e))


def main(argv: list[str] | None = None) -> int:
  """Entry point of ``python -m experiments train``; returns the exit status."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.data is not None and not pathlib.Path(args.data).is_file():
    parser.error(f"--data: file {args.data!r} does not exist or is not a file")
  try:
    fields = {name: getattr(args, name) for name in parser.model_fields}
    fields["d_ff"] = fields["d_ff"] or 4 * args.d_model
    model = TransformerConfig(max_len=args.seq_len, **fields)
    config = TrainConfig(model=model, **{name: getattr(args, name) for name in parser.train_fields})
    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  except (TypeError, ValueError) as e:
    _refuse(parser, e)

  if args.compare_norm_impl:
    res = compare_norm_impl(model, batch_size=args.batch_size, seq_len=args.seq_len,
                            steps=max(5, min(args.steps, 30)), seed=args.seed)
    print(f"{'norm_impl':>10} {'tokens/s':>12} {'step ms':>9} {'compile s':>10}")
    for impl in ("jaxnorm", "flax"):
      r = res[impl]
      print(f"{impl:>10} {r['tokens_per_s']:>z12,.0f} {r['step_ms']:>z9.2f} {r['compile_s']:>z10.2f}")
    print(f"ratio jaxnorm/flax tokens/s: {res['ratio']:z.3f} ({model.norm_type}, "
          f"{model.n_layers} layers, d_model {model.d_model}, batch {args.batch_size}x"
          f"{args.seq_len}, backend {jax.default_backend()})")
    return 0

  n_dev = jax.device_count() if args.devices == 0 else args.devices
  if n_dev > jax.device_count():
    parser.error(f"--devices {n_dev} exceeds the {jax.device_count()} available devices")
  mesh = make_mesh(jax.devices()[:n_dev]) if n_dev > 1 else None
  out = args.out or os.path.join(
      "results", "train",
      f"{args.norm_position}-{args.norm_type}-{args.norm_impl}-L{args.n_layers}-s{args.seed}")
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
    print(f"final val loss {summary['final_val_loss']:z.4f} nats/byte (unigram baseline "
          f"{baseline:z.4f}) after {summary['steps_done']} steps; "
          f"{(tps or 0):z,.0f} tokens/s; run in {out}")
  return 0
