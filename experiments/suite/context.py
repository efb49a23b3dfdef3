"""What an experiment runs in: the :class:`Context` the suite hands it and shared run helpers.

:class:`Context` gives an experiment its folder, the preset, logging and progress, the corpus,
cached training runs (:class:`RunResult`) and cached probe results (:meth:`Context.cached`);
:func:`run_label` and :func:`train_run` build and run (or load) one training run from a spec,
shared by the warm-up, invariance and VJP experiments.

**Units and resuming.** Every piece of work an experiment does that costs more than its
analysis is a *unit*: one training run (:meth:`Context.train`, cached under
``<root>/runs/<label>-<hash>/``) or one probe setting (:meth:`Context.cached`, cached under
``<root>/cache/<experiment>/<label>-<hash>.json``), keyed by a hash of everything that
determines its result. A unit computed once is loaded on every later invocation, so a cut run
loses at most the unit in progress. With a time budget (``deadline``), a unit that is not
cached is started only if it is expected to finish in time (expected: the longest unit of this
invocation so far); otherwise :class:`OutOfBudget` is raised and the suite stops, to be
continued by the same command.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import pathlib
import shutil
import sys
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from experiments.suite.registry import from_json_float, read_json, to_jsonable, write_json

__all__ = ["Context", "OutOfBudget", "RunResult", "run_label", "train_run"]

_RUN_CACHE_VERSION = 1
_UNIT_CACHE_VERSION = 1


class OutOfBudget(Exception):
  """The next uncached unit would not finish before the invocation's deadline."""


def _hash(obj: Any) -> str:
  src = json.dumps(to_jsonable(obj), sort_keys=True)
  return hashlib.sha256(src.encode()).hexdigest()[:10]


@dataclasses.dataclass
class RunResult:
  """One finished training run: ``summary`` is what ``train()`` returned, ``metrics`` the
  parsed lines of its ``metrics.jsonl`` (train lines carry ``loss``, eval lines ``val_loss``)."""

  label: str
  path: pathlib.Path
  summary: dict
  metrics: list[dict]
  cached: bool

  def train_curve(self, key: str = "loss") -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``key`` over the train lines that have it."""
    rows = [m for m in self.metrics if key in m and "step" in m]
    steps = np.array([m["step"] for m in rows], dtype=np.int64)
    values = np.array([from_json_float(m[key]) for m in rows], dtype=np.float64)
    return steps, values

  def val_curve(self) -> tuple[np.ndarray, np.ndarray]:
    """(steps, val_loss) from the summary's ``val_curve``."""
    curve = self.summary.get("val_curve") or []
    steps = np.array([s for s, _ in curve], dtype=np.int64)
    values = np.array([from_json_float(v) for _, v in curve], dtype=np.float64)
    return steps, values


