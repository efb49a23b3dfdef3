"""The functions of the kit survey (:mod:`experiments.kit_survey`): each real function of the JAX ecosystem
with its plain ``jax.numpy`` reference, its input domain, its half (``"A"``: the kit's fixes were made on it,
``"B"``: it only confirms them) and, for the elementwise ones, an mpmath oracle for the cross-check. A library
that does not import is recorded by the survey as skipped, with the reason.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Fn"]


@dataclasses.dataclass(frozen=True)
class Fn:
  """A function under survey: ``rule(*args)`` against ``reference(*args)``."""

  name: str
  half: str  # "A": the fixes' half; "B": the confirming half
  rule: Callable
  reference: Callable
  kind: str = "elementwise"  # or "rows" (last axis), "matrix", "pair"
  dtypes: tuple = ("float32",)
  mp: Callable | None = None  # mpmath scalar function (elementwise): value and derivative
  numpy: Callable | None = None  # NumPy float64 value (the others)
  domain: Callable | None = None  # maps a drawn float64 array into the function's domain
  needs: str = ""  # the optional package it needs


# ------------------------------------------------------------------ plain references

def _softplus(x):
  return jnp.maximum(x, 0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


def _sigmoid(x):
  return 1 / (1 + jnp.exp(-x))


def _log_softmax(x):
  s = x - jax.lax.stop_gradient(jnp.max(x, -1, keepdims=True))
  return s - jnp.log(jnp.sum(jnp.exp(s), -1, keepdims=True))


def _logsumexp(x):
  m = jax.lax.stop_gradient(jnp.max(x, -1, keepdims=True))
  return jnp.log(jnp.sum(jnp.exp(x - m), -1)) + m[..., 0]


def _layer_norm(x, scale, bias, eps=1e-6):
  mu = jnp.mean(x, -1, keepdims=True)
  var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
  return (x - mu) / jnp.sqrt(var + eps) * scale + bias


def _rms_norm(x, scale, eps=1e-6):
  return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * scale


def _gelu_tanh(x):
  return 0.5 * x * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _sinc(x):
  safe = jnp.where(x == 0, 1.0, x)
  return jnp.where(x == 0, 1.0, jnp.sin(np.pi * safe) / (np.pi * safe))


def _np_log_softmax(x):
  s = x - x.max(-1, keepdims=True)
  return s - np.log(np.exp(s).sum(-1, keepdims=True))


def _mp(name):
  """An mpmath scalar function by expression (mpmath is imported when the cross-check runs)."""
  import mpmath as mp
  table = {
      "relu": lambda x: max(x, 0), "softplus": lambda x: mp.log1p(mp.exp(x)),
      "sigmoid": lambda x: 1 / (1 + mp.exp(-x)), "log_sigmoid": lambda x: -mp.log1p(mp.exp(-x)),
      "silu": lambda x: x / (1 + mp.exp(-x)),
      "sinc": lambda x: mp.sinc(mp.pi * x) if x else mp.mpf(1),
      "gelu_tanh": lambda x: x / 2 * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (x + mp.mpf("0.044715") * x ** 3))),
      "gelu": lambda x: x / 2 * (1 + mp.erf(x / mp.sqrt(2))), "elu": lambda x: x if x > 0 else mp.expm1(x),
      "softsign": lambda x: x / (1 + abs(x)), "celu": lambda x: x if x > 0 else mp.expm1(x),
      "selu": lambda x: mp.mpf("1.0507009873554804934193349852946") * (
          x if x > 0 else mp.mpf("1.6732632423543772848170429916717") * mp.expm1(x)),
      "mish": lambda x: x * mp.tanh(mp.log1p(mp.exp(x))), "tanh": mp.tanh,
      "leaky_relu": lambda x: x if x >= 0 else x / 100, "ndtr": lambda x: mp.ncdf(x),
      "log_ndtr": lambda x: mp.log(mp.ncdf(x)), "logit": lambda x: mp.log(x / (1 - x)),
      "entr": lambda x: -x * mp.log(x), "erf": mp.erf, "sin": mp.sin,
  }
  return table[name]


def _unit(a):
  """Into (0, 1): ``0.02 + 0.96 * |tanh(a)|``."""
  return 0.02 + 0.96 * np.abs(np.tanh(a))


def _positive(a):
  return np.abs(a) + 1e-3


def surveyed_functions() -> list:
  """Every surveyed function: the fixes' half ``"A"``, then the confirming half ``"B"``."""
  return _half_a() + _half_b()


