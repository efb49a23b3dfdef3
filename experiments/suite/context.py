"""What an experiment runs in: the :class:`Context` the suite hands it.

Split by role (issue 24): :mod:`experiments.suite.units` (the unit cache and the time budget),
:mod:`experiments.suite.runs` (training runs and their helpers) and
:mod:`experiments.suite.outputs` (logging, files, figures); :class:`Context` composes them. The
names below are re-exported from there.

:class:`Context` gives an experiment its folder, the preset, logging and progress, the corpus,
cached training runs (:class:`RunResult`) and cached probe results (:meth:`Context.cached`);
:func:`run_label` and :func:`train_run` build and run (or load) one training run from a spec,
shared by the warm-up, invariance and VJP experiments.

**Units and resuming**: see :mod:`experiments.suite.units`.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Callable

from experiments.suite.outputs import OutputsMixin
from experiments.suite.runs import RunResult, RunsMixin, run_label, train_run
from experiments.suite.units import OutOfBudget, UnitsMixin

__all__ = ["Context", "OutOfBudget", "RunResult", "run_label", "train_run"]


class Context(UnitsMixin, RunsMixin, OutputsMixin):
  """What an experiment gets from the suite: its folder, the preset, logging, progress,
  the corpus, and cached training runs.

  Attributes:
    root: the results folder.
    preset: the preset dict (see :mod:`experiments.suite.presets`).
    exp_dir: the folder of the experiment being run (set by the suite).
    progress: whether to draw progress bars (a TTY) or print plain lines.
  """

  def __init__(self, root: pathlib.Path, preset: dict, *, progress: bool,
               log: Callable[[str], None] | None = None):
    self.root = pathlib.Path(root)
    self.preset = preset
    self.progress = progress
    self.exp_dir = self.root
    self.exp_name = ""
    self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    self._corpus = None
    self.deadline: float | None = None   # time.monotonic() by which new units must finish
    self.longest_unit_s = 0.0            # the longest unit computed in this invocation
    self.units_computed = 0
