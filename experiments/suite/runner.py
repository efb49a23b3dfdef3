"""The experiment suite: ``python -m experiments run --preset smoke|cpu|cpu-extra|gpu [--only NAME]``.

Runs the studies of a preset (:func:`experiments.suite.presets.studies`; each in its own
``experiments/studies/*.py`` module), writes
their raw data (JSON/CSV) and plots (PNG) into a results folder, then renders ``report.md``
(:mod:`experiments.suite.report`). Layout of the results folder (default ``results/<preset>``)::

    suite.json                 provenance (preset, seeds, corpus hash, device, versions, git)
                               and the status and wall time of every experiment
    report.md                  the report, embedding the PNGs, ending with the claims table
    runs/<label>-<hash>/       one training run (train()'s config.json, metrics.jsonl and
                               run.json with its summary), shared by experiments that need
                               the same run, keyed by a hash of its TrainConfig
    <experiment>/done.json     the experiment's summary; its presence means "finished"
    <experiment>/*.json|csv|png

    cache/<experiment>/*.json  one probe setting each (gradient norms at init of one setting and
                               seed, one model-update probe, one throughput measurement)

A re-run with the same folder skips experiments that have a ``done.json``, training runs that
have a ``run.json`` and probe settings that have their ``cache/`` file (``--force NAME``
recomputes an experiment's analysis from its cached units), so a cut invocation loses at most
the unit it was computing. ``--budget MINUTES`` stops an invocation before a unit that would
not finish in time (the experiment is then ``partial`` in ``suite.json``); the same command
continues it. ``--list`` prints the chunk plan of a preset (:mod:`experiments.suite.plan`). ``--export DIR`` copies the
report with its plots and data, but not the training runs, to ``DIR`` (this is how
``experiments/results/cpu/`` is produced).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import time
import traceback
from typing import Callable

from experiments.argtypes import folder, positive_float
from experiments.harness import progress as progress_lib
from experiments.suite import presets as presets_lib
from experiments.suite import report, study
from experiments.suite import plan as plan_lib
from experiments.suite.context import Context, OutOfBudget
from experiments.suite.provenance import provenance
from experiments.suite.registry import EXPERIMENTS, read_json, write_json
from experiments.suite.runs import merge_scans, scan_runs

__all__ = ["export", "main", "run_suite", "select"]


def _is_tty() -> bool:
  return sys.stderr.isatty()


def _experiment_config(module, preset: dict, name: str):
  fields = preset.get(name, {})
  try:
    return module.Config(**fields)
  except TypeError as e:
    raise ValueError(f"preset {preset.get('name')!r} has invalid fields for experiment {name!r}: {e}")


def select(only: list[str] | None, flag: str = "--only") -> list[str]:
  """Validates ``only`` (names or 1-based numbers, given as ``flag``: ``--only`` or ``--force``)
  and returns experiment names in order; ``ValueError`` naming ``flag`` for an unknown one."""
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
        raise ValueError(f"{flag} must name experiments from {names} (or their numbers 1-{len(names)}), "
                         f"got {part!r}.")
  if not chosen:
    raise ValueError(f"{flag} must name at least one experiment, got {only!r}.")
  return [n for n in names if n in chosen]


def _open_state(root: pathlib.Path, preset_name: str, preset: dict, ctx: Context) -> dict:
  """Reads (or starts) ``suite.json``, records this invocation's provenance, and writes it back.

  Raises:
    ValueError: the folder holds results of another preset.
  """
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
  return state


def _run_experiment(name: str, module, ctx: Context, preset: dict, state: dict) -> str:
  """Runs one experiment into ``ctx.exp_dir``: ``done.json`` on success, ``error.json`` on failure.

  Records its status and wall time in ``state["experiments"]`` and returns the status:
  ``"done"``, ``"failed"`` or ``"partial"`` (the time budget ran out; its finished units are
  cached).
  """
  exp_dir = ctx.exp_dir
  exp_dir.mkdir(parents=True, exist_ok=True)
  (exp_dir / "error.json").unlink(missing_ok=True)
  t0 = time.perf_counter()
  try:
    config = _experiment_config(module, preset, name)
    summary = module.run(ctx, config)
  except OutOfBudget as e:
    wall = time.perf_counter() - t0
    state["experiments"][name] = {"status": "partial", "wall_s": wall,
                                  "units_computed": ctx.units_computed}
    ctx.log(f"budget spent after {wall:z.0f} s ({e}); run the same command again to continue")
    return "partial"
  except Exception as e:  # noqa: BLE001 - one failed experiment must not hide the others
    wall = time.perf_counter() - t0
    tb = traceback.format_exc()
    write_json(exp_dir / "error.json", {"error": f"{type(e).__name__}: {e}", "traceback": tb})
    state["experiments"][name] = {"status": "failed", "wall_s": wall, "error": f"{type(e).__name__}: {e}"}
    ctx.log(f"FAILED after {wall:z.0f} s: {type(e).__name__}: {e}\n{tb}")
    return "failed"
  wall = time.perf_counter() - t0
  summary = dict(summary)
  summary["config"] = config
  summary["wall_s"] = wall
  write_json(exp_dir / "done.json", summary)
  state["experiments"][name] = {"status": "done", "wall_s": wall}
  ctx.log(f"done in {wall:z.0f} s")
  return "done"


def run_suite(preset_name: str, out_dir: str | pathlib.Path, *, only: list[str] | None = None,
              force: list[str] | None = None, progress: bool | None = None,
              render: bool = True, log: Callable[[str], None] | None = None,
              compile_cache: str | pathlib.Path | None = None,
              budget_s: float | None = None) -> dict:
  """Runs the selected experiments into ``out_dir`` and renders the report.

  Args:
    preset_name: ``"smoke"``, ``"cpu"`` or ``"gpu"`` (:mod:`experiments.suite.presets`).
    out_dir: the results folder; finished experiments in it are skipped (resume).
    only: experiment names (or numbers) to run; default the preset's studies
      (:func:`experiments.suite.presets.studies`).
    force: experiment names to recompute even if finished.
    progress: tqdm bars (default: when stderr is a TTY), else plain lines.
    render: whether to write ``report.md`` at the end.
    log: where progress lines go (default stderr).
    compile_cache: a folder for JAX's persistent compilation cache (the same model compiled
      for several seeds, or again on a re-run, is then compiled once); None: no cache.
    budget_s: wall-clock budget of this invocation in seconds: no unit (training run or probe
      setting) is started that is expected to end past it; the experiment it stops in is
      ``partial`` and later ones are not started (``state["stopped"]`` is True). None: no budget.

  Returns:
    The ``suite.json`` dict: provenance plus ``experiments`` ``{name: {status, wall_s, ...}}``.
  """
  preset = presets_lib.get_preset(preset_name)
  names = select(only) if only else presets_lib.studies(preset)
  force_names = set(select(force, "--force")) if force else set()
  root = pathlib.Path(out_dir)
  root.mkdir(parents=True, exist_ok=True)
  progress = _is_tty() if progress is None else progress
  if compile_cache is not None:
    import jax
    jax.config.update("jax_compilation_cache_dir", str(compile_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  ctx = Context(root, preset, progress=progress, log=log)
  if budget_s is not None:
    ctx.deadline = time.monotonic() + budget_s
  state = _open_state(root, preset_name, preset, ctx)

  t_suite = time.perf_counter()
  failures, stopped = [], False
  bar = progress_lib.Progress(len(names), desc=f"suite[{preset_name}]", bar=bool(progress))
  for i, name in enumerate(names):
    module = study.load(EXPERIMENTS[name])
    ctx.exp_dir, ctx.exp_name = root / name, name
    if (root / name / "done.json").exists() and name not in force_names:
      ctx.log(f"finished earlier, skipped ({i + 1}/{len(names)})")
    elif stopped:
      ctx.log(f"not started: the budget is spent ({i + 1}/{len(names)})")
    else:
      ctx.log(f"start ({i + 1}/{len(names)}): {module.TITLE}")
      status = _run_experiment(name, module, ctx, preset, state)
      if status == "failed":
        failures.append(name)
      stopped = status == "partial"
      write_json(root / "suite.json", state)
    bar.update(i + 1)
  bar.close()
  ctx.exp_name = ""
  state["last_invocation_wall_s"] = time.perf_counter() - t_suite
  # Every cached run's divergence and largest rise (the report's list). A folder whose run cache is gone (a
  # committed report: its runs/ is not exported) keeps the scan of the runs it no longer holds, merged by label
  # with what this invocation trained: a later `--force NAME` there must not erase the others' instabilities.
  state["runs_scan"] = merge_scans(state.get("runs_scan"), scan_runs(root))
  state["failed"] = failures
  state["stopped"] = stopped
  write_json(root / "suite.json", state)
  if render:
    path = report.render(root)
    ctx.log(f"report written to {path}")
  return state


def export(root: str | pathlib.Path, dest: str | pathlib.Path) -> pathlib.Path:
  """Copies the report, ``suite.json`` and each experiment's folder (not ``runs/``) to ``dest``."""
  root, dest = pathlib.Path(root), pathlib.Path(dest)
  dest.mkdir(parents=True, exist_ok=True)
  for name in ("report.md", "appendix.md", "suite.json"):
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


