"""memory_efficient=True against the default in jaxnorm.models: residual bytes and step time.

For each norm (LayerNorm, RMSNorm) a Pre-LN :class:`jaxnorm.models.TransformerLM` with
``fuse_residual_norm=False`` (the layout ``norm_memory_efficient`` needs; the default is run in
the same layout) and ``scan_layers=False``:

* the residuals reverse mode saves for one training step's loss, from
  ``jax.ad_checkpoint.print_saved_residuals`` (parsed: the bytes of each saved array), their
  total and the difference per norm layer (``2 n_layers + 1`` norms);
* the compiled gradient program's ``memory_analysis()`` (temporary bytes);
* the jitted ``value_and_grad`` step's time, both variants interleaved in ``--rounds`` rounds
  (process CPU time per call, median of each and the median of the per-round ratios).

Usage::

  python experiments/bench/memory_efficient.py OUT.json [--rounds 15] [--batch 8] [--seq 128]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import platform
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.models import TransformerConfig, TransformerLM
from experiments.argtypes import positive_int

SIZES = dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024, vocab_size=256, max_len=128)
_ARRAY = re.compile(r"^(\w+)\[([\d,]*)\]")  # "f32[8,128,256] ..." of print_saved_residuals
_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i32": 4, "u32": 4, "bool": 1}


def _loss_fn(norm_type: str, memory_efficient: bool):
  """``(loss(params, tokens), params)`` of a fresh model (the same seed for both variants)."""
  config = TransformerConfig(**SIZES, norm_type=norm_type, fuse_residual_norm=False,
                             scan_layers=False, norm_memory_efficient=memory_efficient)
  graphdef, params = nnx.split(TransformerLM(config, rngs=nnx.Rngs(0)))

  def loss(params, tokens):
    logits = nnx.merge(graphdef, params)(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  return loss, params


def residual_bytes(f, *args) -> tuple[int, int]:
  """``(bytes, count)`` of the arrays ``print_saved_residuals(f, *args)`` lists, arguments
  excluded (the parameters and tokens are held whatever the backward keeps)."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(f, *args)
  total = count = 0
  for line in out.getvalue().splitlines():
    m = _ARRAY.match(line)
    if m is None or "from the argument" in line:
      continue
    shape = [int(n) for n in m.group(2).split(",") if n]
    total += math.prod(shape) * _ITEMSIZE[m.group(1)]
    count += 1
  return total, count


def _cpu_time(f, *args) -> float:
  t0 = time.process_time()
  jax.block_until_ready(f(*args))
  return time.process_time() - t0


def measure(norm_type: str, tokens, rounds: int) -> dict:
  """The residuals, compiled memory and interleaved step times of both variants."""
  out, steps = {}, {}
  for me in (False, True):
    loss, params = _loss_fn(norm_type, me)
    nbytes, count = residual_bytes(loss, params, tokens)
    step = jax.jit(jax.value_and_grad(loss))
    mem = step.lower(params, tokens).compile().memory_analysis()
    jax.block_until_ready(step(params, tokens))  # compile and warm
    steps[me] = (step, params)
    out["memory_efficient" if me else "default"] = dict(
        residual_bytes=nbytes, residual_arrays=count,
        temp_bytes=None if mem is None else int(mem.temp_size_in_bytes))
  times = {False: [], True: []}
  for r in range(rounds):
    for me in ((False, True) if r % 2 == 0 else (True, False)):
      step, params = steps[me]
      times[me].append(_cpu_time(step, params, tokens))
  ratios = [b / a for a, b in zip(times[False], times[True])]
  n_norms = 2 * SIZES["n_layers"] + 1
  saved = out["default"]["residual_bytes"] - out["memory_efficient"]["residual_bytes"]
  out.update(norm_layers=n_norms, residual_bytes_saved=saved,
             residual_bytes_saved_per_norm=saved / n_norms,
             step_s_median=dict(default=float(np.median(times[False])),
                                memory_efficient=float(np.median(times[True]))),
             step_ratio_median=float(np.median(ratios)), rounds=rounds)
  return out


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("out")
  ap.add_argument("--rounds", type=positive_int, default=15)
  ap.add_argument("--batch", type=positive_int, default=8)
  ap.add_argument("--seq", type=positive_int, default=128)
  a = ap.parse_args()
  seq = min(a.seq, SIZES["max_len"])
  tokens = jax.random.randint(jax.random.key(1), (a.batch, seq + 1), 0, SIZES["vocab_size"])
  result = dict(sizes=SIZES, batch=a.batch, seq=tokens.shape[1] - 1, backend=jax.default_backend(),
                machine=platform.processor() or platform.machine(), jax=jax.__version__,
                norms={n: measure(n, tokens, a.rounds) for n in ("layer_norm", "rms_norm")})
  with open(a.out, "w") as f:
    json.dump(result, f, indent=1)
  print(json.dumps(result["norms"], indent=1))


if __name__ == "__main__":
  main()
