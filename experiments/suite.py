"""The experiment suite: ``python -m experiments run --preset smoke|cpu|gpu [--only NAME]``.

Runs the six experiments of the report (each in its own ``experiments/exp_*.py`` module), writes
their raw data (JSON/CSV) and plots (PNG) into a results folder, then renders ``report.md``
(:mod:`experiments.report`). Layout of the results folder (default ``results/<preset>``)::

    suite.json                 provenance (preset, seeds, corpus hash, device, versions, git)
                               and the status and wall time of every experiment
    report.md                  the report, embedding the PNGs, ending with the claims table
    runs/<label>-<hash>/       one training run (train()'s config.json, metrics.jsonl and
                               run.json with its summary), shared by experiments that need
                               the same run, keyed by a hash of its TrainConfig
    <experiment>/done.json     the experiment's summary; its presence means "finished"
    <experiment>/*.json|csv|png

A re-run with the same folder skips experiments that have a ``done.json`` and training runs that
have a ``run.json`` (``--force NAME`` recomputes an experiment). ``--export DIR`` copies the
report with its plots and data, but not the training runs, to ``DIR`` (this is how
``experiments/results/cpu/`` is produced).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib
import json
import math
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from experiments import presets as presets_lib

__all__ = ["EXPERIMENTS", "Context", "RunResult", "main", "run_suite", "to_jsonable"]

# Experiment name -> module, in the order of the report (the numbering of the issue).
EXPERIMENTS: dict[str, str] = {
    "grad_init": "experiments.exp_grad_init",
    "warmup": "experiments.exp_warmup",
    "depth": "experiments.exp_depth",
    "invariance": "experiments.exp_invariance",
    "speed": "experiments.exp_speed",
    "vjp": "experiments.exp_vjp",
}

_RUN_CACHE_VERSION = 1


def to_jsonable(obj: Any) -> Any:
  """Converts numpy/JAX scalars and arrays, tuples and dataclasses into JSON-ready values.

  Non-finite floats become the strings ``"nan"``/``"inf"``/``"-inf"`` so that the files stay
  valid JSON (diverged runs produce them).
  """
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return to_jsonable(dataclasses.asdict(obj))
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
    return to_jsonable(obj.tolist())
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    f = float(obj)
    if math.isfinite(f):
      return f
    return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
  return obj


def from_json_float(value: Any) -> float:
  """Inverse of :func:`to_jsonable` for one float (``"nan"`` -> ``nan``; ``None`` -> ``nan``)."""
  if value is None:
    return float("nan")
  return float(value)


def write_json(path: pathlib.Path, obj: Any) -> None:
  """Writes ``obj`` as indented JSON atomically (a crash never leaves half a file)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(to_jsonable(obj), indent=1, sort_keys=False) + "\n")
  os.replace(tmp, path)


def read_json(path: pathlib.Path) -> Any:
  """Parses the JSON file at ``path`` (non-finite floats stay strings: :func:`from_json_float`)."""
  return json.loads(pathlib.Path(path).read_text())


