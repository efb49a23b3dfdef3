"""The training command line is built from the config dataclasses: one option per field."""

from __future__ import annotations

import dataclasses

from experiments.harness import train_cli
from experiments.harness.train_config import TrainConfig
from jaxnorm.models import TransformerConfig


def test_every_config_field_is_an_option_with_the_dataclass_default():
  p = train_cli.build_parser()
  dests = {a.dest: a for a in p._actions}
  for cls in (TransformerConfig, TrainConfig):
    for f in dataclasses.fields(cls):
      if f.name in train_cli._SKIP:
        continue
      assert f.name in dests, f"{cls.__name__}.{f.name} has no option"
      want = train_cli._DEFAULTS.get(f.name, f.default)
      assert dests[f.name].default == want, f.name
      assert dests[f.name].help, f.name
  args = p.parse_args(["--layers", "3", "--no-scan-layers", "--decay-timescale", "40", "--activation", "relu"])
  assert (args.n_layers, args.scan_layers, args.decay_timescale, args.activation) == (3, False, 40, "relu")
  assert set(p.model_fields) | set(p.train_fields) | train_cli._SKIP >= {
      f.name for cls in (TransformerConfig, TrainConfig) for f in dataclasses.fields(cls)}


def test_tuple_fields_take_comma_separated_values():
  """``--pointwise-alpha A,B`` and ``--alt-eval-steps S1,S2`` parse to the tuples the configs take
  (issue 65: they were passed on as plain strings, which the configs refused)."""
  p = train_cli.build_parser()
  args = p.parse_args(["--pointwise-alpha", "0.8, 0.2", "--alt-eval-steps", "10,20"])
  assert args.pointwise_alpha == (0.8, 0.2) and args.alt_eval_steps == (10, 20)
  model = TransformerConfig(norm_type="dyt", pointwise_alpha=args.pointwise_alpha)
  assert TrainConfig(model=model, steps=20, alt_eval_steps=args.alt_eval_steps).alt_eval_steps == (10, 20)


def test_flags_named_maps_config_fields_to_their_options():
  p = train_cli.build_parser()
  text = "n_heads=4 must divide d_model=30; fuse_residual_norm and qk_zero_init, not init"
  assert train_cli.flags_named(p, text) == ["--heads", "--d-model", "--no-fuse-residual-norm",
                                            "--qk-zero-init", "--init"]