def _record_rerender(root: pathlib.Path, preset_name: str) -> None:
  """Appends a ``--report-only`` invocation to ``suite.json``'s ``invocations`` (issue 44: a re-rendered
  report names the commit whose rendering code wrote it, in its provenance); nothing if the folder
  has no ``suite.json``."""
  suite_path = root / "suite.json"
  if not suite_path.exists():
    return
  state = read_json(suite_path)
  prov = provenance(presets_lib.get_preset(preset_name))
  state.setdefault("invocations", []).append(
      {**{k: prov[k] for k in ("created", "command", "git", "device", "versions")}, "report_only": True})
  write_json(suite_path, state)


def build_parser() -> argparse.ArgumentParser:
  """The ``argparse`` parser of ``python -m experiments run``."""
  parser = argparse.ArgumentParser(
      prog="python -m experiments run",
      description="Run the jaxnorm experiment suite and write its report.")
  parser.add_argument("--preset", default="cpu", choices=sorted(presets_lib.PRESETS),
                      help="problem sizes: smoke (CI, ~1 min), cpu (the flagship question, <= 15 min on 2 cores), "
                           "cpu-extra (every other study, <= 20 min on 2 cores), gpu (one H100)")
  parser.add_argument("--only", action="append", default=None, metavar="NAME",
                      help=f"run only these experiments (repeatable or comma-separated; names "
                           f"{', '.join(EXPERIMENTS)} or numbers 1-{len(EXPERIMENTS)})")
  parser.add_argument("--out", type=folder, default=None, help="results folder (default results/<preset>)")
  parser.add_argument("--force", action="append", default=None, metavar="NAME",
                      help="recompute these experiments even if finished")
  parser.add_argument("--report-only", action="store_true", help="only re-render report.md from the folder")
  parser.add_argument("--export", type=folder, default=None, metavar="DIR",
                      help="afterwards, copy report, plots and data (not the runs) to DIR")
  parser.add_argument("--list", action="store_true",
                      help="list experiments and presets, and the chunk plan of --preset with "
                           "estimated times, then exit")
  parser.add_argument("--budget", type=positive_float, default=None, metavar="MINUTES",
                      help="stop before a training run or probe setting that would end past this "
                           "many minutes; run the same command again to continue")
  parser.add_argument("--no-compile-cache", action="store_true",
                      help="do not use JAX's persistent compilation cache (default: <out>/jax_cache)")
  progress = parser.add_mutually_exclusive_group()
  progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                        help="draw progress bars (default: when stderr is a terminal)")
  progress.add_argument("--no-progress", dest="progress", action="store_false",
                        help="print plain progress lines")
  return parser


