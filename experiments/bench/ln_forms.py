"""LayerNorm's forward alone written four ways in plain ``jnp``, against Flax's and jaxnorm's layers.

Issue 62 asks for jaxnorm's accurate LayerNorm forward at most 5% above Flax's default (the fast
variance). This separates the algorithm from the library: each form below is a jitted ``jnp``
function (no jaxnorm code), timed interleaved in one process with Flax's ``nnx.LayerNorm`` and
jaxnorm's (defaults, ``nnx.jit``: rows ``flax`` and ``jaxnorm``) and with the two libraries'
functions called as the forms are, ``jax.jit`` of ``(x, g, b)`` (rows ``flax_op``, Linen's
``LayerNorm``; ``flax_op_two_pass``, the same with ``use_fast_variance=False``; ``jaxnorm_op``,
:func:`jaxnorm.layer_norm`; no module traversal per call)::

  python -m experiments.bench.ln_forms [--shapes 1024x64,4096x256] [--repeats 9] [--sample-ms 100]
      [--out DIR] [--tag TAG]

The forms (float32, scale 1.1, bias 0.1, ``x ~ N(3, 1)``):

* ``offset``: jaxnorm's accurate statistics as its forward alone takes them on 4096 rows or more:
  the mean, then ``sum(x - m)`` and ``sum((x - m)^2)`` (on fewer rows it pivots on the first element);
* ``first_pivot``: both shifted sums about the row's first element, in one pass;
* ``two_pass``: the mean, then ``sum((x - m)^2)`` (Flax's ``use_fast_variance=False``);
* ``fast``: ``sum(x)`` and ``sum(x^2)`` in one pass (Flax's default).

Each sample is the mean CPU time of as many calls as fit in ``--sample-ms``, the programs taken in a
rotating order (:func:`experiments.bench.timing.time_interleaved`);
the table gives each form's median over ``--repeats`` rounds and its ratio to Flax's layer, to
Flax's op (``flax_op``: the like-for-like baseline, called as the forms are) and to the ``fast``
form of the same run. With ``--out``, the JSON and markdown go there
(:func:`experiments.bench.output.write_outputs`, kind ``ln-forms``). The figures of issue 62 are
in ``docs/perf-notes.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import jax
import jax.numpy as jnp
from flax import nnx

import jaxnorm.nnx
from experiments.argtypes import positive_int
from experiments.bench import impls, output, timing


def _normalize(xc, delta, var, g, b, eps=1e-6):
  return (xc - delta) * jax.lax.rsqrt(var + eps) * g[None] + b[None]


def _shifted(x, pivot, g, b):
  """Both shifted sums about ``pivot`` (``(rows, 1)``), the mean's offset taken from the first."""
  n = x.shape[-1]
  xc = x - pivot
  delta = jnp.sum(xc, -1, keepdims=True) / n
  var = jnp.maximum(jnp.sum(xc * xc, -1, keepdims=True) / n - delta * delta, 0.0)
  return _normalize(xc, delta, var, g, b)


def offset(x, g, b):
  return _shifted(x, jnp.sum(x, -1, keepdims=True) / x.shape[-1], g, b)


def first_pivot(x, g, b):
  return _shifted(x, x[:, :1], g, b)


def two_pass(x, g, b):
  n = x.shape[-1]
  xc = x - jnp.sum(x, -1, keepdims=True) / n
  return _normalize(xc, 0.0, jnp.sum(xc * xc, -1, keepdims=True) / n, g, b)


def fast(x, g, b):
  n = x.shape[-1]
  m = jnp.sum(x, -1, keepdims=True) / n
  return _normalize(x - m, 0.0, jnp.maximum(jnp.sum(x * x, -1, keepdims=True) / n - m * m,
                                               0.0), g, b)


FORMS = {"offset": offset, "first_pivot": first_pivot, "two_pass": two_pass, "fast": fast}


# The two libraries' LayerNorm as the CPU bench builds them (experiments.bench.impls, epsilon 1e-6):
# Flax's Linen layer with its default fast variance and with use_fast_variance=False, and jaxnorm's
# op with its accurate default on XLA.
OPS = {"flax_op": "flax-linen", "flax_op_two_pass": "flax-linen-twopass", "jaxnorm_op": "jaxnorm-xla"}


