"""Sizes of the experiment suite: one preset per machine budget.

A preset fixes every size the suite uses (model width, depths, steps, learning rates, seeds) and
which studies it runs (``studies``; :func:`studies`), never a threshold of a claim: the verdict
criteria live in the studies' ``*_rules`` modules and do not change with the preset. The presets:

* ``smoke``: what the tests run; about a minute on 2 CPU cores. Tiny models, a handful of
  steps, every study: it checks that every experiment produces its files and the report
  renders, and the structural facts that hold at any scale.
* ``cpu``: the README's main job, the flagship question: the training-length ladder (issue 50), the
  warm-up x learning-rate grid and the depth study, at most 20 minutes on a 2-core AVX2-only CPU,
  install included, and at most 18.5 minutes of experiments there by the cost model (``--list``).
  Width 64, 16 x 32 tokens per step; the grid's 200-step runs at five rates, warm-ups 0 and 40,
  seeds 10-12 (issue 44, ``experiments/results/pilots/flagship-44/``); the ladder's 1,200-step runs,
  seeds 20-22 (``experiments/results/pilots/scale/``). The sizes were chosen from pilot runs on seeds
  100-102 before the verdict rules were frozen.
* ``cpu-pilot``: the ``cpu`` grid and depth design on the pilot seeds (how issue 44 chose it).
* ``cpu-scale``: the sequence-length arm of issue 55 (16 x 32 against 2 x 256 tokens a step, the same
  model), at most 20 minutes on an AVX2 CPU by the cost model.
* ``cpu-extra``: the second command, every other study (gradients at init, invariance, speed,
  the derived VJP in training, QK-norm, LayerNorm Scaling, DyT/Derf across tokens per parameter),
  at most 20 minutes on an AVX2 CPU by the cost model; the sizes of the ``cpu`` report before issue
  31, QK-norm and LayerNorm Scaling on 3 seeds (issue 32), the ``dyt`` study sized by its pilots
  on seeds 100-102 (issue 36, ``experiments/results/pilots/dyt/README.md``).
* ``gpu``: the flagship studies and the ladder on one H100/H200 on the ``cpu`` design's terms (issue 50),
  at most 8 minutes by the cost model (:mod:`experiments.suite.plan`, calibrated on an H200 run of the
  older design; not measured end to end, not chosen by GPU pilots); ``--budget 7`` resumes a cut
  invocation. ``gpu-scale``: its sequence-length arm (issue 55). The other studies keep their GPU sizes
  in ``gpu`` for ``--only NAME``.
* ``cpu-extra-confirm``: ``cpu-extra``'s verdict-bearing studies (every one but ``speed``) with its
  sizes and rules on seeds 50-52 (``vjp``: seed 50), which no run had used: a fresh-seed confirmation
  of its verdicts (issue 63), compared claim by claim with ``python -m experiments.suite.compare_verdicts``.

The presets are data, in ``presets.toml`` next to this module (read by
:mod:`experiments.suite.tables`, arrays as tuples), with the reasons for their sizes as comments.
Each preset is a plain dict (so it is written verbatim into the results' provenance): ``model``
holds :class:`jaxnorm.models.TransformerConfig` fields shared by every experiment, ``train``
holds :class:`experiments.harness.train_config.TrainConfig` fields shared by every training run, and one entry
per experiment holds the fields of that module's ``Config`` dataclass. A preset with
``extends = "NAME"`` starts from preset NAME (resolved first) and replaces its top-level entries;
an experiment's table is merged field by field, so the derived preset states only what differs.
Besides sizes a preset may name ``pilot_results`` (the pilots' folders: the verdict table's "pilots
predicted" column), ``design_sources`` (per study, where its sizes came from: a Limitations line) and
``confirmation_results`` (a fresh-seed run's folder: the verdict table's "fresh seeds" column).
"""

from __future__ import annotations

import copy
from typing import Any

from experiments.suite import tables

__all__ = ["PRESETS", "get_preset", "studies"]



def _resolve(raw: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """``raw`` with every ``extends`` resolved (see the module docstring).

  Raises:
    ValueError: ``extends`` names no preset, or the chain of ``extends`` has a cycle.
  """
  out: dict[str, dict[str, Any]] = {}

  def build(name: str, chain: tuple[str, ...]) -> dict[str, Any]:
    if name in out:
      return out[name]
    if name in chain:
      raise ValueError(f"presets: extends must not cycle, got {' -> '.join(chain + (name,))}")
    own = dict(raw[name])
    base_name = own.pop("extends", None)
    if base_name is None:
      out[name] = own
      return own
    if base_name not in raw:
      raise ValueError(f"presets: {name}.extends must name a preset ({sorted(raw)}), got {base_name!r}")
    merged = copy.deepcopy(build(base_name, chain + (name,)))
    for key, value in own.items():
      if isinstance(value, dict) and isinstance(merged.get(key), dict):
        merged[key] = {**merged[key], **value}
      else:
        merged[key] = value
    out[name] = merged
    return merged

  for preset_name in raw:
    build(preset_name, ())
  return out


PRESETS: dict[str, dict[str, Any]] = _resolve(tables.load("presets.toml"))


def studies(preset: dict[str, Any]) -> list[str]:
  """The studies a preset runs, in the report's order: its ``studies`` entry (default: every
  registered study)."""
  from experiments.suite.registry import EXPERIMENTS
  chosen = preset.get("studies")
  return [n for n in EXPERIMENTS if chosen is None or n in chosen]


def get_preset(name: str) -> dict[str, Any]:
  """Returns a deep copy of the preset called ``name`` (with its ``name`` filled in).

  Raises:
    ValueError: ``name`` is not one of :data:`PRESETS`.
  """
  if name not in PRESETS:
    raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}.")
  preset = copy.deepcopy(PRESETS[name])
  preset["name"] = name
  return preset