class Context:
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

  # ---------------------------------------------------------------- units and budget
  def _start_unit(self, label: str) -> float:
    """Raises :class:`OutOfBudget` if a unit of the expected length would end past the deadline."""
    now = time.monotonic()
    if self.deadline is not None and now + self.longest_unit_s > self.deadline:
      raise OutOfBudget(f"{label}: expected {self.longest_unit_s:.0f} s, "
                        f"{max(self.deadline - now, 0.0):.0f} s of the budget left")
    return now

  def _end_unit(self, t0: float) -> float:
    wall = time.monotonic() - t0
    self.longest_unit_s = max(self.longest_unit_s, wall)
    self.units_computed += 1
    return wall

  def cached(self, label: str, key: Any, compute: Callable[[], Any]) -> Any:
    """The result of ``compute()`` for ``key``, computed once and cached as JSON.

    The cache file is ``<root>/cache/<experiment>/<label>-<hash of key>.json``; ``key`` must
    hold everything the result depends on (the model config, sizes, seed, preset data). The
    result goes through JSON either way (:func:`to_jsonable`), so a cached and a fresh result
    look the same to the caller.
    """
    digest = _hash({"v": _UNIT_CACHE_VERSION, "key": key})
    path = self.root / "cache" / (self.exp_name or "suite") / f"{label.replace('/', '_')}-{digest}.json"
    if path.exists():
      return read_json(path)["result"]
    t0 = self._start_unit(label)
    result = to_jsonable(compute())
    wall = self._end_unit(t0)
    write_json(path, {"label": label, "key": key, "wall_s": wall, "result": result})
    return result

  # ---------------------------------------------------------------- output
  def log(self, msg: str) -> None:
    """Prints one progress line, prefixed with the time and the experiment's name."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    self._log(f"[{stamp}] {self.exp_name or 'suite'}: {msg}")

  def iterate(self, items: Iterable, *, desc: str, total: int | None = None) -> Iterator:
    """Iterates over ``items`` with a tqdm bar on a TTY, or with one plain line per item."""
    from experiments.harness import progress as progress_lib
    if self.progress:
      yield from progress_lib.iterate(items, desc=f"{self.exp_name}: {desc}", bar=True, log=None, total=total)
    else:
      yield from progress_lib.iterate(items, desc=desc, bar=False, log=self.log, total=total)

  # ---------------------------------------------------------------- data and models
  def corpus(self):
    """The corpus of the preset (``experiments.harness.data.load_corpus``), loaded once."""
    if self._corpus is None:
      from experiments.harness import data
      self._corpus = data.load_corpus(self.preset.get("data"))
    return self._corpus

  def model_config(self, **overrides):
    """A ``TransformerConfig`` with the preset's shared model fields and ``overrides``."""
    from jaxnorm.models import TransformerConfig
    fields = dict(self.preset.get("model", {}))
    fields.update(overrides)
    return TransformerConfig(**fields)

  def train_config(self, model, **overrides):
    """A ``TrainConfig`` for ``model`` with the preset's shared train fields and ``overrides``.

    Checkpointing is off (the suite caches whole runs instead) unless overridden.
    """
    from experiments.harness.train_config import TrainConfig
    fields = dict(self.preset.get("train", {}))
    fields.setdefault("checkpoint_every", 0)
    if self.preset.get("data") is not None:
      fields.setdefault("data", self.preset["data"])
    fields.update(overrides)
    return TrainConfig(model=model, **fields)

  def train(self, config, label: str) -> RunResult:
    """Runs ``train(config)`` once per distinct config and caches it under ``root/runs``.

    Experiments that need the same run (the Pre-LN baseline of the warm-up, invariance,
    speed and VJP experiments) share it. A run whose ``run.json`` exists is loaded, not
    recomputed.
    """
    key = _hash({"v": _RUN_CACHE_VERSION, "config": config})
    run_dir = self.root / "runs" / f"{label}-{key}"
    # The hash decides: a run cached under another label is the same run.
    for other in sorted((self.root / "runs").glob(f"*-{key}")):
      if (other / "run.json").exists():
        run_dir = other
        break
    done = run_dir / "run.json"
    if done.exists():
      summary = read_json(done)["summary"]
      return RunResult(label, run_dir, summary, _read_metrics(run_dir), cached=True)
    from experiments.harness import train as train_lib
    if run_dir.exists():  # an interrupted run: start it again from scratch
      shutil.rmtree(run_dir)
    t0 = self._start_unit(label)
    run_dir.mkdir(parents=True)
    self.log(f"train {label} ({config.steps} steps)")
    summary = train_lib.train(config, run_dir, progress=self.progress, corpus=self.corpus())
    wall = self._end_unit(t0)
    summary = dict(summary)
    summary["wall_s"] = wall
    write_json(done, {"label": label, "summary": summary, "config": config})
    final = summary.get("final_val_loss")
    self.log(f"  {label}: val_loss={_fmt(final)} diverged={summary.get('diverged')} "
             f"({wall:.0f} s)")
    return RunResult(label, run_dir, to_jsonable(summary), _read_metrics(run_dir), cached=False)

  # ---------------------------------------------------------------- files
  def save_json(self, name: str, obj: Any) -> pathlib.Path:
    """Writes ``obj`` as JSON (:func:`write_json`) to ``exp_dir / name``; returns the path."""
    path = self.exp_dir / name
    write_json(path, obj)
    return path

  def save_csv(self, name: str, header: list[str], rows: Iterable[Iterable[Any]]) -> pathlib.Path:
    """Writes a CSV file (floats with 6 significant digits)."""
    path = self.exp_dir / name
    lines = [",".join(header)]
    for row in rows:
      lines.append(",".join(_csv_cell(v) for v in row))
    path.write_text("\n".join(lines) + "\n")
    return path

  def subplots(self, *args, **kwargs):
    """``matplotlib.pyplot.subplots(*args, **kwargs)`` on the file-only Agg backend.

    Every experiment's ``plot`` starts here and ends with :meth:`save_figure`.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kwargs)

  def save_figure(self, fig, name: str) -> str:
    """Saves a matplotlib figure as a PNG (modest dpi) and closes it; returns the file name."""
    import matplotlib.pyplot as plt
    path = self.exp_dir / name
    fig.tight_layout()
    fig.savefig(path, dpi=self.preset.get("dpi", 90), bbox_inches="tight")
    plt.close(fig)
    return name


def _csv_cell(v: Any) -> str:
  if isinstance(v, (float, np.floating)):
    return f"{float(v):.6g}"
  return str(v)


def _fmt(x: Any) -> str:
  try:
    return f"{float(x):.4f}"
  except (TypeError, ValueError):
    return str(x)


def _read_metrics(run_dir: pathlib.Path) -> list[dict]:
  path = run_dir / "metrics.jsonl"
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    line = line.strip()
    if line:
      rows.append(json.loads(line))
  return rows


# -------------------------------------------------------------------- shared run helpers
def run_label(spec: dict, n_layers: int) -> str:
  """The label of a run spec (the warm-up experiment's key of its runs).

  ``"<position>-<norm>[-small]-L<n_layers>-lr<lr>-w<warmup>"`` (``-small`` for a non-Xavier
  init), e.g. ``"post-layer_norm-L6-lr0.001-w0"``.
  """
  init = "" if spec["init"] == "xavier" else "-small"
  return f"{spec['norm_position']}-{spec['norm_type']}{init}-L{n_layers}-lr{spec['lr']:g}-w{spec['warmup']}"


def train_run(ctx: Context, spec: dict, n_layers: int, steps: int, seed: int = 0, **extra) -> RunResult:
  """One (cached) training run of a spec; shared by the warm-up, invariance and VJP experiments.

  Args:
    ctx: the suite context (its preset supplies the shared model and train fields).
    spec: ``norm_position``, ``norm_type``, ``lr``, ``warmup`` and optionally ``init``
      (default ``"xavier"``) and ``norm_impl`` (then appended to the label).
    n_layers: model depth.
    steps: optimizer updates.
    seed: the training seed.
    **extra: further :class:`~experiments.harness.train_config.TrainConfig` fields.

  Returns:
    The :class:`RunResult` of :meth:`Context.train`, labelled :func:`run_label`.
  """
  mc = ctx.model_config(n_layers=n_layers, norm_position=spec["norm_position"],
                        norm_type=spec["norm_type"], init=spec.get("init", "xavier"),
                        **({"norm_impl": spec["norm_impl"]} if "norm_impl" in spec else {}))
  tc = ctx.train_config(mc, steps=steps, lr=spec["lr"], warmup=spec["warmup"], seed=seed, **extra)
  return ctx.train(tc, run_label(spec, n_layers) + (f"-{spec['norm_impl']}" if "norm_impl" in spec else ""))