def _half_a() -> list:
  """The half the kit's fixes were made on."""
  nn = jax.nn
  return [
      Fn("jax.nn.relu", "A", nn.relu, lambda x: jnp.maximum(x, 0.0), mp=lambda: _mp("relu")),
      Fn("jax.nn.softplus", "A", nn.softplus, _softplus, mp=lambda: _mp("softplus")),
      Fn("jax.nn.sigmoid", "A", nn.sigmoid, _sigmoid, mp=lambda: _mp("sigmoid")),
      Fn("jax.nn.log_sigmoid", "A", nn.log_sigmoid, lambda x: -_softplus(-x), mp=lambda: _mp("log_sigmoid")),
      Fn("jax.nn.silu", "A", nn.silu, lambda x: x * _sigmoid(x), dtypes=("float32", "float16"),
         mp=lambda: _mp("silu")),
      Fn("jax.nn.softmax", "A", nn.softmax, lambda x: jnp.exp(_log_softmax(x)), kind="rows",
         numpy=lambda x: np.exp(_np_log_softmax(x))),
      Fn("optax.safe_norm", "A", lambda x: _optax().safe_norm(x, 1e-6, axis=-1),
         lambda x: jnp.maximum(jnp.sqrt(jnp.sum(x * x, -1)), 1e-6), kind="rows",
         numpy=lambda x: np.maximum(np.sqrt((x * x).sum(-1)), 1e-6)),
      Fn("tokamax.layer_norm (xla)", "A", lambda x, s, b: _tokamax().layer_norm(x, s, b, implementation="xla"),
         _layer_norm, kind="norm", dtypes=("float32", "bfloat16"), needs="tokamax",
         numpy=lambda x, s, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * s + b),
      Fn("jax.nn.standardize", "A", lambda x: nn.standardize(x, axis=-1, epsilon=1e-5),
         lambda x: _layer_norm(x, 1.0, 0.0, 1e-5), kind="rows",
         numpy=lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
      Fn("jax.nn.log_softmax", "A", nn.log_softmax, _log_softmax, kind="rows",
         numpy=_np_log_softmax),
      Fn("jax.nn.logsumexp", "A", lambda x: nn.logsumexp(x, axis=-1), _logsumexp, kind="rows",
         numpy=lambda x: x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))),
      Fn("jnp.sinc", "A", jnp.sinc, _sinc, mp=lambda: _mp("sinc")),
      Fn("jax.nn.gelu (tanh)", "A", lambda x: nn.gelu(x, approximate=True), _gelu_tanh, mp=lambda: _mp("gelu_tanh")),
      Fn("jax.nn.gelu (erf)", "A", lambda x: nn.gelu(x, approximate=False),
         lambda x: 0.5 * x * (1 + jax.lax.erf(x / np.sqrt(2))), mp=lambda: _mp("gelu")),
      Fn("jnp.linalg.norm", "A", lambda x: jnp.linalg.norm(x, axis=-1), lambda x: jnp.sqrt(jnp.sum(x * x, -1)),
         kind="rows", numpy=lambda x: np.sqrt((x * x).sum(-1))),
      Fn("jax.nn.elu", "A", nn.elu, lambda x: jnp.where(x > 0, x, jnp.expm1(jnp.minimum(x, 0))), mp=lambda: _mp("elu")),
      Fn("flax.linen.LayerNorm", "A", _flax_layer_norm, _layer_norm, kind="norm",
         numpy=lambda x, s, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * s + b),
  ]


