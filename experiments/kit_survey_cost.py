"""What ``jaxnorm.testing.check_rule`` costs against ``jax.test_util.check_grads`` (issue 65).

``python -m experiments.kit_survey_cost [--out DIR] [--repeats N] [--profile]`` times, for each
function of :data:`FUNCTIONS` on one input shape, the kit's default check
(``check_rule(rule, reference, args)``) and ``check_grads(rule, args, order=2,
modes=("fwd", "rev"))`` on the same function and the same input values, interleaved in one
process: a first call of each (compiles included, reported apart), then ``--repeats`` rounds
that each draw new input values of the same shapes and time the kit then ``check_grads``. The
ratio is the median kit time over the median ``check_grads`` time of those rounds ("after the
first call": the goal of issue 65 is at most 2x). ``--profile`` also splits one first call and
one later call of each function by where the time goes (compiling, tracing, the float64
oracle's condition analysis, the comparison), with ``cProfile``.

Writes ``kit-cost.json`` and ``kit-cost.md`` to ``--out`` (default
``experiments/results/kit-cost``). The timings are wall-clock on whatever machine runs it; say
whether it was shared when quoting them (docs/perf-notes.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

import jaxnorm
from jaxnorm import testing as jt

from experiments.argtypes import positive_int

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "kit-cost"


def _log_softmax(x):
  s = x - jax.lax.stop_gradient(jnp.max(x, -1, keepdims=True))
  return s - jnp.log(jnp.sum(jnp.exp(s), -1, keepdims=True))


def _logsumexp(x):
  m = jax.lax.stop_gradient(jnp.max(x, -1, keepdims=True))
  return jnp.log(jnp.sum(jnp.exp(x - m), -1)) + m[..., 0]


def _standardize(x):
  c = x - jnp.mean(x, -1, keepdims=True)
  return c / jnp.sqrt(jnp.mean(c * c, -1, keepdims=True) + 1e-5)


def _rms(x, s):
  return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * s


def _ln(x, s, b):
  return _standardize_eps(x, 1e-6) * s + b


def _standardize_eps(x, eps):
  c = x - jnp.mean(x, -1, keepdims=True)
  return c / jnp.sqrt(jnp.mean(c * c, -1, keepdims=True) + eps)


# (name, rule, reference, argument shapes). The rule is what check_grads differentiates.
FUNCTIONS = (
    ("jnp.tanh", jnp.tanh, jnp.tanh, ((4, 8),)),
    ("jax.nn.log_softmax", jax.nn.log_softmax, _log_softmax, ((4, 8),)),
    ("jax.nn.softmax", jax.nn.softmax, lambda x: jnp.exp(_log_softmax(x)), ((4, 8),)),
    ("jax.nn.logsumexp", lambda x: jax.nn.logsumexp(x, -1), _logsumexp, ((4, 8),)),
    ("jax.nn.standardize", lambda x: jax.nn.standardize(x, axis=-1, epsilon=1e-5), _standardize,
     ((4, 8),)),
    ("jaxnorm.rms_norm", jaxnorm.rms_norm, _rms, ((8, 64), (64,))),
    ("jaxnorm.layer_norm", jaxnorm.layer_norm, _ln, ((8, 64), (64,), (64,))),
)


def _args(shapes, seed):
  rng = np.random.default_rng(seed)
  out = []
  for k, shp in enumerate(shapes):
    a = rng.standard_normal(shp)
    if k == 1:
      a = 1.0 + 0.1 * a  # a scale near 1
    out.append(jnp.asarray(a, jnp.float32))
  return tuple(out)


def _time(f):
  """Seconds ``f()`` took, and whether it passed (check_grads raises on a mismatch: its
  finite differences in float32 reject correct functions, e.g. log_softmax; timed all the same)."""
  t = time.perf_counter()
  try:
    ok = bool(f())
  except AssertionError:
    ok = False
  return time.perf_counter() - t, ok


def _kit(rule, ref, a):
  return jt.check_rule(rule, ref, a, raise_on_failure=False).ok


def _cg(rule, a):
  check_grads(rule, a, order=2, modes=("fwd", "rev"))
  return True


# Where cProfile's cumulative time of a call goes: (label, function-name suffixes). Nested
# entries overlap (compiling is inside running a check); the table says so.
_PHASES = (
    ("XLA compile", ("compiler.py:backend_compile_and_load",)),
    ("lowering to HLO", ("mlir.py:lower_jaxpr_to_module",)),
    ("tracing (jaxprs)", ("partial_eval.py:trace_to_jaxpr",)),
    ("oracle: float64 reference + condition magnitude", ("_problem.py:oracle",)),
    ("condition: multipliers (NumPy hashes)", ("_condition.py:multipliers",)),
    ("comparison (NumPy)", ("_problem.py:compare",)),
    ("eager checks (op by op)", ("_checks.py:_check_eager_and_checkpoint",)),
    ("shrinking/diagnosis (_diagnose)", ("_diagnose.py:explain",)),
)


def _phases(stmt, env) -> dict:
  prof = cProfile.Profile()
  t = time.perf_counter()
  prof.runctx(stmt, env, env)
  total = time.perf_counter() - t
  stats = pstats.Stats(prof).stats
  out = {"total": total}
  for label, names in _PHASES:
    cum = 0.0
    for (file, line, fn), (_, _, _, ct, _) in stats.items():
      if any(f"{Path(file).name}:{fn}" == n for n in names):
        cum = max(cum, ct)  # a recursive function's outermost frame holds its cumulative time
    out[label] = cum
  return out


def run(repeats: int, profile: bool) -> dict:
  rows = []
  for name, rule, ref, shapes in FUNCTIONS:
    a0 = _args(shapes, 0)
    first_kit, kit_ok = _time(lambda: _kit(rule, ref, a0))
    first_cg, cg_ok = _time(lambda: _cg(rule, a0))
    kit, cg, kit_rejects, cg_rejects = [], [], int(not kit_ok), int(not cg_ok)
    for k in range(repeats):  # interleaved: each round's values are new, the shapes the same
      a = _args(shapes, 1 + k)
      t, ok = _time(lambda: _kit(rule, ref, a))
      kit.append(t)
      kit_rejects += not ok
      t, ok = _time(lambda: _cg(rule, a))
      cg.append(t)
      cg_rejects += not ok
    row = dict(function=name, shapes=[list(s) for s in shapes], first_kit_s=first_kit,
               first_check_grads_s=first_cg, kit_s=kit, check_grads_s=cg,
               kit_median_s=statistics.median(kit), check_grads_median_s=statistics.median(cg),
               kit_rejects=kit_rejects, check_grads_rejects=cg_rejects, calls=repeats + 1)
    row["ratio"] = row["kit_median_s"] / row["check_grads_median_s"]
    if profile:
      env = dict(jt=jt, rule=rule, ref=ref, a=_args(shapes, 999))
      row["profile_later_call"] = _phases("jt.check_rule(rule, ref, a)", env)
    rows.append(row)
    print(f"{name}: first {first_kit:.2f} s vs {first_cg:.2f} s; later median "
          f"{row['kit_median_s']:.3f} s vs {row['check_grads_median_s']:.3f} s = "
          f"{row['ratio']:.2f}x", flush=True)
  return dict(rows=rows, repeats=repeats, jax=jax.__version__, machine=platform.machine(),
              processor=platform.processor(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def write(result: dict, out: Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  (out / "kit-cost.json").write_text(json.dumps(result, indent=1) + "\n")
  lines = ["# check_rule against check_grads(order=2, modes=('fwd', 'rev'))",
           "", f"{result['date']}, jax {result['jax']}, {result['machine']}; median of "
           f"{result['repeats']} interleaved rounds, new input values each round, same shapes "
           f"(after the first call). Wall-clock; see docs/perf-notes.md for the machine's load.",
           "", "| function | shapes | first call: kit / check_grads (s) | later: kit (s) | "
           "later: check_grads (s) | ratio | rejects: kit / check_grads |",
           "|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    lines.append(f"| {r['function']} | {' '.join('x'.join(map(str, s)) for s in r['shapes'])} | "
                 f"{r['first_kit_s']:.2f} / {r['first_check_grads_s']:.2f} | "
                 f"{r['kit_median_s']:.3f} | {r['check_grads_median_s']:.3f} | "
                 f"{r['ratio']:.2f}x | {r['kit_rejects']} / {r['check_grads_rejects']} of "
                 f"{r['calls']} |")
  lines += ["", "Rejects: calls whose verdict was a failure (every function here is correct; "
            "check_grads's float32 finite differences reject some)."]
  prof = [r for r in result["rows"] if "profile_later_call" in r]
  if prof:
    labels = [label for label, _ in _PHASES]
    lines += ["", "Where a later call's time goes (cProfile, cumulative seconds; nested "
              "phases overlap: compiling is inside a check's run):", "",
              "| function | total | " + " | ".join(labels) + " |",
              "|---|---|" + "---|" * len(labels)]
    for r in prof:
      p = r["profile_later_call"]
      lines.append(f"| {r['function']} | {p['total']:.3f} | " +
                   " | ".join(f"{p[label]:.3f}" for label in labels) + " |")
  (out / "kit-cost.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.kit_survey_cost",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for kit-cost.*")
  parser.add_argument("--repeats", type=positive_int, default=5,
                      help="interleaved rounds after the first call (default 5)")
  parser.add_argument("--profile", action="store_true", help="also split a later call by phase")
  args = parser.parse_args(argv)
  write(run(args.repeats, args.profile), args.out)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
