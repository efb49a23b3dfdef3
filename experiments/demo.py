"""A one-minute tour: the custom VJPs against autodiff, and a small timing table.

``python -m experiments demo`` prints, for LayerNorm and RMSNorm and each variant, the largest
relative difference between jaxnorm's derived backward and ``jax.vjp`` of the plain reference
(random cotangent), then the median time of a jitted forward+backward of both at one shape.
For the full benchmark use ``python -m experiments bench``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from jaxnorm import reference
from experiments.argtypes import positive_int


def _max_rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _params(op, s, b):
  """``op``'s parameters (its entry of jaxnorm.OPS) from the demo's scale ``s`` and bias ``b``."""
  return tuple({"scale": s, "bias": b}[name] for name in op.params)


def _median_ms(f, *args, repeats):
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def main(argv=None) -> int:
  """Runs the demo and prints its two tables.

  First, for LayerNorm and RMSNorm in four variants (default, ``epsilon_placement="outside"``,
  ``zero_centered_scale=True``, a random mask), the relative difference
  ``max|a - b| / max|b|`` between jaxnorm and ``jax.vjp`` of :mod:`jaxnorm.reference` for ``y``,
  ``dx``, ``dscale`` and (LayerNorm) ``dbias`` on a fixed ``(64, 96)`` float32 input; then the
  median time of the jitted forward+backward of both at ``(--tokens, --d)`` and their ratio.

  Args:
    argv: command-line arguments (default ``sys.argv[1:]``): ``--tokens``, ``--d``, ``--repeats``.

  Returns:
    0 (invalid arguments exit through ``argparse``).
  """
  p = argparse.ArgumentParser(prog="python -m experiments demo", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tokens", type=positive_int, default=2048, help="rows of the timing input")
  p.add_argument("--d", type=positive_int, default=1024, help="feature size of the timing input")
  p.add_argument("--repeats", type=positive_int, default=20, help="timed runs (median reported)")
  args = p.parse_args(argv)
  if args.tokens < 1 or args.d < 1 or args.repeats < 1:
    p.error("--tokens, --d and --repeats must be >= 1")

  ks = jax.random.split(jax.random.key(0), 4)
  x = 3.0 + 2.0 * jax.random.normal(ks[0], (64, 96))
  s = 1.0 + 0.2 * jax.random.normal(ks[1], (96,))
  b = jax.random.normal(ks[2], (96,))
  dy = jax.random.normal(ks[3], x.shape)
  print(f"jaxnorm {jaxnorm.__version__} on {jax.devices()[0].device_kind} (jax {jax.__version__})")
  print("\nCustom VJP vs autodiff of the reference (max relative difference, float32):")
  print(f"{'op':<11}{'variant':<30}{'y':>10}{'dx':>10}{'dscale':>10}{'dbias':>10}")
  for op_name in ("layer_norm", "rms_norm"):
    for kw in (dict(), dict(epsilon_placement="outside"), dict(zero_centered_scale=True),
               dict(mask=jax.random.bernoulli(ks[0], 0.8, x.shape))):
      op, has_bias = jaxnorm.OPS[op_name], "bias" in jaxnorm.OPS[op_name].params
      # (x, s, b) for every op; an op without a bias gets b through ``0 * b`` (dbias: zeros).
      mine = lambda x, s, b: op.fn(x, *_params(op, s, b), **kw) + (0.0 if has_bias else 0.0 * b)
      ref = lambda x, s, b: op.reference(x, *_params(op, s, b), **kw) + (0.0 if has_bias else 0.0 * b)
      y, pull = jax.vjp(mine, x, s, b)
      y_ref, pull_ref = jax.vjp(ref, x, s, b)
      errs = [_max_rel(y, y_ref)] + [_max_rel(g, h) for g, h in zip(pull(dy), pull_ref(dy))]
      label = ", ".join(f"{k}={'...' if k == 'mask' else v}" for k, v in kw.items()) or "default"
      cells = "".join(f"{e:>10.1e}" for e in errs[:3]) + (
          f"{errs[3]:>10.1e}" if has_bias else f"{'-':>10}")
      print(f"{op_name:<11}{label:<30}{cells}")

  xt = jax.random.normal(ks[0], (args.tokens, args.d))
  st, bt = jnp.ones(args.d), jnp.zeros(args.d)
  dyt = jax.random.normal(ks[1], xt.shape)
  print(f"\nJitted forward+backward, ({args.tokens}, {args.d}) float32, median of {args.repeats}:")
  print(f"{'op':<11}{'jaxnorm ms':>12}{'autodiff ms':>13}{'ratio':>8}")
  for op_name, mine, ref in (
      ("layer_norm", lambda x, s, b: jaxnorm.layer_norm(x, s, b),
       lambda x, s, b: reference.layer_norm(x, s, b)),
      ("rms_norm", lambda x, s, b: jaxnorm.rms_norm(x, s),
       lambda x, s, b: reference.rms_norm(x, s))):
    fb = lambda f: jax.jit(lambda x, s, b, dy: jax.vjp(f, x, s, b)[1](dy))
    t_mine = _median_ms(fb(mine), xt, st, bt, dyt, repeats=args.repeats)
    t_ref = _median_ms(fb(ref), xt, st, bt, dyt, repeats=args.repeats)
    print(f"{op_name:<11}{t_mine:>12.2f}{t_ref:>13.2f}{t_mine / t_ref:>8.2f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
