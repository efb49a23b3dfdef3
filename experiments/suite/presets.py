"""Sizes of the experiment suite: one preset per machine budget.

A preset fixes every size the suite uses (model width, depths, steps, learning rates, seeds) and
which studies it runs (``studies``; :func:`studies`), never a threshold of a claim: the verdict
criteria live in the studies' ``*_rules`` modules and do not change with the preset. Four presets:

* ``smoke``: what the tests run; about a minute on 2 CPU cores. Tiny models, a handful of
  steps, every study: it checks that every experiment produces its files and the report
  renders, and the structural facts that hold at any scale.
* ``cpu``: the README's main job, the flagship question (issue 31): the warm-up x learning-rate
  grid and the depth study, at most 15 minutes on 2 cores, install included, and at most 14
  minutes of experiments on an AVX2-only CPU by the cost model (``--list``). Width 64, 16 x 32
  tokens per step, 300-step runs, warm-ups 0 and 60, three rates, seeds 0-2; the sizes were
  chosen from pilot runs on seeds 100-102 (``experiments/results/pilots/README.md``) before the
  verdict rules were frozen. Pre-LN is not trained at 6 layers in the depth study and the update
  probe runs seed 0 only: budget cuts made after the first clean runs (the rule reads only
  Post-LN at 6 layers).
* ``cpu-extra``: the second command, every other study (gradients at init, invariance, speed,
  the derived VJP in training, QK-norm, LayerNorm Scaling, DyT/Derf across tokens per parameter),
  at most 20 minutes on an AVX2 CPU by the cost model; the sizes of the ``cpu`` report before issue
  31, QK-norm and LayerNorm Scaling on 3 seeds (issue 32), the ``dyt`` study sized by its pilots
  on seeds 100-102 (issue 36, ``experiments/results/pilots/dyt/README.md``).
* ``gpu``: the flagship studies on one H100, the ``cpu`` design at width 256 and 500 steps,
  about 6 minutes by the cost model (:mod:`experiments.suite.plan`; never measured end to end,
  not chosen by GPU pilots); ``--budget 7`` resumes a cut invocation. The other studies keep
  their GPU sizes here for ``--only NAME``.

The presets are data, in ``presets.toml`` next to this module (read by
:mod:`experiments.suite.tables`, arrays as tuples), with the reasons for their sizes as comments.
Each preset is a plain dict (so it is written verbatim into the results' provenance): ``model``
holds :class:`jaxnorm.models.TransformerConfig` fields shared by every experiment, ``train``
holds :class:`experiments.harness.train_config.TrainConfig` fields shared by every training run, and one entry
per experiment holds the fields of that module's ``Config`` dataclass.
"""

from __future__ import annotations

import copy
from typing import Any

from experiments.suite import tables

__all__ = ["PRESETS", "get_preset", "studies"]

PRESETS: dict[str, dict[str, Any]] = tables.load("presets.toml")


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
