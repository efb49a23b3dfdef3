"""How much precision ``memory_efficient=True`` costs: dx against the default, by max |beta|/|gamma|.

The option recovers ``x_hat = (y - beta) / gamma`` from the stored output ``y``, whose rounding
error is about ``u (|gamma x_hat| + |beta|)`` (``u`` the unit roundoff of ``y``'s dtype); divided
by ``gamma`` that is ``u (|x_hat| + |beta / gamma|)`` on ``x_hat``, so the error grows with the
ratio ``R = max_j |beta_j| / |gamma_j|`` (``docs/derivations.md``, "memory_efficient=True").
For each dtype (float32, bfloat16, float16) and each target ``R`` this measures, over seeds:

* LayerNorm, two ways of reaching ``R``: ``one``, one feature's ``gamma`` shrunk to
  ``1 / R`` with ``beta_0 = 1`` (the others ``gamma ~ U(0.5, 1.5)``, ``|beta| <= gamma / 2``); ``all``, every feature's
  ``beta`` set to ``R gamma_j s_j`` with ``s_j ~ U(-1, 1)`` and ``|s_0| = 1``;
* RMSNorm (no bias, so ``R = 0``) with one ``gamma`` shrunk by the same factors as ``one``
  (it should not matter: ``y / gamma`` loses nothing but ``y``'s own rounding).

The error of a gradient ``g`` against the default's ``g0`` is ``max|g - g0| / max|g0|`` (the
worst element on the scale of the array; ``rel_fro`` also records ``||g - g0|| / ||g0||``),
computed in float64 from the arrays as returned; ``floor`` is the default's own error against a
float64 evaluation of the same op, the resolution the comparison cannot go below.

Usage::

  python experiments/bench/memory_efficient_precision.py OUT.json [--rows 256] [--d 512]
      [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import platform

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from experiments.argtypes import positive_int

jax.config.update("jax_enable_x64", True)  # the float64 floor; the other dtypes are explicit

DTYPES = ("float32", "bfloat16", "float16")
RATIOS = (0.0, 1.0, 4.0, 16.0, 32.0, 1e2, 1e3, 4096.0, 1e4, 1e5, 1e6)


def _params(rng, d, ratio, family):
  """``(gamma, beta)`` as float64 with ``max_j |beta_j| / |gamma_j| == ratio``."""
  gamma = rng.uniform(0.5, 1.5, d)
  if family == "one":
    if ratio == 0.0:
      return gamma, np.zeros(d)
    beta = 0.5 * gamma * rng.uniform(-1.0, 1.0, d)  # ratios below 0.5 <= R elsewhere
    beta[0], gamma[0] = 1.0, 1.0 / ratio
    return gamma, beta
  s = rng.uniform(-1.0, 1.0, d)
  s[0] = 1.0
  return gamma, ratio * gamma * s


def _grads(op, x, dy, gamma, beta, memory_efficient):
  """``(dx, dscale)`` of ``op`` at ``x`` with cotangent ``dy``."""
  if op == "layer_norm":
    f = lambda x, s: jaxnorm.layer_norm(x, s, beta, impl="xla",  # noqa: E731
                                        memory_efficient=memory_efficient)
  else:
    f = lambda x, s: jaxnorm.rms_norm(x, s, impl="xla",  # noqa: E731
                                      memory_efficient=memory_efficient)
  _, vjp = jax.vjp(f, x, gamma)
  return vjp(dy)


def _err(g, g0):
  g = np.asarray(g, np.float64)
  g0 = np.asarray(g0, np.float64)
  diff = g - g0
  return dict(rel_max=float(np.max(np.abs(diff)) / np.max(np.abs(g0))),
              rel_fro=float(np.linalg.norm(diff) / np.linalg.norm(g0)))


def measure(op, family, dtype, ratio, rows, d, seed):
  """One case's errors (dx and dscale, against the default; the default against float64), or
  None where ``beta`` would overflow ``dtype``."""
  rng = np.random.default_rng(seed)
  gamma, beta = _params(rng, d, ratio, family)
  x = rng.normal(0.5, 1.0, (rows, d))
  dy = rng.normal(0.0, 1.0, (rows, d))
  if np.max(np.abs(beta)) > float(jnp.finfo(dtype).max):
    return None  # beta itself overflows the dtype: no such call
  cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
  xd, dyd, gd, bd = cast(x), cast(dy), cast(gamma), cast(beta)
  # The float64 floor at the same (rounded) inputs.
  x64, dy64, g64, b64 = (jnp.asarray(np.asarray(a, np.float64)) for a in (xd, dyd, gd, bd))
  true_ratio = float(np.max(np.abs(np.asarray(b64)) / np.abs(np.asarray(g64))))
  dx0, ds0 = _grads(op, xd, dyd, gd, bd, False)
  dx1, ds1 = _grads(op, xd, dyd, gd, bd, True)
  dx64, _ = _grads(op, x64, dy64, g64, b64, False)
  return dict(op=op, family=family, dtype=dtype, ratio=ratio, ratio_rounded=true_ratio,
              seed=seed, dx=_err(dx1, dx0), dscale=_err(ds1, ds0), floor=_err(dx0, dx64))


def _cases():
  for dtype in DTYPES:
    for ratio in RATIOS:
      yield "layer_norm", "one", dtype, ratio
      if ratio:
        yield "layer_norm", "all", dtype, ratio
        yield "rms_norm", "one", dtype, ratio


def table(results):
  """A markdown table: the worst dx error over seeds per (op, family, dtype, ratio)."""
  groups = {}
  for r in results:
    groups.setdefault((r["op"], r["family"], r["dtype"], r["ratio"]), []).append(r)
  lines = ["| op | family | dtype | R | dx rel_max (worst seed) | dx rel_fro | dscale rel_max "
           "| floor (default vs f64) |", "|---|---|---|---|---|---|---|---|"]
  for (op, family, dtype, ratio), rs in sorted(groups.items(), key=lambda kv: (
      kv[0][0], kv[0][1], DTYPES.index(kv[0][2]), kv[0][3])):
    worst = lambda k, m: max(r[k][m] for r in rs)  # noqa: E731
    gamma_note = f"1/{ratio:g}" if op == "rms_norm" else f"{ratio:g}"
    lines.append(f"| {op} | {family} | {dtype} | {gamma_note} | {worst('dx', 'rel_max'):.2e} "
                 f"| {worst('dx', 'rel_fro'):.2e} | {worst('dscale', 'rel_max'):.2e} "
                 f"| {worst('floor', 'rel_max'):.2e} |")
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("out")
  ap.add_argument("--rows", type=positive_int, default=256)
  ap.add_argument("--d", type=positive_int, default=512)
  ap.add_argument("--seeds", type=positive_int, default=3)
  args = ap.parse_args()
  results = [measure(*case, args.rows, args.d, seed)
             for case in _cases() for seed in range(args.seeds)]
  results = [r for r in results if r is not None]
  out = dict(rows=args.rows, d=args.d, seeds=args.seeds, jax=jax.__version__,
             machine=platform.processor() or platform.machine(), results=results)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  md = table(results)
  with open(args.out.removesuffix(".json") + ".md", "w") as f:
    f.write(md + "\n")
  print(md)


if __name__ == "__main__":
  main()
