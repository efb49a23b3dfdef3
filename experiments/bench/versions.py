"""jaxnorm at an earlier commit vs now vs Flax, interleaved in one process (process CPU time).

Prepare the earlier version as a package of another name, then run (from the repository root)::

  mkdir -p /tmp/old && git archive 9bd691d jaxnorm | tar -x -C /tmp/old && cd /tmp/old \
    && mv jaxnorm jaxnorm_old && grep -rl jaxnorm jaxnorm_old | xargs sed -i -E \
       's/(from|import) jaxnorm([. ])/\1 jaxnorm_old\2/g' && cd -
  PYTHONPATH=/tmp/old:. python experiments/bench/versions.py OUT.json [--shapes S] [--modes M]

``--shapes``: ``TOKENSxD,...`` (default ``1024x64,4096x256,8192x1024``, the CPU bench's);
``--modes``: a subset of ``fwd,jvp,fwd+bwd`` (default all three); ``--sample-ms``: CPU milliseconds
of calls per sample (default 10).

Per op (``--ops``: LayerNorm, RMSNorm, DyT, Derf and the two residual add + norm ops by default),
shape, dtype and mode (forward, ``jax.jvp``, forward+backward as one jitted gradient), the three
implementations (before, after, and a baseline: Flax's layer for LayerNorm/RMSNorm, autodiff of
``jaxnorm.reference`` otherwise) run in 15 interleaved rounds; the printed ratios are the medians
of the per-round time ratios (to the baseline, below 1: faster; after/before, the change).
``impl="auto"``.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
import jaxnorm
from experiments.argtypes import positive_float
import jaxnorm_old  # noqa: F401  (the earlier version, see the docstring)


# The ops compared: the one-input ops of the table, and the residual add + norm ops (fed the
# reversed x as the residual, in both versions alike).
FUSED = {op.add_fn.__name__: op.name for op in jaxnorm.OPS.values() if op.add_fn is not None}


def _params(kind, s, b):
  """``kind``'s parameters by name (jaxnorm.OPS), from the benchmark's ``s`` and ``b`` (DyT's and
  Derf's alpha 0.5 and shift 0.1, scalars)."""
  given = {"scale": s, "bias": b, "alpha": jnp.asarray(0.5, s.dtype),
           "shift": jnp.asarray(0.1, s.dtype)}
  return {name: given[name] for name in jaxnorm.OPS[FUSED.get(kind, kind)].params}


def flax_fn(kind):
  m = getattr(nn, jaxnorm.OPS[kind].layer)()  # Flax's layer of the same class name

  def f(x, s, b):
    return m.apply({"params": _params(kind, s, b)}, x)

  return f


def impls(kind):
  """``before``, ``after`` and the baseline: Flax's layer for LayerNorm/RMSNorm, else autodiff of
  :mod:`jaxnorm.reference` (the fused ops: of the add then the op)."""
  new, old = getattr(jaxnorm, kind), getattr(jaxnorm_old, kind)
  if kind in FUSED:
    ref = jaxnorm.OPS[FUSED[kind]].reference
    return {"before": lambda x, s, b: old(x, x[::-1], *_params(kind, s, b).values())[0],
            "after": lambda x, s, b: new(x, x[::-1], *_params(kind, s, b).values())[0],
            "base": lambda x, s, b: ref(x + x[::-1], *_params(kind, s, b).values())}
  base = flax_fn(kind) if hasattr(nn, jaxnorm.OPS[kind].layer) else (
      lambda x, s, b: jaxnorm.OPS[kind].reference(x, *_params(kind, s, b).values()))
  return {"before": lambda x, s, b: old(x, *_params(kind, s, b).values()),
          "after": lambda x, s, b: new(x, *_params(kind, s, b).values()),
          "base": base}


def modes(f):
  return {
    "fwd": jax.jit(f),
    "jvp": jax.jit(lambda x, s, b, t: jax.jvp(lambda x: f(x, s, b), (x,), (t,))[1]),
    "fwd+bwd": jax.jit(jax.grad(lambda x, s, b, t: jnp.sum(f(x, s, b).astype(jnp.float32) * t), (0, 1, 2))),
  }


def clock(fn, args, k):
  t0 = time.process_time()
  for _ in range(k):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.process_time() - t0) / k


