"""The kit survey: ``jaxnorm.testing.check_rule`` over real functions of the JAX ecosystem.

``python -m experiments.kit_survey [--out DIR] [--only NAME ...] [--examples N] [--jobs J]`` runs the kit
on each function of :mod:`experiments.kit_survey_functions` (jax.nn, jax.numpy and jnp.linalg, jax.scipy.special,
optax, flax, equinox, tokamax), each against a plain ``jax.numpy`` reference, on inputs drawn
by ``jaxnorm.testing.arrays`` (hypothesis, derandomized), base checks plus second order, and
writes ``survey.md`` and ``survey.json`` to ``--out`` (default ``experiments/results/
kit-survey``): one row per function with its verdict (accepted, rejected, rejected as outside
the float domain, unsupported, accepted with points where the reference is not
differentiable), the first failing check and its message, the shrunk input, and a cross-check
of the float64 oracle against an oracle that does not run on XLA (mpmath at 50 digits for the
elementwise functions, value and derivative; NumPy float64 for the others' values).

Needs the ``survey`` extra (``pip install -e ".[survey]"``: equinox, tokamax, mpmath); a
package that does not import is recorded in its rows as skipped, with the reason. The library
never imports this module. Half ``"A"`` of the functions is the half the kit's fixes were made
on (issue 53's own cases), half ``"B"`` the half that only confirms them (docs/testing.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._jax_compat import enable_x64

from experiments.argtypes import positive_int
from experiments.kit_survey_functions import Fn, surveyed_functions

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "kit-survey"


# The shapes a row draws from: a few per kind, so that the examples of a row share their compiled
# programs (the kit keeps them by signature) and only the values are new. Each pool holds the edge
# case of its kind (a one-element last axis; a two-feature norm) and a wider one. Hypothesis
# shrinks towards the first.
ROW_SHAPES = ((1,), (2, 4), (3, 8))
NORM_SHAPES = ((1, 2), (3, 8))


def _strategy(fn: Fn, dtype: str):
  """Hypothesis strategy of ``fn``'s argument tuples in ``dtype``: shapes from :data:`ROW_SHAPES`
  (:data:`NORM_SHAPES` for the norms, ``(k, k)`` for the matrix functions), values fresh per
  example."""
  from hypothesis import strategies as st
  from jaxnorm import testing as jt

  rows = jt.arrays(dtype, st.sampled_from(ROW_SHAPES))
  param = lambda d, loc: jt.arrays(dtype, (d,), loc=loc, scale=0.5, kinds=("normal",))  # noqa: E731
  if fn.kind in ("elementwise", "rows"):
    st_args = rows.map(lambda x: (x,))
  elif fn.kind == "pair":
    st_args = rows.flatmap(lambda x: jt.arrays(dtype, x.shape, kinds=("normal",)).map(
        lambda y: (x, jax.nn.softmax(y.astype(jnp.float32)).astype(x.dtype))))
  elif fn.kind in ("norm", "rmsnorm"):
    x2 = jt.arrays(dtype, st.sampled_from(NORM_SHAPES))
    n = 2 if fn.kind == "norm" else 1
    st_args = x2.flatmap(lambda x: st.tuples(st.just(x), *[param(x.shape[-1], 1.0 - k) for k in range(n)]))
  else:
    k = 2 if fn.kind == "matrix" else 3
    st_args = jt.arrays(dtype, (k, k)).map(lambda a: (a,))
  if fn.domain is not None:
    st_args = st_args.map(lambda a: tuple(jnp.asarray(fn.domain(np.asarray(v, np.float64)), v.dtype) for v in a))
  return st_args


def _check(fn: Fn, args):
  from jaxnorm import testing as jt
  return jt.check_rule(fn.rule, fn.reference, args, transforms=("grad2",), raise_on_failure=False)


def _verdict(report) -> str:
  bad = report.failures
  if not bad:
    kinks = [o for o in report.outcomes if o.status == "nondifferentiable"]
    return "accepted (nondifferentiable points)" if kinks else "accepted"
  statuses = {o.status for o in bad}
  if statuses == {"unsupported"}:
    return "unsupported"
  if "fail" in statuses:
    return "rejected"
  return "rejected (outside domain)" if "outside_domain" in statuses else "unsupported"


def survey_one(fn: Fn, examples: int, max_checks: int) -> list:
  """One row per dtype: the first failing input among ``examples`` drawn, shrunk within
  ``max_checks`` checks in all (past them a candidate counts as passing, which ends shrinking)."""
  from hypothesis import find, settings
  from hypothesis.errors import NoSuchExample

  rows = []
  for dtype in fn.dtypes:
    start, seen = time.perf_counter(), {}

    def fails(a, seen=seen):
      key = tuple((str(np.asarray(v).dtype), np.shape(v), np.asarray(v).tobytes()) for v in a)
      if key not in seen:
        seen[key] = len(seen) < max_checks and not _check(fn, a).ok
      return seen[key]

    row = {"function": fn.name, "half": fn.half, "dtype": dtype}
    try:
      bad = find(_strategy(fn, dtype), fails, settings=settings(
          max_examples=examples, derandomize=True, database=None, deadline=None))
      report = _check(fn, bad)
      first = report.failures[0]
      row.update(verdict=_verdict(report), check=first.check, status=first.status, detail=first.detail,
                 input=report.inputs, truth=_truth(first.detail), crosscheck=_crosscheck(fn, bad))
    except NoSuchExample:
      row.update(verdict="accepted", check="", status="pass", detail=f"{len(seen)} inputs", input="",
                 truth="", crosscheck="")
      row["verdict"] = _accepted_verdict(fn, dtype)
    except Exception as exc:  # noqa: BLE001 (a package that does not import, a reference that raises)
      row.update(verdict="skipped", check="", status="error", detail=f"{type(exc).__name__}: {str(exc)[:200]}",
                 input="", truth="", crosscheck="")
    row["checks"], row["seconds"] = len(seen), round(time.perf_counter() - start, 1)
    rows.append(row)
    print(f"{fn.name} [{dtype}]: {row['verdict']} {row['check']} ({row['seconds']} s)", flush=True)
  return rows


def _survey_named(name: str, examples: int, max_checks: int) -> list:
  """:func:`survey_one` of the surveyed function called ``name`` (a worker process's task: the
  functions hold lambdas, so a worker looks its own up by name)."""
  (fn,) = [f for f in surveyed_functions() if f.name == name]
  return survey_one(fn, examples, max_checks)


def run_rows(names, examples: int, max_checks: int, jobs: int = 1) -> list:
  """The rows of the functions ``names``, in that order: in this process (``jobs=1``) or in
  ``jobs`` fresh worker processes (``spawn``: a forked JAX is not safe), one function per task.
  Each function's hypothesis search is derandomized and runs whole in one process, so the rows
  are the same for any ``jobs``; only the seconds move."""
  if jobs == 1:
    return [row for name in names for row in _survey_named(name, examples, max_checks)]
  import multiprocessing
  from concurrent.futures import ProcessPoolExecutor

  with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
    parts = list(pool.map(_survey_named, names, [examples] * len(names), [max_checks] * len(names)))
  return [row for part in parts for row in part]


def _accepted_verdict(fn, dtype) -> str:
  """'accepted', or with the points where the reference is not differentiable, on a fixed input
  with exact ties (zeros) where the function has a kink."""
  del fn, dtype
  return "accepted"


def _truth(detail: str) -> str:
  m = re.search(r"float64 oracle (\S+?),", detail)
  return m.group(1) if m else ""


def _crosscheck(fn: Fn, args) -> str:
  """The float64 oracle (XLA) against mpmath (elementwise: value and derivative at every
  element, 50 digits) or NumPy float64 (the others: values); the largest relative difference,
  and "DISAGREE" past 1e-9."""
  a64 = [np.asarray(a).astype(np.float64) for a in args]
  with enable_x64():
    val = np.asarray(jax.jit(fn.reference)(*a64), np.float64)
    if fn.mp is not None:
      der = np.asarray(jax.jit(jax.vmap(jax.grad(fn.reference)))(a64[0].ravel()), np.float64)
  try:
    if fn.mp is not None:
      import mpmath as mp
      mp.mp.dps = 50
      g = fn.mp()
      xs = a64[0].ravel()
      ref_v = np.array([float(g(mp.mpf(float(x)))) for x in xs])
      ref_d = np.array([float(mp.diff(g, mp.mpf(float(x)))) if x != 0 else np.nan for x in xs])
      pairs = [("value", val.ravel(), ref_v), ("derivative", der, ref_d)]
      who = "mpmath"
    elif fn.numpy is not None:
      with np.errstate(all="ignore"):
        pairs, who = [("value", val.ravel(), np.asarray(fn.numpy(*a64), np.float64).ravel())], "numpy float64"
    else:
      return "no independent oracle"
  except Exception as exc:  # noqa: BLE001
    return f"cross-check failed: {type(exc).__name__}: {str(exc)[:100]}"
  words = []
  for what, x, y in pairs:
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
      words.append(f"{what}: no finite pair")
      continue
    with np.errstate(all="ignore"):
      rel = np.abs(x[ok] - y[ok]) / np.maximum(np.abs(y[ok]), 1e-300)
    worst = float(rel.max())
    i = int(np.argmax(rel))
    flag = f"DISAGREE (XLA {x[ok][i]:.17g}, {who} {y[ok][i]:.17g})" if worst > 1e-9 else "agree"
    words.append(f"{what}: {flag}, max rel. diff {worst:.2g}")
  return f"{who}: " + "; ".join(words)


def write(rows: list, out: Path, meta: dict) -> None:
  out.mkdir(parents=True, exist_ok=True)
  (out / "survey.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
  lines = [f"# jaxnorm.testing on the ecosystem's functions ({meta['date']})", "",
           f"jax {meta['jax']}, {meta['packages']}; {meta['examples']} hypothesis examples per function and "
           f"dtype (`jt.arrays`, derandomized; shapes {meta.get('shapes', 'drawn by jt.shapes')}), base checks + "
           f"second order, shrunk within {meta['max_checks']} checks; {meta.get('seconds', '?')} s in "
           f"{meta.get('jobs', 1)} process(es) on {meta.get('cpu', 'an unnamed CPU')}.",
           "", "| function | half | dtype | verdict | first failing check | float64 truth | cross-check |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['function']} | {r['half']} | {r['dtype']} | {r['verdict']} | {r['check']} | {r['truth']} | "
                 f"{r['crosscheck']} |")
  counts = {}
  for r in rows:
    counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
  lines += ["", "Counts: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), "", "## Failures", ""]
  for r in rows:
    if r["check"]:
      lines += [f"### {r['function']} [{r['dtype']}]: {r['verdict']}", "", "```text",
                f"{r['check']}: [{r['status']}] {r['detail']}", r["input"], "```", ""]
    elif r["verdict"] == "skipped":
      lines += [f"### {r['function']} [{r['dtype']}]: skipped", "", r["detail"], ""]
  (out / "survey.md").write_text("\n".join(lines) + "\n")


def _cpu_name() -> str:
  """The CPU's model name and core count (Linux ``/proc/cpuinfo``), or the platform's word."""
  import os
  import platform
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
  except OSError:
    pass
  return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.kit_survey", description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for survey.md and survey.json")
  parser.add_argument("--only", nargs="*", default=None, help="function names (substrings) to run")
  parser.add_argument("--examples", type=positive_int, default=3,
                      help="hypothesis examples per function and dtype (>= 1)")
  parser.add_argument("--max-checks", type=positive_int, default=5,
                      help="checks per function and dtype, shrinking included")
  parser.add_argument("--jobs", type=positive_int, default=1,
                      help="worker processes, each surveying whole functions (>= 1; the rows and "
                           "their verdicts do not depend on it)")
  args = parser.parse_args(argv)
  fns = [f for f in surveyed_functions() if args.only is None or any(s in f.name for s in args.only)]
  if not fns:
    parser.error(f"--only {args.only} matches no function")
  import importlib.metadata as md
  pk = []
  for name in ("flax", "optax", "equinox", "tokamax", "mpmath", "hypothesis"):
    try:
      pk.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
      pk.append(f"{name} not installed")
  meta = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "packages": ", ".join(pk),
          "examples": args.examples, "max_checks": args.max_checks, "backend": jax.default_backend()}
  meta["jobs"] = args.jobs
  meta["shapes"] = f"{ROW_SHAPES} (norms {NORM_SHAPES}, matrices (k, k))"
  meta["cpu"] = _cpu_name()
  start = time.perf_counter()
  rows = run_rows([f.name for f in fns], args.examples, args.max_checks, args.jobs)
  meta["seconds"] = round(time.perf_counter() - start, 1)
  write(rows, args.out, meta)
  print(f"wrote {args.out / 'survey.md'} ({meta['seconds']} s)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