def library_ops() -> dict:
  """``{row name: f(x, g, b)}`` for :data:`OPS`, built by :func:`experiments.bench.impls.implementations`."""
  table = impls.implementations()
  return {name: table[impl]("layer_norm") for name, impl in OPS.items()}


def _programs(rows: int, d: int) -> dict:
  """``{name: (callable, args)}``: the four forms, the two layers and the two libraries' ops,
  compiled."""
  x = jax.random.normal(jax.random.key(0), (rows, d)) + 3.0
  g, b = jnp.full((d,), 1.1), jnp.full((d,), 0.1)
  out = {k: (jax.jit(f), (x, g, b)) for k, f in FORMS.items()}
  call = nnx.jit(lambda m, x: m(x))
  out["flax"] = (call, (nnx.LayerNorm(d, rngs=nnx.Rngs(0)), x))
  out["jaxnorm"] = (nnx.jit(lambda m, x: m(x)), (jaxnorm.nnx.LayerNorm(d, rngs=nnx.Rngs(0)), x))
  # The two libraries' programs called as the forms are (jax.jit of (x, g, b), no module
  # traversal): what the layers' rows above add is nnx.jit's per-call Python work.
  out.update({k: (jax.jit(f), (x, g, b)) for k, f in library_ops().items()})
  for fn, args in out.values():
    fn(*args).block_until_ready()
  return out


def measure(rows: int, d: int, rounds: int, sample_ms: float) -> dict:
  """``{name: [seconds per call, one per round]}`` for the forms, layers and ops at ``rows x d``:
  :func:`experiments.bench.timing.time_interleaved` on the CPU clock (the order rotates)."""
  timed = timing.time_interleaved(_programs(rows, d), repeats=rounds, sample_ms=sample_ms,
                                  clock="cpu")
  return {k: v["times_s"] for k, v in timed.items()}


def rows_of(shape: str, samples: dict) -> list[dict]:
  """One row per form, layer and op: its median and its ratios to Flax's layer, Flax's op and the
  fast form."""
  med = {k: statistics.median(v) for k, v in samples.items()}
  return [{"shape": shape, "form": k, "median_us": t * 1e6, "vs_flax": t / med["flax"],
           "vs_flax_op": t / med["flax_op"], "vs_fast": t / med["fast"], "samples_s": samples[k]}
          for k, t in med.items()]


def markdown(meta: dict, rows: list[dict]) -> str:
  lines = ["# LayerNorm's forward alone, four forms in plain jnp against Flax's and jaxnorm's layers",
           "", f"Device: {meta['device']}; {meta['date']}; load {meta['load']}; versions "
           f"{meta['versions']}. {meta['repeats']} interleaved rounds of {meta['sample_ms']} ms "
           "CPU-time samples; medians. Command: `" + meta["command"] + "`.", "",
           "| shape | form | median (us) | / Flax's layer | / Flax's op | / fast form |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['shape']} | {r['form']} | {r['median_us']:.0f} | {r['vs_flax']:.2f} | "
            f"{r['vs_flax_op']:.2f} | {r['vs_fast']:.2f} |" for r in rows]
  return "\n".join(lines) + "\n"


def _shape(text: str) -> tuple[int, int]:
  parts = text.split("x")
  if len(parts) != 2:
    raise argparse.ArgumentTypeError(f"a shape is ROWSxD, got {text!r}")
  return positive_int(parts[0]), positive_int(parts[1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.bench.ln_forms",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--shapes", default="1024x64,4096x256,8192x1024",
                      type=lambda s: tuple(_shape(t) for t in s.split(",")))
  output.add_run_args(parser, repeats=9)
  parser.set_defaults(sample_ms=100.0)
  argv = sys.argv[1:] if argv is None else argv
  args = parser.parse_args(argv)
  meta = output.bench_meta("python -m experiments.bench.ln_forms " + " ".join(argv),
                           args.repeats, sample_ms=args.sample_ms)
  rows = [row for r, d in args.shapes
          for row in rows_of(f"{r}x{d}", measure(r, d, args.repeats, args.sample_ms))]
  output.write_outputs(args.out, "ln-forms", args.tag, meta, rows, markdown(meta, rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
