"""The implementations the benchmark compares: a name and a builder per implementation.

A builder takes an op name and returns the function ``f(x, scale, bias) -> y`` (plain ops) or
``f(x, residual, scale, bias) -> (y, h)`` (fused residual add + norm), or raises
:class:`NotApplicable` with the reason (Pallas entries on a CPU, a package that is not installed);
such entries are listed as ``n/a``. :func:`implementations` and :func:`fused_implementations`
return the tables; :mod:`experiments.bench.cli` and :mod:`experiments.studies.speed` build from them.
"""

from __future__ import annotations

import importlib
from typing import Callable

import jax
import jax.numpy as jnp

import jaxnorm


# The norm family's ops of jaxnorm.OPS, and their residual add + norm ops ((y, h) = op(x, residual)).
OPS = tuple(name for name, op in jaxnorm.OPS.items() if op.family == "norm")
FUSED_OPS = tuple(jaxnorm.OPS[name].add_fn.__name__ for name in OPS if jaxnorm.OPS[name].add_fn)
ALL_OPS = OPS + FUSED_OPS
EPSILON = 1e-6


class NotApplicable(Exception):
  """Raised by a builder whose implementation cannot run here; the message says why."""


def _import(name: str):
  try:
    return importlib.import_module(name)
  except Exception as e:  # noqa: BLE001 - any import failure makes the entry n/a.
    raise NotApplicable(f"cannot import {name}: {type(e).__name__}: {e}") from None


def _require_gpu(what: str) -> None:
  backend = jax.default_backend()
  if not jaxnorm.pallas_compiles_on(backend):
    raise NotApplicable(f"{what} needs a GPU (Triton); this backend is {backend}")


def param_dict(op: str, scale, bias) -> dict:
  """``op``'s parameters by name (its entry of jaxnorm.OPS), from the benchmark's ``scale`` and ``bias``."""
  given = {"scale": scale, "bias": bias}
  return {name: given[name] for name in jaxnorm.OPS[op].params}


def _params(op: str, scale, bias):
  """``op``'s parameters in call order (see :func:`param_dict`)."""
  return tuple(param_dict(op, scale, bias).values())


def has_option(op: str, option: str) -> bool:
  """Whether ``op``'s declaration (jaxnorm.OPS) takes the keyword ``option``."""
  return any(o.name == option for o in jaxnorm.OPS[op].decl.options)


def _jaxnorm(impl: str, interpret: bool):
  def build(op: str):
    if impl == "xla-fastvar":
      return _jaxnorm_fast_variance(op)
    if impl == "pallas" and not interpret:
      _require_gpu("jaxnorm pallas")
    if impl == "pallas" and interpret:
      return _jaxnorm_interpreted(op)
    fn = jaxnorm.OPS[op].fn
    return lambda x, scale, bias: fn(x, *_params(op, scale, bias), epsilon=EPSILON, impl=impl)
  return build


def _jaxnorm_fast_variance(op: str):
  """LayerNorm with ``use_fast_variance=True`` (Flax's default variance; XLA only)."""
  if not has_option(op, "use_fast_variance"):
    raise NotApplicable(f"{op} has no use_fast_variance option")
  fn = jaxnorm.OPS[op].fn
  return lambda x, scale, bias: fn(x, *_params(op, scale, bias), epsilon=EPSILON, impl="xla",
                                   use_fast_variance=True)


def _jaxnorm_interpreted(op: str):
  """The public op with impl="pallas" and the kernels in Pallas interpret mode (any backend)."""
  pallas = jaxnorm.PallasConfig(interpret=True)
  fn = jaxnorm.OPS[op].fn
  return lambda x, scale, bias: fn(x, *_params(op, scale, bias), epsilon=EPSILON, impl="pallas",
                                   pallas=pallas)


def _reference(op: str):
  ref = _import("jaxnorm.reference")
  fn = getattr(ref, op)
  return lambda x, scale, bias: fn(x, *_params(op, scale, bias), epsilon=EPSILON)


def _flax_linen(op: str, use_fast_variance: bool = True):
  """Flax's Linen layer; LayerNorm with ``use_fast_variance`` (Flax's default: True)."""
  nn = _import("flax.linen")
  # Flax's layer of the same class name as jaxnorm's (OPS[op].layer), with the same parameters.
  fast = has_option(op, "use_fast_variance")
  if not use_fast_variance and not fast:
    raise NotApplicable(f"{op} has no use_fast_variance option")
  layer = getattr(nn, jaxnorm.OPS[op].layer)
  options = {"use_fast_variance": use_fast_variance} if fast else {}

  def f(x, scale, bias):
    module = layer(epsilon=EPSILON, dtype=x.dtype, **options)
    return module.apply({"params": param_dict(op, scale, bias)}, x)
  return f