def _half_b() -> list:
  """The confirming half: it only confirms the fixes."""
  nn, sp = jax.nn, jax.scipy.special
  return [
      Fn("jax.nn.softsign", "B", nn.soft_sign, lambda x: x / (1 + jnp.abs(x)), mp=lambda: _mp("softsign")),
      Fn("jax.nn.celu", "B", nn.celu, lambda x: jnp.where(x > 0, x, jnp.expm1(jnp.minimum(x, 0))),
         mp=lambda: _mp("celu")),
      Fn("jax.nn.selu", "B", nn.selu, lambda x: 1.0507009873554804934193349852946 * jnp.where(
          x > 0, x, 1.6732632423543772848170429916717 * jnp.expm1(jnp.minimum(x, 0))), mp=lambda: _mp("selu")),
      Fn("jax.nn.mish", "B", nn.mish, lambda x: x * jnp.tanh(_softplus(x)), mp=lambda: _mp("mish")),
      Fn("jax.nn.leaky_relu", "B", nn.leaky_relu, lambda x: jnp.where(x >= 0, x, 0.01 * x),
         mp=lambda: _mp("leaky_relu")),
      Fn("jnp.tanh", "B", jnp.tanh, lambda x: 1 - 2 / (jnp.exp(2 * x) + 1), mp=lambda: _mp("tanh")),
      Fn("jax.scipy.special.ndtr", "B", sp.ndtr, lambda x: 0.5 * jax.lax.erfc(-x / np.sqrt(2)), mp=lambda: _mp("ndtr")),
      Fn("jax.scipy.special.log_ndtr", "B", sp.log_ndtr, lambda x: jnp.log(0.5 * jax.lax.erfc(-x / np.sqrt(2))),
         mp=lambda: _mp("log_ndtr")),
      Fn("jax.scipy.special.logit", "B", sp.logit, lambda x: jnp.log(x / (1 - x)), mp=lambda: _mp("logit"),
         domain=_unit),
      Fn("jax.scipy.special.entr", "B", sp.entr, lambda x: -x * jnp.log(x), mp=lambda: _mp("entr"), domain=_positive),
      Fn("jax.scipy.special.erf", "B", sp.erf, lambda x: jax.lax.erf(x), mp=lambda: _mp("erf")),
      Fn("optax.huber_loss", "B", lambda x: _optax().huber_loss(x),
         lambda x: jnp.where(jnp.abs(x) <= 1, 0.5 * x * x, jnp.abs(x) - 0.5),
         numpy=lambda x: np.where(np.abs(x) <= 1, 0.5 * x * x, np.abs(x) - 0.5)),
      Fn("optax.softmax_cross_entropy", "B", lambda x, y: _optax().softmax_cross_entropy(x, y),
         lambda x, y: -jnp.sum(y * _log_softmax(x), -1), kind="pair",
         numpy=lambda x, y: -(y * _np_log_softmax(x)).sum(-1)),
      Fn("optax.sigmoid_binary_cross_entropy", "B",
         lambda x, y: _optax().sigmoid_binary_cross_entropy(x, y),
         lambda x, y: _softplus(x) - x * y, kind="pair",
         numpy=lambda x, y: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))) - x * y),
      Fn("flax.linen.RMSNorm", "B", _flax_rms_norm, _rms_norm, kind="rmsnorm",
         numpy=lambda x, s: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * s),
      Fn("equinox.nn.LayerNorm", "B", _eqx_layer_norm, lambda x, s, b: _layer_norm(x, s, b, 1e-5), kind="norm",
         needs="equinox",
         numpy=lambda x, s, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * s + b),
      Fn("tokamax.layer_norm (rms, xla)", "B", lambda x, s: _tokamax().layer_norm(
          x, s, None, subtract_mean=False, implementation="xla"), _rms_norm, kind="rmsnorm", needs="tokamax",
         numpy=lambda x, s: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * s),
      Fn("jnp.linalg.eigvalsh (2x2)", "B", jnp.linalg.eigvalsh, _eig2, kind="matrix",
         numpy=lambda a: np.linalg.eigvalsh((a + np.swapaxes(a, -1, -2)) / 2)),  # the symmetric part, as JAX takes it
      Fn("jnp.linalg.det (3x3)", "B", jnp.linalg.det, _det3, kind="matrix3", numpy=lambda a: np.linalg.det(a)),
  ]


def _optax():
  import optax
  return optax


def _tokamax():
  """tokamax, its absl flags parsed from the program name alone (it reads them on first use and
  would reject this command's own options)."""
  from absl import flags
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])
  import tokamax
  return tokamax


def _flax_layer_norm(x, s, b):
  import flax.linen as nn
  return nn.LayerNorm(epsilon=1e-6).apply({"params": {"scale": s, "bias": b}}, x)


def _flax_rms_norm(x, s):
  import flax.linen as nn
  return nn.RMSNorm(epsilon=1e-6).apply({"params": {"scale": s}}, x)


def _eqx_layer_norm(x, s, b):
  import equinox as eqx
  ln = eqx.nn.LayerNorm(x.shape[-1], eps=1e-5)
  ln = eqx.tree_at(lambda m: (m.weight, m.bias), ln, (s, b))
  return jax.vmap(ln)(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def _eig2(a):
  """Eigenvalues of the symmetric part of a 2 x 2 matrix, ascending, in closed form."""
  p, q, r = a[..., 0, 0], (a[..., 0, 1] + a[..., 1, 0]) / 2, a[..., 1, 1]
  m, d = (p + r) / 2, jnp.sqrt(((p - r) / 2) ** 2 + q * q)
  return jnp.stack([m - d, m + d], -1)


def _det3(a):
  """A 3 x 3 determinant by cofactors."""
  c = lambda i, j: a[..., i, j]  # noqa: E731
  return (c(0, 0) * (c(1, 1) * c(2, 2) - c(1, 2) * c(2, 1)) - c(0, 1) * (c(1, 0) * c(2, 2) - c(1, 2) * c(2, 0))
          + c(0, 2) * (c(1, 0) * c(2, 1) - c(1, 1) * c(2, 0)))


# ------------------------------------------------------------------ running
