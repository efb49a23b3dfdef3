"""No crash where Flax's layers run (issue 62): jaxnorm's ops and layers, differentiated the ways
a user does (``jit(grad)``, ``jit(vjp)``, ``jvp``, a Hessian-vector product), on 1,024 to
16,384 rows, with a scale that is a captured constant of equal entries (a freshly built layer),
of unequal entries, an argument, or absent. Each group of cases runs in a child process with
the user's XLA flags (``tests/_crash_matrix.py``), so a segmentation fault in XLA's compiled
program fails this test and names its case, instead of killing the pytest worker.

The suite runs a pairwise-covering subset of the matrix (every pair of values of two
dimensions in some case) plus the cases that died at 4a7aa67; ``python tests/_crash_matrix.py
--all`` lists the whole matrix (1,440 cases, about 1.5 s of CPU each), and ``python
tests/_crash_matrix.py CASE...`` runs any of them.
"""

import os
import subprocess
import sys

import pytest

import _crash_matrix as matrix

_SCRIPT = os.path.abspath(matrix.__file__)
_CASES = matrix.pairwise_cases()


def run_cases(ids, timeout=600):
  """``({case id: status line}, crashed id or None, returncode, output tail)`` of one child
  process running ``ids`` in order."""
  proc = subprocess.run([sys.executable, _SCRIPT, *ids], capture_output=True, text=True,
                        env=matrix.child_env(), timeout=timeout)
  status, started = {}, None
  for line in proc.stdout.splitlines():
    word, _, rest = line.partition(" ")
    if word == "START":
      started = rest
    elif word in ("OK", "MISMATCH", "ERROR", "REFERR"):
      status[rest.split(" ")[0]] = line
      started = None
  return status, (started if proc.returncode != 0 else None), proc.returncode, proc.stderr[-2000:]


def run_all(ids):
  """Every case of ``ids`` run, a crash restarting the child after the case it killed:
  ``{case id: status line}`` with ``"CRASH <id> (exit status n)"`` for each case that died."""
  results, todo = {}, list(ids)
  while todo:
    status, crashed, rc, tail = run_cases(todo)
    results.update(status)
    if crashed is None and rc != 0:
      raise AssertionError(f"the child exited with status {rc} outside any case: {tail}")
    if crashed is not None:
      results[crashed] = f"CRASH {crashed} (exit status {rc})"
    todo = [c for c in todo if c not in results]
  return results


@pytest.mark.parametrize("api", matrix.APIS)
def test_no_crash_where_flax_runs(api):
  ids = [matrix.case_id(c) for c in _CASES if c[0] == api]
  results = run_all(ids)
  bad = sorted(line for line in results.values() if not line.startswith(("OK", "REFERR")))
  assert not bad, "\n".join(bad)
  # A case whose reference (Flax's layer or jnp) raised does not test jaxnorm: none may.
  referr = sorted(line for line in results.values() if line.startswith("REFERR"))
  assert not referr, "\n".join(referr)


def test_the_subset_covers_every_pair_and_the_known_crashes():
  cases = set(_CASES)
  assert set(matrix.KNOWN_CRASHES) <= cases
  dims = (matrix.APIS, matrix.OPS, matrix.SCALES, matrix.ROWS, matrix.LOSSES, matrix.MODES)
  for i in range(len(dims)):
    for j in range(i + 1, len(dims)):
      seen = {(c[i], c[j]) for c in cases}
      assert len(seen) == len(dims[i]) * len(dims[j]), (i, j)


def test_a_crash_fails_one_case_and_the_rest_still_run(monkeypatch):
  """The driver's own contract: a child killed by a signal in one case reports that case as a
  crash, and the cases after it run in a fresh child."""
  calls = []

  def fake(ids, timeout=600):
    calls.append(list(ids))
    if ids[0] == "a":
      return {}, "a", -11, ""
    return {i: f"OK {i}" for i in ids}, None, 0, ""

  monkeypatch.setattr(sys.modules[__name__], "run_cases", fake)
  out = run_all(["a", "b", "c"])
  assert out == {"a": "CRASH a (exit status -11)", "b": "OK b", "c": "OK c"}
  assert calls == [["a", "b", "c"], ["b", "c"]]


def test_child_env_drops_the_sessions_flags_and_keeps_the_users():
  env = matrix.child_env({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2 --xla_backend_optimization_level=0 "
                                       "--xla_cpu_use_fusion_emitters=false",
                          "JAX_COMPILATION_CACHE_DIR": "/tmp/x"})
  assert env["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"
  assert "JAX_COMPILATION_CACHE_DIR" not in env


def test_a_concrete_x_closed_over_by_a_jitted_gradient_runs():
  """The eager range check reads a concrete ``x`` on the device; under an outer ``jit`` that
  closes over ``x`` and differentiates with respect to it, that read must not be staged into the
  trace (it raised ``TracerArrayConversionError``; Flax's layer runs)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jaxnorm
  x = jax.random.normal(jax.random.key(0), (8, 16))
  s = jnp.linspace(0.5, 1.5, 16)
  for op in (jaxnorm.rms_norm, jaxnorm.layer_norm):
    f = lambda x, s, op=op: jnp.sum(op(x, s) ** 2)  # noqa: E731
    got = jax.jit(lambda a, s: jax.value_and_grad(f, argnums=(0, 1))(x, s))(1.0, s)
    want = jax.value_and_grad(f, argnums=(0, 1))(x, s)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
