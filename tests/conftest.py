"""Test configuration: strict numerics and several host devices for the sharding tests.

``XLA_FLAGS`` must be set before JAX initialises its backends, so it is set here, at import
of the conftest, before any test module imports ``jax``.
"""

import os
import re
import sys

# The shared helpers (_numerics.py, _kernels.py, ...) live in tests/ and are imported as top-level
# modules (``from _kernels import ...``) by the tests of tests/jaxnorm/ and tests/experiments/:
# tests/ goes on sys.path explicitly, whatever pytest's import mode or the directory it runs from.
_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
  sys.path.insert(0, _TESTS)

# 8 host devices for the sharding tests. The tests run tiny shapes, so compilation dominates
# their time; three flags make XLA:CPU compile faster without changing what a program computes
# beyond its rounding (every comparison of the suite is within a tolerance, or bitwise between
# programs built the same way: docs/bitwise.md):
#  - LLVM at optimization level 0: about a third faster (tests/jaxnorm/test_models.py -k "scan or
#    theory", 43 -> 29 s CPU). XLA's HLO passes (fusion, layout) are unchanged.
#  - XLA:CPU's older elemental emitters instead of its MLIR fusion emitters: a 1-layer training
#    step compiles in 0.65 s instead of 2.4 s (jax 0.10.2; 0.73 vs 2.0 s at the floor, 0.8.1),
#    and six test files (267 tests) took 240 s of CPU instead of 368 s (docs/perf-notes.md).
#  - LLVM code generation in one piece per program (`--xla_cpu_parallel_codegen_split_count=1`)
#    instead of split over threads: pytest-xdist's two workers already keep both cores busy, and
#    the split's threads only contend with the other worker (test_memory_efficient, test_ops_vjp
#    and test_models, `-n 2`: 117 -> 101 s of CPU; docs/perf-notes.md). Where code is generated
#    changes nothing that runs.
# JAXNORM_TEST_XLA_DEFAULTS=1 keeps XLA's default emitters (what a user's programs compile
# with); every bitwise assertion of the suite holds by construction under both (docs/bitwise.md).
# The emitter and split flags are passed only to the jaxlib releases they were measured on
# (< 0.11). On the H200's jaxlib 0.11.2 (2026-11-28) a pytest process given the emitter flag
# exited with status 1 before printing anything, and the same files passed without it
# (experiments/results/gpu-h200-2026-11-28/); the split flag was not tried there.
_FLAGS = ["--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"]


def _jaxlib_before(major: int, minor: int) -> bool:
  from importlib import metadata
  try:
    parts = metadata.version("jaxlib").split(".")[:2]
    return (int(parts[0]), int(parts[1])) < (major, minor)
  except (metadata.PackageNotFoundError, ValueError):
    return False


if not os.environ.get("JAXNORM_TEST_XLA_DEFAULTS") and _jaxlib_before(0, 11):
  _FLAGS += ["--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1"]
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# One persistent compilation cache per test session, shared by pytest-xdist's workers: many tests
# compile the same program (the same op at the same shape under a fresh closure, or in another
# worker), and a hit skips XLA. The process that imports this first (the controller, or a lone
# pytest) makes the directory and removes it at exit; the workers inherit it through the
# environment. The cache holds compiled executables keyed by the program, the compile options and
# the jax/jaxlib versions, so a hit runs the same code a compile would have produced. A cache the
# user configured (JAX_COMPILATION_CACHE_DIR) is left alone. Measured: tests/jaxnorm/test_linen.py,
# test_nnx.py and test_forward_mode.py, 2 min 3 s -> 1 min 26 s on 2 cores (docs/perf-notes.md).
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
  if "JAXNORM_TEST_COMPILE_CACHE" not in os.environ:
    os.environ["JAXNORM_TEST_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="jaxnorm-tests-xla-")
    atexit.register(shutil.rmtree, os.environ["JAXNORM_TEST_COMPILE_CACHE"], ignore_errors=True)
  jax.config.update("jax_compilation_cache_dir", os.environ["JAXNORM_TEST_COMPILE_CACHE"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=25,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def x64():
  """Enables float64 for the duration of one test."""
  with jax.enable_x64(True):
    yield


@pytest.hookimpl(tryfirst=True)  # before -m / -k deselect: they read the marker
def pytest_collection_modifyitems(config, items):
  """Marks the extended batteries (``tests/_extended.py``) ``extended``, then sorts the tests
  marked ``slow`` first (a stable sort). pytest-xdist hands out whole files (``--dist
  loadfile``, pyproject.toml) in the order of their first test, so the files with the longest
  tests start first and the rest is spread over the other workers, instead of one of them
  running alone at the end of the session."""
  _mark_extended(items, whole_files=not any("::" in a for a in config.args))
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _mark_extended(items, whole_files):
  from _extended import EXTENDED

  files = {item.nodeid.split("::")[0] for item in items}
  # "*" is the only wildcard (test ids hold brackets, which fnmatch would read as sets).
  patterns = {p: re.compile(".*".join(map(re.escape, p.split("*")))) for p in EXTENDED}
  used = set()
  for item in items:
    hits = [p for p, rx in patterns.items() if rx.fullmatch(item.nodeid)]
    if hits:
      item.add_marker(pytest.mark.extended)
      used.update(hits)
  stale = [p for p in EXTENDED if whole_files and p.split("::")[0] in files and p not in used]
  if stale:
    raise pytest.UsageError(f"tests/_extended.py: these patterns match no test of a collected "
                            f"file: {stale}")


@pytest.fixture
def gpu_host(monkeypatch):
  """``impl="auto"`` chooses as it does on a host whose default backend is a GPU (a per-platform
  switch: the kernels where the program is lowered for cuda or rocm, XLA elsewhere), while the
  programs are traced on this CPU: on a CPU host "auto" is XLA when traced
  (``jaxnorm.backends.table.resolve_impl``)."""
  from jaxnorm.backends import table
  monkeypatch.setattr(table, "host_platform", lambda: "cuda")
