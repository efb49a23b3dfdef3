"""From a call to its arithmetic: which of jaxnorm's files a call passes through, and how often.

Follows ``jaxnorm.layer_norm`` traced under ``jax.jit`` on this host (nothing is compiled for a
GPU; the Triton path runs its kernels in interpret mode) and prints the jaxnorm frames on the
Python stack at the moment a target function runs: how many frames, how many distinct files, and
which files were entered more than once on the way (a file "visit" is a run of consecutive frames
in one file)::

  python experiments/bench/call_path.py xla normalizer            # to the variance's rsqrt
  python experiments/bench/call_path.py triton kernel_call        # to the kernels' primitive
  python experiments/bench/call_path.py triton norm_forward_kernel  # lowering, to the kernel

Run it at two commits (e.g. with ``git worktree``) for a before/after figure; the results of
issue 51 are in ``docs/ops.md`` ("Where each backend's arithmetic lives").
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import jax
import jax.numpy as jnp

import jaxnorm

_ROOT = os.path.dirname(jaxnorm.__file__)


def stack_at(target: str, impl: str) -> list[tuple[str, str]]:
  """``[(file relative to jaxnorm/, function), ...]``, outermost first: the jaxnorm frames on
  the stack the first time a function named ``target`` is called while ``layer_norm`` on a
  ``(4, 8)`` input is traced and lowered with ``impl``; ``[]`` if it never is."""
  kw = {"impl": impl}
  if impl in ("triton", "pallas"):
    kw["backend_config"] = jaxnorm.PallasConfig(interpret=True)
  s, b = jnp.ones(8), jnp.zeros(8)
  # Warm the imports and the caches on another shape, so the measured trace is a first one.
  jax.jit(lambda x: jaxnorm.layer_norm(x, s, b, **kw))(jnp.ones((2, 8)))
  found: list[list[tuple[str, str]]] = []

  def profile(frame, event, arg):
    del arg
    if event != "call" or found or frame.f_code.co_name != target:
      return
    if not frame.f_code.co_filename.startswith(_ROOT):
      return
    stack = []
    while frame is not None:
      if frame.f_code.co_filename.startswith(_ROOT):
        stack.append((os.path.relpath(frame.f_code.co_filename, _ROOT), frame.f_code.co_name))
      frame = frame.f_back
    found.append(stack[::-1])

  sys.setprofile(profile)
  try:
    jax.jit(lambda x: jaxnorm.layer_norm(x, s, b, **kw)).lower(jnp.ones((4, 8)))
  finally:
    sys.setprofile(None)
  return found[0] if found else []


def summary(stack: list[tuple[str, str]]) -> dict:
  """Frames, distinct files, file visits and the files entered more than once."""
  visits = [f for i, (f, _) in enumerate(stack) if i == 0 or stack[i - 1][0] != f]
  again = sorted(f for f, n in collections.Counter(visits).items() if n > 1)
  return {"frames": len(stack), "files": len(set(visits)), "visits": len(visits),
          "entered_twice": again}


def main(argv=None) -> int:
  """Prints the stack and its summary for ``impl`` and ``target`` (see the module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("impl", choices=("xla", "triton"))
  parser.add_argument("target", help="a function name of jaxnorm's, e.g. normalizer")
  args = parser.parse_args(argv)
  stack = stack_at(args.target, args.impl)
  if not stack:
    print(f"{args.target} was not called", file=sys.stderr)
    return 1
  for f, name in stack:
    print(f"  {f} {name}")
  print(summary(stack))
  return 0


if __name__ == "__main__":
  sys.exit(main())