def _is_tty() -> bool:
  return sys.stderr.isatty()


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
    preset: the preset dict (see :mod:`experiments.presets`).
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

  # ---------------------------------------------------------------- output
  def log(self, msg: str) -> None:
    """Prints one progress line, prefixed with the time and the experiment's name."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    self._log(f"[{stamp}] {self.exp_name or 'suite'}: {msg}")

  def iterate(self, items: Iterable, *, desc: str, total: int | None = None) -> Iterator:
    """Iterates over ``items`` with a tqdm bar on a TTY, or with one plain line per item."""
    items = list(items)
    total = len(items) if total is None else total
    if self.progress:
      from tqdm.auto import tqdm
      yield from tqdm(items, desc=f"{self.exp_name}: {desc}", total=total, leave=False)
      return
    for i, item in enumerate(items):
      self.log(f"{desc} {i + 1}/{total}")
      yield item

  # ---------------------------------------------------------------- data and models
  def corpus(self):
    """The corpus of the preset (``experiments.data.load_corpus``), loaded once."""
    if self._corpus is None:
      from experiments import data
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
    from experiments.train import TrainConfig
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
    key_src = json.dumps({"v": _RUN_CACHE_VERSION, "config": to_jsonable(config)}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:10]
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
    from experiments import train as train_lib
    if run_dir.exists():  # an interrupted run: start it again from scratch
      shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    self.log(f"train {label} ({config.steps} steps)")
    summary = train_lib.train(config, run_dir, progress=self.progress, corpus=self.corpus())
    wall = time.perf_counter() - t0
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


# -------------------------------------------------------------------- provenance
def _version(module: str) -> str | None:
  try:
    from importlib import metadata
    return metadata.version(module)
  except Exception:  # noqa: BLE001 - a missing package is reported as None
    return None


def _git_info() -> dict:
  repo = pathlib.Path(__file__).resolve().parents[1]
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                            text=True, timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return {"commit": commit or None, "dirty": bool(dirty)}
  except Exception:  # noqa: BLE001 - not a git checkout
    return {"commit": None, "dirty": None}


def _cpu_model() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def device_info() -> dict:
  """The JAX backend and devices, the CPU model and core count."""
  import jax
  devices = jax.devices()
  return {
      "backend": jax.default_backend(),
      "device_kind": devices[0].device_kind,
      "n_devices": len(devices),
      "cpu": _cpu_model(),
      "cpu_count": os.cpu_count(),
      "platform": platform.platform(),
      # Other processes compete for the CPU: timings of a loaded machine are slower and noisier.
      "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
  }


def provenance(preset: dict, corpus=None) -> dict:
  """Everything a reader needs to know where the numbers come from."""
  info = {
      "preset": preset.get("name"),
      "preset_config": preset,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "command": "python -m experiments run " + " ".join(sys.argv[2:] if len(sys.argv) > 1 else []),
      "device": device_info(),
      "versions": {
          "python": platform.python_version(),
          **{name: _version(name) for name in (
              "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "matplotlib", "jaxnorm")},
      },
      "git": _git_info(),
  }
  if corpus is not None:
    info["corpus"] = {"name": getattr(corpus, "name", None), "sha256": getattr(corpus, "sha256", None),
                      "n_bytes": getattr(corpus, "n_bytes", None),
                      "n_files": len(getattr(corpus, "files", []) or [])}
  return info


# -------------------------------------------------------------------- the runner
def _experiment_config(module, preset: dict, name: str):
  fields = preset.get(name, {})
  try:
    return module.Config(**fields)
  except TypeError as e:
    raise ValueError(f"preset {preset.get('name')!r} has invalid fields for experiment {name!r}: {e}")


def select(only: list[str] | None) -> list[str]:
  """Validates ``--only`` (names or 1-based numbers) and returns experiment names in order."""
  if not only:
    return list(EXPERIMENTS)
  names = list(EXPERIMENTS)
  chosen = set()
  for item in only:
    for part in item.split(","):
      part = part.strip()
      if not part:
        continue
      if part.isdigit() and 1 <= int(part) <= len(names):
        chosen.add(names[int(part) - 1])
      elif part in EXPERIMENTS:
        chosen.add(part)
      else:
        raise ValueError(f"--only must name experiments from {names} (or their numbers 1-{len(names)}), "
                         f"got {part!r}.")
  return [n for n in names if n in chosen]


def run_suite(preset_name: str, out_dir: str | pathlib.Path, *, only: list[str] | None = None,
              force: list[str] | None = None, progress: bool | None = None,
              render: bool = True, log: Callable[[str], None] | None = None,
              compile_cache: str | pathlib.Path | None = None) -> dict:
  """Runs the selected experiments into ``out_dir`` and renders the report.

  Args:
    preset_name: ``"smoke"``, ``"cpu"`` or ``"gpu"`` (:mod:`experiments.presets`).
    out_dir: the results folder; finished experiments in it are skipped (resume).
    only: experiment names (or numbers) to run; default all.
    force: experiment names to recompute even if finished.
    progress: tqdm bars (default: when stderr is a TTY), else plain lines.
    render: whether to write ``report.md`` at the end.
    log: where progress lines go (default stderr).
    compile_cache: a folder for JAX's persistent compilation cache (the same model compiled
      for several seeds, or again on a re-run, is then compiled once); None: no cache.

  Returns:
    The ``suite.json`` dict: provenance plus ``experiments`` ``{name: {status, wall_s, ...}}``.
  """
  preset = presets_lib.get_preset(preset_name)
  names = select(only)
  force_names = set(select(force)) if force else set()
  root = pathlib.Path(out_dir)
  root.mkdir(parents=True, exist_ok=True)
  progress = _is_tty() if progress is None else progress
  if compile_cache is not None:
    import jax
    jax.config.update("jax_compilation_cache_dir", str(compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  ctx = Context(root, preset, progress=progress, log=log)

  suite_path = root / "suite.json"
  state = read_json(suite_path) if suite_path.exists() else {}
  if state.get("preset") not in (None, preset_name):
    raise ValueError(f"{root} holds results of preset {state.get('preset')!r}, not {preset_name!r}; "
                     f"pass another --out folder.")
  corpus = None
  try:
    corpus = ctx.corpus()
  except Exception as e:  # noqa: BLE001 - the op-level experiment runs without the corpus
    ctx.log(f"corpus unavailable ({type(e).__name__}: {e}); training experiments will fail")
  # The first invocation's provenance stays at the top level (it produced most of the numbers);
  # every invocation (resume, --force, --only) is appended to "invocations".
  prov = provenance(preset, corpus)
  if "created" not in state:
    state.update(prov)
  state.setdefault("invocations", []).append(
      {k: prov[k] for k in ("created", "command", "git", "device", "versions")})
  state.setdefault("experiments", {})
  write_json(suite_path, state)

  t_suite = time.perf_counter()
  failures = []
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(names), desc=f"suite[{preset_name}]", position=0)
  for i, name in enumerate(names):
    module = importlib.import_module(EXPERIMENTS[name])
    exp_dir = root / name
    done = exp_dir / "done.json"
    ctx.exp_dir, ctx.exp_name = exp_dir, name
    if done.exists() and name not in force_names:
      ctx.log(f"finished earlier, skipped ({i + 1}/{len(names)})")
      if bar is not None:
        bar.update(1)
      continue
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "error.json").unlink(missing_ok=True)
    ctx.log(f"start ({i + 1}/{len(names)}): {module.TITLE}")
    t0 = time.perf_counter()
    try:
      config = _experiment_config(module, preset, name)
      summary = module.run(ctx, config)
    except Exception as e:  # noqa: BLE001 - one failed experiment must not hide the others
      wall = time.perf_counter() - t0
      tb = traceback.format_exc()
      write_json(exp_dir / "error.json", {"error": f"{type(e).__name__}: {e}", "traceback": tb})
      state["experiments"][name] = {"status": "failed", "wall_s": wall, "error": f"{type(e).__name__}: {e}"}
      ctx.log(f"FAILED after {wall:.0f} s: {type(e).__name__}: {e}\n{tb}")
      failures.append(name)
    else:
      wall = time.perf_counter() - t0
      summary = dict(summary)
      summary["config"] = config
      summary["wall_s"] = wall
      write_json(done, summary)
      state["experiments"][name] = {"status": "done", "wall_s": wall}
      ctx.log(f"done in {wall:.0f} s")
    write_json(suite_path, state)
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  ctx.exp_name = ""
  state["last_invocation_wall_s"] = time.perf_counter() - t_suite
  state["failed"] = failures
  write_json(suite_path, state)
  if render:
    from experiments import report
    path = report.render(root)
    ctx.log(f"report written to {path}")
  return state


def export(root: str | pathlib.Path, dest: str | pathlib.Path) -> pathlib.Path:
  """Copies the report, ``suite.json`` and each experiment's folder (not ``runs/``) to ``dest``."""
  root, dest = pathlib.Path(root), pathlib.Path(dest)
  dest.mkdir(parents=True, exist_ok=True)
  for name in ("report.md", "suite.json"):
    if (root / name).exists():
      shutil.copy2(root / name, dest / name)
  for name in EXPERIMENTS:
    src = root / name
    if not src.is_dir():
      continue
    target = dest / name
    if target.exists():
      shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("*.tmp", "ckpt"))
  return dest


