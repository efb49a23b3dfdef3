"""Dumps the optimized HLO of the existing ops' forward, gradient and JVP, one file per program.

For the "nothing changed" check of a refactor: run it on the base commit and on the branch and
diff the two folders (``diff -r``); every file must be text-identical::

  python experiments/bench/hlo_dump.py /tmp/hlo-main      # at the base commit
  python experiments/bench/hlo_dump.py /tmp/hlo-branch    # after the change
  diff -r /tmp/hlo-main /tmp/hlo-branch && echo identical

Programs: ``layer_norm``, ``rms_norm``, ``add_layer_norm``, ``add_rms_norm`` and ``dyt``
(``impl="auto"``), each as the forward, ``jax.grad`` of a random-cotangent dot product with
respect to every array argument, and ``jax.jvp``, at two shapes, in float32 and bfloat16:
60 programs, ``jax.jit(f).lower(...).compile().as_text()`` on the default backend, with the
source-location tables (``FileNames``, ``FunctionNames``, ``FileLocations``, ``StackFrames``)
and every ``metadata={...}`` removed (:func:`strip_locations`): they name files, lines and the
Python call stack, which any edit moves, and do not change the program.
"""

from __future__ import annotations

import os
import re
import sys

import jax
import jax.numpy as jnp

import jaxnorm

SHAPES = ((8, 64), (256, 1024))
DTYPES = (jnp.float32, jnp.bfloat16)


def _ops():
  """``{name: (fn, kinds)}``: each op as a function of arrays only; ``kinds`` says per argument
  "r" for a row array of ``x``'s shape, "p" for a ``(d,)`` parameter, "s" for a scalar."""
  return {
      "layer_norm": (lambda x, s, b: jaxnorm.layer_norm(x, s, b), "rpp"),
      "rms_norm": (lambda x, s: jaxnorm.rms_norm(x, s), "rp"),
      "add_layer_norm": (lambda x, r, s, b: jaxnorm.add_layer_norm(x, r, s, b)[0], "rrpp"),
      "add_rms_norm": (lambda x, r, s: jaxnorm.add_rms_norm(x, r, s)[0], "rrp"),
      "dyt": (lambda x, a, s, b: jaxnorm.dyt(x, a, s, b), "rspp"),
  }


def _args(kinds: str, shape, dtype):
  """Random arrays: rows of ``shape``, parameters ``(d,)`` near 1, scalars 0.5 (DyT's alpha)."""
  keys = jax.random.split(jax.random.key(0), len(kinds))
  make = {"r": lambda k: jax.random.normal(k, shape, dtype),
          "p": lambda k: 1.0 + 0.1 * jax.random.normal(k, shape[-1:], dtype),
          "s": lambda k: jnp.asarray(0.5, dtype)}
  return [make[kind](k) for kind, k in zip(kinds, keys)]


_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def strip_locations(text: str) -> str:
  """``text`` without the source-location tables and the instructions' ``metadata={...}``."""
  kept, skipping = [], False
  for line in text.splitlines():
    if line in _TABLES:
      skipping = True
      continue
    if skipping and (not line or line[0].isdigit()):
      continue
    skipping = False
    kept.append(re.sub(r", metadata=\{[^{}]*\}", "", line))
  return "\n".join(kept) + "\n"


def programs():
  """``{file name: HLO text}`` for every op, mode, shape and dtype."""
  texts = {}
  for name, (fn, kinds) in _ops().items():
    n = len(kinds)
    for shape in SHAPES:
      for dtype in DTYPES:
        args = _args(kinds, shape, dtype)
        dy = jax.random.normal(jax.random.key(1), shape, dtype)
        tag = f"{name}-{shape[0]}x{shape[1]}-{jnp.dtype(dtype).name}"
        grad = jax.grad(lambda *a, fn=fn, dy=dy: jnp.vdot(fn(*a).astype(jnp.float32),
                                                          dy.astype(jnp.float32)),
                        argnums=tuple(range(n)))
        jvp = lambda *a, fn=fn: jax.jvp(fn, a, a)  # noqa: E731
        for mode, f in (("fwd", fn), ("grad", grad), ("jvp", jvp)):
          text = jax.jit(f).lower(*args).compile().as_text()
          texts[f"{tag}-{mode}.hlo"] = strip_locations(text)
  return texts


def main(out_dir: str) -> None:
  """Writes every program's optimized HLO under ``out_dir``."""
  os.makedirs(out_dir, exist_ok=True)
  texts = programs()
  for fname, text in texts.items():
    with open(os.path.join(out_dir, fname), "w") as f:
      f.write(text)
  print(f"{len(texts)} programs written to {out_dir} ({jax.default_backend()})")


if __name__ == "__main__":
  main(sys.argv[1])
