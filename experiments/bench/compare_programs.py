"""Are jaxnorm's compiled programs the same at an earlier commit and now? Prints the count.

Prepare the earlier version as ``jaxnorm_old`` (see :mod:`experiments.bench.versions`), then::

  PYTHONPATH=/tmp/old:. python experiments/bench/compare_programs.py

Compares ``jax.jit(f).lower(...).compile().as_text()`` (metadata and source-location tables
removed) of every one-input op of :data:`jaxnorm.OPS` and its residual add + norm that the
earlier version has too (at 20ad8f4 and since: ``layer_norm``, ``rms_norm``, ``dyt``, ``derf``,
``add_layer_norm``, ``add_rms_norm``) as the forward, ``jax.jvp`` and ``jax.grad`` in every
array argument, at the versions bench's largest and smallest shapes (8192x1024, 1024x64), in
float32 and bfloat16: 72 programs. Identical programs time the same; a timing ratio away from 1
between them is the measurement's noise.
"""

import re

import jax
import jax.numpy as jnp

import jaxnorm
import jaxnorm_old  # the earlier version


def _strip(text):
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  return re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)[\s\S]*?(?=\n\n|\Z)", "",
                text)


def _program(f, *args):
  return _strip(jax.jit(f).lower(*args).compile().as_text())


def _ops(a, sh):
  """``{name: make}``, ``make(module)`` the op of that version as ``f(x, s, b)``: every one-input
  op of :data:`jaxnorm.OPS` and its residual add + norm (fed ``x[::-1]``) that the earlier
  version has too, its parameters by name (``scale`` s, ``bias`` b, ``alpha`` a, ``shift`` sh)."""
  out = {}
  for op in jaxnorm.OPS.values():
    if op.inputs != ("x",) or not hasattr(jaxnorm_old, op.name):
      continue
    def params(s, b, op=op):
      return tuple({"scale": s, "bias": b, "alpha": a, "shift": sh}[p] for p in op.params)
    out[op.name] = lambda m, n=op.name, params=params: (
        lambda x, s, b: getattr(m, n)(x, *params(s, b)))
    if op.add_fn is not None and hasattr(jaxnorm_old, op.add_fn.__name__):
      out[op.add_fn.__name__] = lambda m, n=op.add_fn.__name__, params=params: (
          lambda x, s, b: getattr(m, n)(x, x[::-1], *params(s, b))[0])
  return out


def _modes(f):
  return {"fwd": f,
          "jvp": lambda x, s, b: jax.jvp(lambda x: f(x, s, b), (x,), (x,))[1],
          "grad": jax.grad(lambda x, s, b: jnp.sum(f(x, s, b).astype(jnp.float32) * x), (0, 1, 2))}


def main():
  same = {}
  for shape in ((8192, 1024), (1024, 64)):
    for dt in (jnp.float32, jnp.bfloat16):
      x, s, b = jnp.ones(shape, dt), jnp.ones(shape[-1], dt), jnp.zeros(shape[-1], dt)
      for name, make in _ops(jnp.asarray(0.5, dt), jnp.asarray(0.1, dt)).items():
        old, new = _modes(make(jaxnorm_old)), _modes(make(jaxnorm))
        for mode in old:
          same[(name, shape, jnp.dtype(dt).name, mode)] = (
              _program(old[mode], x, s, b) == _program(new[mode], x, s, b))
  differ = [k for k, v in same.items() if not v]
  print(f"{len(same)} programs; {len(differ)} differ: {differ}")
  return 1 if differ else 0


if __name__ == "__main__":
  raise SystemExit(main())