MODE_NAMES = ("fwd", "jvp", "fwd+bwd")


def _shape(text):
  try:
    rows, d = (int(n) for n in text.split("x"))
  except ValueError:
    raise argparse.ArgumentTypeError(f"a shape is TOKENSxD, e.g. 1024x64; got {text!r}") from None
  return rows, d


def _modes(text):
  modes = text.split(",")
  unknown = [m for m in modes if m not in MODE_NAMES]
  if unknown:
    raise argparse.ArgumentTypeError(f"modes are a subset of {','.join(MODE_NAMES)}; got {unknown}")
  return modes


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", help="the JSON file to write")
parser.add_argument("--shapes", type=lambda t: [_shape(s) for s in t.split(",")],
                    default=[(1024, 64), (4096, 256), (8192, 1024)], help="TOKENSxD,...")
parser.add_argument("--modes", type=_modes, default=list(MODE_NAMES), help="subset of fwd,jvp,fwd+bwd")
# Default: the one-input ops of jaxnorm.OPS, then their residual add + norm ops, that the earlier
# version has too (at 20ad8f4 and since: LayerNorm, RMSNorm, DyT, Derf and the two add + norm ops).
_ONE_INPUT = [op for op in jaxnorm.OPS.values() if op.inputs == ("x",)]
DEFAULT_OPS = [n for n in [op.name for op in _ONE_INPUT]
               + [op.add_fn.__name__ for op in _ONE_INPUT if op.add_fn is not None]
               if hasattr(jaxnorm_old, n)]
parser.add_argument("--sample-ms", type=positive_float, default=10.0,
                    help="CPU milliseconds of calls per sample (default 10)")
parser.add_argument("--ops", type=lambda t: t.split(","), default=DEFAULT_OPS,
                    help="ops to compare (default: those of jaxnorm.OPS the earlier version has)")
args = parser.parse_args()
rows = []
for shape in args.shapes:
  for dtype in (jnp.float32, jnp.bfloat16):
    key = jax.random.split(jax.random.key(0), 3)
    x = (jax.random.normal(key[0], shape) + 2).astype(dtype)
    t = jax.random.normal(key[1], shape).astype(dtype)
    s = jnp.ones(shape[-1], dtype) * 1.1
    b = jnp.zeros(shape[-1], dtype) + 0.1
    for kind in args.ops:
      imp = impls(kind)
      for mode in args.modes:
        fns = {n: modes(f)[mode] for n, f in imp.items()}
        call_args = (x, s, b) if mode == "fwd" else (x, s, b, t)
        for fn in fns.values():
          jax.block_until_ready(fn(*call_args))
        one = min(clock(fn, call_args, 1) for fn in fns.values())
        k = max(1, int(args.sample_ms / 1e3 / max(one, 1e-6)))
        samples = {n: [] for n in fns}
        for _ in range(15):  # interleaved rounds
          for n, fn in fns.items():
            samples[n].append(clock(fn, call_args, k))
        med = {n: float(np.median(v)) for n, v in samples.items()}
        paired = {n: float(np.median(np.array(samples[n]) / np.array(samples["base"])))
                  for n in ("before", "after")}
        after_before = float(np.median(np.array(samples["after"]) / np.array(samples["before"])))
        rows.append(
          dict(
            shape=shape,
            dtype=jnp.dtype(dtype).name,
            op=kind,
            mode=mode,
            us={n: 1e6 * v for n, v in med.items()},
            ratio_vs_base=paired,
            after_over_before=after_before,
          )
        )
        print(f"{kind:14s} {shape[0]}x{shape[1]:<5d} {jnp.dtype(dtype).name:8s} {mode:7s} "
              f"before/base {paired['before']:.2f}  after/base {paired['after']:.2f}  "
              f"after/before {after_before:.3f}", flush=True)
json.dump(rows, open(args.out, "w"), indent=1)