def main(argv: list[str] | None = None) -> int:
  """Command line of ``python -m experiments run``."""
  parser = argparse.ArgumentParser(
      prog="python -m experiments run",
      description="Run the jaxnorm experiment suite and write its report.")
  parser.add_argument("--preset", default="cpu", choices=sorted(presets_lib.PRESETS),
                      help="problem sizes: smoke (CI, ~1 min), cpu (~20 min on 2 cores), gpu (full size)")
  parser.add_argument("--only", action="append", default=None, metavar="NAME",
                      help=f"run only these experiments (repeatable or comma-separated; names "
                           f"{', '.join(EXPERIMENTS)} or numbers 1-{len(EXPERIMENTS)})")
  parser.add_argument("--out", default=None, help="results folder (default results/<preset>)")
  parser.add_argument("--force", action="append", default=None, metavar="NAME",
                      help="recompute these experiments even if finished")
  parser.add_argument("--report-only", action="store_true", help="only re-render report.md from the folder")
  parser.add_argument("--export", default=None, metavar="DIR",
                      help="afterwards, copy report, plots and data (not the runs) to DIR")
  parser.add_argument("--list", action="store_true", help="list experiments and presets, then exit")
  parser.add_argument("--no-compile-cache", action="store_true",
                      help="do not use JAX's persistent compilation cache (default: <out>/jax_cache)")
  progress = parser.add_mutually_exclusive_group()
  progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                        help="draw progress bars (default: when stderr is a terminal)")
  progress.add_argument("--no-progress", dest="progress", action="store_false",
                        help="print plain progress lines")
  args = parser.parse_args(argv)

  if args.list:
    for i, (name, mod) in enumerate(EXPERIMENTS.items(), 1):
      title = importlib.import_module(mod).TITLE
      print(f"{i}. {name:11s} {title}")
    for name, preset in presets_lib.PRESETS.items():
      print(f"preset {name:6s} {preset['description']}")
    return 0
  out = pathlib.Path(args.out or os.path.join("results", args.preset))
  try:
    if args.report_only:
      from experiments import report
      print(report.render(out))
      failed = []
    else:
      cache = None if args.no_compile_cache else out / "jax_cache"
      state = run_suite(args.preset, out, only=args.only, force=args.force, progress=args.progress,
                        compile_cache=cache)
      failed = state.get("failed", [])
  except ValueError as e:
    parser.error(str(e))
  if args.export:
    print(f"exported to {export(out, args.export)}")
  if failed:
    print(f"experiments failed: {', '.join(failed)} (see <out>/<name>/error.json)", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