def _print_list(preset_name: str) -> None:
  """``--list``: the experiments, the presets and the chunk plan of ``preset_name``."""
  for i, (name, mod) in enumerate(EXPERIMENTS.items(), 1):
    title = study.load(mod).TITLE
    print(f"{i}. {name:11s} {title}")
  for name, preset in presets_lib.PRESETS.items():
    print(f"preset {name:6s} {preset['description']}")
  print()
  for kind in plan_lib.default_kinds(preset_name):
    print(plan_lib.format_plan(preset_name, kind))


def main(argv: list[str] | None = None) -> int:
  """Command line of ``python -m experiments run``."""
  parser = build_parser()
  args = parser.parse_args(argv)

  if args.list:
    _print_list(args.preset)
    return 0
  out = pathlib.Path(args.out or os.path.join("results", args.preset))
  try:
    if args.report_only:
      # The invocation is recorded first (the provenance the report prints names it) and taken back if the render
      # fails, so that a refused render leaves no "re-rendered" row behind.
      suite_path = out / "suite.json"
      before = suite_path.read_bytes() if suite_path.exists() else None
      _record_rerender(out, args.preset)
      try:
        print(report.render(out))
      except BaseException:
        if before is not None:
          suite_path.write_bytes(before)
        raise
      failed = []
    else:
      cache = None if args.no_compile_cache else out / "jax_cache"
      state = run_suite(args.preset, out, only=args.only, force=args.force, progress=args.progress,
                        compile_cache=cache,
                        budget_s=None if args.budget is None else 60.0 * args.budget)
      failed = state.get("failed", [])
      if state.get("stopped"):
        print("budget spent: run the same command again to continue", file=sys.stderr)
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
