"""Single entry point: ``python -m experiments <command> [options]``.

Commands (each module builds its own ``argparse`` parser; ``--help`` after a command lists
its options):

* ``train``  one training run (:mod:`experiments.harness.train_cli`).
* ``run``    the experiment suite and its report (:mod:`experiments.suite.runner`).
* ``bench``  the op-level benchmark (:mod:`experiments.bench.cli`).
* ``bench-qk``  the per-head (QK) norm against Flax's (:mod:`experiments.bench.qk`).
* ``bench-pointwise``  DyT and Derf against the memory floor and autodiff
  (:mod:`experiments.bench.pointwise`).
* ``bench-gated``  gated RMSNorm against the unfused jnp composition and the memory floor
  (:mod:`experiments.bench.gated`).
* ``bench-ensemble``  seeds as one vmapped training program vs one program per seed
  (:mod:`experiments.bench.ensemble`).
* ``tune``   launch configurations of the Pallas kernels, measured on a GPU
  (:mod:`experiments.bench.tune`).
* ``demo``   a short check of the custom VJPs against autodiff (:mod:`experiments.demo`).
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": "experiments.harness.train_cli",
    "run": "experiments.suite.runner",
    "bench": "experiments.bench.cli",
    "bench-qk": "experiments.bench.qk",
    "bench-ensemble": "experiments.bench.ensemble",
    "bench-pointwise": "experiments.bench.pointwise",
    "bench-gated": "experiments.bench.gated",
    "demo": "experiments.demo",
    "tune": "experiments.bench.tune",
}


def main(argv: list[str] | None = None) -> int:
  """Dispatches ``python -m experiments <command> [options]`` to the command's module.

  Args:
    argv: the arguments after ``python -m experiments`` (default ``sys.argv[1:]``); the first
      names the command, the rest are passed to that module's ``main``.

  Returns:
    The exit status: the command's (``None`` counts as 0); 0 after ``-h``/``--help``; 2 (with
    the module docstring or an error on stderr) without a command or for an unknown one; 2
    with one line on stderr (no traceback) when the command raises one of :data:`REFUSALS`
    (a bad argument the library or the harness refuses, a missing file or folder). Options
    argparse refuses exit with status 2 and argparse's usage and error lines.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__)
    return 0 if argv else 2
  command, rest = argv[0], argv[1:]
  if command not in COMMANDS:
    print(f"unknown command {command!r}; expected one of {sorted(COMMANDS)}", file=sys.stderr)
    return 2
  module = importlib.import_module(COMMANDS[command])
  try:
    return int(module.main(rest) or 0)
  except REFUSALS as e:
    print(f"python -m experiments {command}: error: {one_line(e)}", file=sys.stderr)
    return 2


# What a command refuses with one line on stderr and exit status 2 instead of a traceback: the
# library's and the harness's argument errors, and a missing file or folder.
REFUSALS = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError,
            IsADirectoryError)


def one_line(e: BaseException) -> str:
  """The exception's message on one line (its own lines joined), prefixed by its type."""
  text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


if __name__ == "__main__":
  sys.exit(main())
