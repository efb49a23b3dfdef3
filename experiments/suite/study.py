"""The protocol every study module follows, and the unit of work the planner counts.

A study is a module of :mod:`experiments.studies` registered in
:data:`experiments.suite.registry.EXPERIMENTS`. It declares, once:

* ``TITLE`` (its report section's heading), ``RAW_DATA`` (the data files the report links) and
  optionally ``HEADLINE`` (figures for the report's first screen);
* ``Config``: a frozen dataclass of its sizes (the preset's entry of the same name);
* ``units(cfg) -> list[Unit]``: every cached piece of work (training run, probe setting) in the
  order its ``run`` computes them; :mod:`experiments.suite.plan` derives the cost plan from these,
  so the planner never mirrors a study's loops;
* ``run(ctx, cfg) -> dict``: the summary (``claims`` included), written to ``done.json``;
* ``report_section(summary, rel) -> str``: its report section.

Optionally (:data:`OPTIONAL`; the report reads them through the registry and names no study):

* ``answer(summary) -> list[str]``: its sentences of the report's "What to use";
* ``instabilities(summary, scanned) -> list[str]``: its lines of the report's list of instabilities
  (``scanned``: the suite scanned every cached run for divergences and spikes, so list only what the
  scan cannot see);
* ``noise_line(summary, eval_bytes) -> str | None``: the limitations' line on the study's own evaluation noise
  where it measured it, given its own evaluation size (every study that gives one has its line; the studies
  that train without one share a line with the estimate at their own sizes, issue 63);
* ``TIMED_STEPS = True``: its preset entry's ``steps`` are timed steps, not a training run's length;
* ``fresh_answer(summary) -> list[str]``: its sentences for a fresh-seed run beside the report's own (a
  preset's ``confirmation_results``; default: ``answer``);
* ``appendix_note(summary) -> str | None``: a line the appendix prints above its verdict tables (how to read
  this run's rows, e.g. the committed gpu run's verdicts judged by an older commit's rules).

:mod:`experiments.suite.reanalyse` reads two more: ``reanalyse(ctx, cfg, summary)`` (re-judge from the raw
data) and ``redraw(ctx, cfg, summary)`` (figures and non-verdict fields again).

A new study (for example a QK-norm learning-rate study) adds its module with these six names,
one ``EXPERIMENTS`` entry, one preset entry per preset and its claims in
:mod:`experiments.suite.claims`; :func:`load` checks the protocol when the suite imports it.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

__all__ = ["OPTIONAL", "REQUIRED", "Study", "Unit", "load"]

REQUIRED = ("TITLE", "RAW_DATA", "Config", "units", "run", "report_section")
OPTIONAL = ("HEADLINE", "answer", "instabilities", "noise_line", "TIMED_STEPS", "appendix_note", "fresh_answer")


@dataclasses.dataclass(frozen=True)
class Unit:
  """One cached piece of work: a training run or a probe setting.

  Attributes:
    experiment: the study's name.
    label: unique within the study.
    n_layers: depth of the model it builds (0 for an op timing).
    steps: training steps (0 for a probe without training).
    compile_key: units with equal keys share their compilations.
    kind: ``"train"``, ``"grad"`` (gradients at init), ``"update"``, ``"throughput"`` or ``"op"``.
    seq_len: the sequence length of its batches when it differs from the preset's (``None``: the
      preset's; the cost model prices the step at this length).
    batch_size: the batch of its steps when a study sets its own layout (``None``: the preset's; the cost
      model prices a measured ``(batch_size, seq_len)`` layout where it has one).
    run_key: what makes the training run itself (depth, layout, norm, init, rate, warm-up, decay, steps,
      seed), or ``()``: units of equal non-empty keys are one cached run (the suite's cache finds it by its
      config) and are priced once. A rate may be written ``("lr/d", c)``: ``c / d_model`` rounded as the
      warm-up grid rounds it, resolved with the preset's width by the planner.
  """

  experiment: str
  label: str
  n_layers: int
  steps: int
  compile_key: tuple
  kind: str = "train"
  seq_len: int | None = None
  batch_size: int | None = None
  run_key: tuple = ()


def train_unit(experiment: str, label: str, n_layers: int, steps: int, position: str, norm: str = "layer_norm",
               impl: str = "jaxnorm", run_key: tuple = ()) -> Unit:
  """A training run's unit; its compile key leaves out the init (it changes the parameters, not
  the program, and JAX's persistent compilation cache finds the compiled program)."""
  return Unit(experiment, label, n_layers, steps, ("train", n_layers, position, norm, impl), run_key=run_key)


@runtime_checkable
class Study(Protocol):
  """The module protocol of a study (see the module docstring)."""

  TITLE: str
  RAW_DATA: tuple
  Config: type

  def units(self, cfg: Any) -> list[Unit]: ...

  def run(self, ctx: Any, cfg: Any) -> dict: ...

  def report_section(self, summary: dict, rel: str) -> str: ...


def load(module_name: str) -> ModuleType:
  """Imports a study module and checks that it follows the protocol.

  Raises:
    TypeError: the module lacks one of :data:`REQUIRED`, or its ``Config`` is not a dataclass.
  """
  module = importlib.import_module(module_name)
  missing = [n for n in REQUIRED if not hasattr(module, n)]
  if missing:
    raise TypeError(f"study module {module_name!r} must define {list(REQUIRED)}; missing {missing}.")
  if not dataclasses.is_dataclass(module.Config):
    raise TypeError(f"{module_name}.Config must be a dataclass, got {module.Config!r}.")
  return module