def _jax_pallas_ops(interpret: bool):
  def build(op: str):
    if not interpret:
      _require_gpu("jax.experimental.pallas.ops.gpu")
    mod = _import(f"jax.experimental.pallas.ops.gpu.{op}")
    fn = getattr(mod, op)

    def f(x, scale, bias):
      # These ops take (batch, seq, d) and always add a bias (RMSNorm too); their config
      # (num_warps, num_stages, eps, backward_pass_impl, interpret) is positional.
      b = param_dict(op, scale, bias).get("bias", jnp.zeros_like(scale))
      return fn(x[None], scale, b, None, 3, EPSILON, "triton", interpret)[0]
    return f
  return build


def _tokamax(op: str):
  _require_gpu("tokamax triton")
  tokamax = _import("tokamax")

  def f(x, scale, bias):
    return tokamax.layer_norm(
        x, scale, param_dict(op, scale, bias).get("bias"), epsilon=EPSILON,
        subtract_mean=jaxnorm.OPS[op].decl.mean_path, implementation="triton")
  return f


def implementations(interpret: bool = False) -> dict[str, Callable[[str], Callable]]:
  """Name -> builder ``(op) -> f(x, scale, bias)`` of every compared implementation."""
  return {
      "jaxnorm-xla": _jaxnorm("xla", interpret),
      "jaxnorm-pallas": _jaxnorm("pallas", interpret),
      # LayerNorm with use_fast_variance=True, compared with flax-linen (Flax's default).
      "jaxnorm-xla-fastvar": _jaxnorm("xla-fastvar", interpret),
      "reference-vjp": _reference,
      "flax-linen": _flax_linen,
      # Flax's two-pass variance (use_fast_variance=False), compared with jaxnorm's default.
      "flax-linen-twopass": lambda op: _flax_linen(op, use_fast_variance=False),
      "jax-pallas-ops": _jax_pallas_ops(interpret),
      "tokamax": _tokamax,
  }


IMPLEMENTATIONS = tuple(implementations())

# Like-for-like pairs (implementation, Flax baseline): jaxnorm's default (accurate) variance
# against Flax's two-pass one, jaxnorm's fast variance against Flax's default (fast) one.
LIKE_FOR_LIKE = (("jaxnorm-xla", "flax-linen-twopass"), ("jaxnorm-xla-fastvar", "flax-linen"))


def _plain(op: str) -> str:
  return op[len("add_"):]


def _fused_jaxnorm(impl: str, interpret: bool):
  def build(op: str):
    if impl == "pallas" and not interpret:
      _require_gpu("jaxnorm pallas")
    fn = getattr(jaxnorm, op)
    # Interpret mode: the fused kernels interpreted, as the plain ops' (_jaxnorm_interpreted).
    kw = dict(epsilon=EPSILON, impl=impl)
    if impl == "pallas" and interpret:
      kw["pallas"] = jaxnorm.PallasConfig(interpret=True)
    plain = _plain(op)
    return lambda x, r, scale, bias: fn(x, r, *_params(plain, scale, bias), **kw)
  return build


def _unfused(plain_builder: Callable[[str], Callable]):
  """The residual add, then the plain op of ``plain_builder`` (``(op) -> f(x, scale, bias)``): the
  builder ``(add_op) -> f(x, residual, scale, bias) -> (y, h)`` that the fused op is timed against."""
  def build(op: str):
    plain = plain_builder(_plain(op))

    def f(x, r, scale, bias):
      h = x + r
      return plain(h, scale, bias), h
    return f
  return build


def fused_implementations(interpret: bool = False) -> dict[str, Callable[[str], Callable]]:
  """Name -> builder ``(op) -> f(x, residual, scale, bias) -> (y, h)`` for the fused ops: per jaxnorm
  backend the fused op and the add followed by the plain op, then Flax's add + LayerNorm/RMSNorm."""
  table = {}
  for impl in ("xla", "pallas"):
    table["jaxnorm-" + impl] = _fused_jaxnorm(impl, interpret)
    table["unfused-" + impl] = _unfused(_jaxnorm(impl, interpret))
  table["flax-linen"] = _unfused(_flax_linen)
  return table


FUSED_IMPLEMENTATIONS = tuple(fused_implementations())
