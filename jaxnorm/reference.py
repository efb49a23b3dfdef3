r"""Plain ``jax.numpy`` norms (LayerNorm, RMSNorm, gated RMSNorm), DyT and Derf under autodiff.

This module is the oracle of the test suite and the autodiff baseline of the benchmarks. It
imports nothing from the rest of :mod:`jaxnorm` (no shared formula, no shared validation), so
a mistake in the library's own ``rstd``, affine stage or casting plan cannot hide by being
compared with itself. It has no custom derivative rules and favours clarity over speed.

With :math:`d` elements in the normalized trailing ``axis`` (only the masked-in ones, with
``mask``), the statistics are computed in :math:`C` = ``promote_types(x.dtype, float32)``
(float64 stays float64) by the two-pass formula (the mean first, then the mean square of the
centred values, never :math:`E[x^2] - E[x]^2`):

.. math::

   \mu = \frac{1}{d}\sum_i x_i, \qquad \sigma^2 = \frac{1}{d}\sum_i (x_i - \mu)^2, \qquad
   m = \frac{1}{d}\sum_i x_i^2,

   r = \begin{cases} (v + \epsilon)^{-1/2} & \text{epsilon\_placement="inside"} \\
                     (\sqrt v + \epsilon)^{-1} & \text{epsilon\_placement="outside"}
       \end{cases}

with :math:`v = \sigma^2` (LayerNorm) or :math:`v = m` (RMSNorm), and then

.. math::

   \hat x = (x - \mu)\, r \ \text{(LayerNorm)}, \qquad \hat x = x\, r \ \text{(RMSNorm)},
   \qquad y = \mathrm{rd}_O(\hat x\,\gamma + \beta),

where :math:`\gamma` is ``scale``, or ``1 + scale`` with ``zero_centered_scale=True``, and
:math:`\mathrm{rd}_O` rounds to ``dtype`` (default: the dtype of ``x``).

``casting`` ("float32", "llama", "t5"; see ``docs/modules.md``, "Casting modes") sets where the
affine stage rounds, written here in the published order with ``jax.numpy``'s own promotion:

.. math::

   \text{float32: } y = \mathrm{rd}_O\big((x - \mu)\,(r\,\gamma) + \beta\big), \qquad
   \text{llama: } y = \mathrm{rd}_O(\mathrm{rd}_{x}(\hat x) \cdot \gamma + \beta), \qquad
   \text{t5: } y = \mathrm{rd}_O(\mathrm{rd}_{s}(\hat x) \cdot \gamma + \beta)

("float32" multiplies the two per-row and per-feature factors first, as Flax's layers do, which
in float32 is one rounding away from :math:`\hat x\,\gamma`; ``x`` for :math:`x - \mu` in
RMSNorm), where in "llama" and "t5" :math:`\gamma` (``scale`` or ``1 + scale``) stays in the scale's
dtype and the product and the add are computed in the promoted dtype of their operands
(``rd_x``: round to ``x.dtype``; ``rd_s``: to ``scale.dtype``; "t5" without a scale is
"float32").

The arguments are those of :func:`jaxnorm.layer_norm` and :func:`jaxnorm.rms_norm`; this module
checks only what it needs to compute (a known option string, trailing axes) and leaves the
library's full argument validation to the library.
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp
from jax import lax

__all__ = ["derf", "dyt", "gated_rms_norm", "layer_norm", "pointwise", "rms_norm"]

# Written out here, not imported: the oracle depends on nothing in jaxnorm.
_CASTINGS = ("float32", "llama", "t5")
_PLACEMENTS = ("inside", "outside")


def _options(x, axis, epsilon_placement, casting):
  """``(axes, x in C)``: the normalized axes (sorted, non-negative, trailing) and ``x`` in C."""
  for name, value, allowed in (("epsilon_placement", epsilon_placement, _PLACEMENTS),
                               ("casting", casting, _CASTINGS)):
    if value not in allowed:
      raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
  axes = sorted(int(a) % x.ndim
                for a in ((axis,) if isinstance(axis, numbers.Integral) else tuple(axis)))
  if axes != list(range(x.ndim - len(axes), x.ndim)):
    raise ValueError(f"axis must name distinct trailing axes of x (rank {x.ndim}), got {axis!r}.")
  return tuple(axes), x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _rstd(v, epsilon, epsilon_placement):
  """:math:`r` of the module docstring from the variance (or mean square) ``v``."""
  epsilon = float(epsilon)  # a weak Python scalar: it never promotes ``v``'s dtype
  if epsilon_placement == "outside":
    return 1.0 / (jnp.sqrt(v) + epsilon)
  return lax.rsqrt(v + epsilon)


def _as_x(p, xhat, axes):
  """A parameter with explicit leading ones to ``xhat``'s rank (no implicit rank promotion).

  Of the normalized shape (or flat): ``(1, ..., 1, *normalized_shape)``. Per head (a trailing
  block of ``x``'s shape longer than the normalized one): ``(1, ..., 1, heads..., *normalized)``.
  """
  if p is None:
    return None
  if p.ndim > len(axes) and tuple(p.shape) == tuple(xhat.shape[xhat.ndim - p.ndim:]):
    return p.reshape((1,) * (xhat.ndim - p.ndim) + tuple(p.shape))
  return p.reshape((1,) * axes[0] + tuple(xhat.shape[axes[0]:]))


def _affine(xc, r, scale, bias, axes, zero_centered_scale, casting, x_dtype):
  """``x_hat * gamma + beta`` from ``x_c`` and ``r``, in the order of casts of ``casting``
  (module docstring); in "float32", ``x_c * (r * gamma) + beta``."""
  scale, bias = _as_x(scale, xc, axes), _as_x(bias, xc, axes)
  if casting != "float32" and not (casting == "t5" and scale is None):
    xhat = (xc * r).astype(x_dtype if casting == "llama" else scale.dtype)  # the early rounding
    if scale is not None:
      s = scale  # in its own dtype; 1 + s rounds there too
      xhat = xhat * ((1 + s) if zero_centered_scale else s)
    return xhat if bias is None else xhat + bias
  if scale is None:
    y = xc * r
  else:
    s = scale.astype(xc.dtype)
    y = xc * (r * ((1.0 + s) if zero_centered_scale else s))
  if bias is not None:
    y = y + bias.astype(y.dtype)
  return y


def layer_norm(x, scale=None, bias=None, *, epsilon=1e-6, axis=-1, mask=None,
               epsilon_placement="inside", zero_centered_scale=False, dtype=None,
               casting="float32"):
  r"""Reference LayerNorm (autodiff, two-pass variance).

  .. math::

     y = \mathrm{rd}_O\big(\gamma \odot (x - \mu)\, r + \beta\big)

  with :math:`\mu`, :math:`\sigma^2` and :math:`r` as in the module docstring.

  Args:
    x: ``(..., *normalized)`` floating array.
    scale: ``normalized`` (or its flat size), or per head a trailing block of ``x``'s shape
      that extends it (``(heads, *normalized)``), or None.
    bias: like ``scale``, or None.
    epsilon: the epsilon of :math:`r`.
    axis: the trailing axes to normalize over (int or tuple).
    mask: boolean array broadcastable to ``x``; the statistics use the True elements only.
    epsilon_placement: "inside" or "outside" (module docstring).
    zero_centered_scale: multiply by ``1 + scale`` instead of ``scale``.
    dtype: output dtype (default: ``x.dtype``).
    casting: "float32", "llama" or "t5" (module docstring).

  Returns:
    ``y``, the shape of ``x``, in ``dtype``.
  """
  axes, xf = _options(x, axis, epsilon_placement, casting)
  mean = jnp.mean(xf, axis=axes, keepdims=True, where=mask)
  var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True, where=mask)
  r = _rstd(var, epsilon, epsilon_placement)
  y = _affine(xf - mean, r, scale, bias, axes, zero_centered_scale, casting, x.dtype)
  return y.astype(dtype or x.dtype)


def rms_norm(x, scale=None, *, epsilon=1e-6, axis=-1, mask=None,
             epsilon_placement="inside", zero_centered_scale=False, dtype=None,
             casting="float32"):
  r"""Reference RMSNorm (autodiff).

  .. math::

     y = \mathrm{rd}_O\big(\gamma \odot x\, r\big), \qquad r \text{ from } m = \tfrac{1}{d}
     \textstyle\sum_i x_i^2

  (module docstring). Arguments as in :func:`layer_norm`, without ``bias``.

  Returns:
    ``y``, the shape of ``x``, in ``dtype``.
  """
  axes, xf = _options(x, axis, epsilon_placement, casting)
  ms = jnp.mean(jnp.square(xf), axis=axes, keepdims=True, where=mask)
  r = _rstd(ms, epsilon, epsilon_placement)
  y = _affine(xf, r, scale, None, axes, zero_centered_scale, casting, x.dtype)
  return y.astype(dtype or x.dtype)


def pointwise(phi, x, alpha, shift=None, scale=None, bias=None, *, dtype=None):
  r"""Reference of the pointwise family (DyT, Derf and any op declared like them):
  :math:`y = \mathrm{rd}_O(\gamma\,\varphi(\alpha x + s) + \beta)` under autodiff.

  The arithmetic runs in ``promote_types(inputs, float32)`` and the parameters broadcast by
  NumPy's rules from ``x``'s trailing axes; None parameters are left out (no shift, no scale,
  no bias). An op's oracle is this with its own ``phi`` (written in ``jax.numpy``/``lax``,
  differentiated by JAX, never the library's derived slope).

  Args:
    phi: :math:`\varphi`, an elementwise function of one array.
    x: floating array.
    alpha, shift, scale, bias: floating arrays broadcasting against ``x``, or None.
    dtype: output dtype (default: ``x.dtype``).

  Returns:
    ``y``, the shape of ``x``, in ``dtype``.
  """
  params = (alpha, shift, scale, bias)
  dt = jnp.promote_types(jnp.result_type(x, *(p for p in params if p is not None)), jnp.float32)
  xf = jnp.asarray(x).astype(dt)
  a, sh, s, b = (None if p is None else jnp.asarray(p).astype(dt).reshape(
      (1,) * (x.ndim - jnp.ndim(p)) + jnp.shape(p)) for p in params)
  u = a * xf
  if sh is not None:
    u = u + sh
  y = phi(u)
  if s is not None:
    y = y * s
  if b is not None:
    y = y + b
  return y.astype(dtype or x.dtype)


def dyt(x, alpha, scale=None, bias=None, *, dtype=None):
  r"""Reference DyT: :math:`y = \mathrm{rd}_O(\gamma \tanh(\alpha x) + \beta)`, the arithmetic in
  ``promote_types(inputs, float32)`` and the parameters broadcast by NumPy's rules (autodiff):
  :func:`pointwise` with :math:`\varphi = \tanh`."""
  return pointwise(jnp.tanh, x, alpha, None, scale, bias, dtype=dtype)


def derf(x, alpha, shift, scale=None, bias=None, *, dtype=None):
  r"""Reference Derf: :math:`y = \mathrm{rd}_O(\gamma\,\operatorname{erf}(\alpha x + s) + \beta)`,
  as :func:`dyt` (``erf`` from :func:`jax.lax.erf`, autodiff)."""
  return pointwise(lax.erf, x, alpha, shift, scale, bias, dtype=dtype)


def gated_rms_norm(x, z, scale=None, *, epsilon=1e-6, group_size=None, norm_before_gate=True,
                   casting="float32", dtype=None):
  r"""Reference gated RMSNorm (autodiff), group-wise over the trailing axis.

  With :math:`g = \operatorname{silu}(z) = z\,\sigma(z)` and the row split into groups of
  ``group_size`` features (None: one group, the whole row), each normalized by its own
  :math:`r = (\tfrac{1}{k}\sum_{i \in \text{group}} u_i^2 + \epsilon)^{-1/2}`:

  .. math::

     \text{norm\_before\_gate=True (Qwen3-Next, Mamba2's default): } u = x,\
     y = \mathrm{rd}_O(\gamma \odot u\, r \odot g);\qquad
     \text{False (gate first): } u = x \odot g,\ y = \mathrm{rd}_O(\gamma \odot u\, r).

  The arithmetic runs in ``promote_types(x, z, scale, float32)``. ``casting`` "llama" or "t5"
  rounds :math:`u\,r` first (to ``x.dtype``, or the scale's dtype), multiplies it by the scale
  in the promoted dtype of the two (``jax.numpy``'s promotion), and applies the gate after that
  in the compute dtype (gate last): Hugging Face's ``Qwen3NextRMSNormGated`` order ("t5" without
  a scale is "float32").

  Returns:
    ``y``, the shape of ``x``, in ``dtype`` (default ``x.dtype``).
  """
  dt = jnp.promote_types(jnp.result_type(*(a for a in (x, z, scale) if a is not None)),
                         jnp.float32)
  xf, zf = jnp.asarray(x).astype(dt), jnp.asarray(z).astype(dt)
  d = x.shape[-1]
  k = (d or 1) if group_size is None else group_size  # no features: one empty group
  gate = zf * (1.0 / (1.0 + jnp.exp(-zf)))
  u = xf if norm_before_gate else xf * gate
  ug = u.reshape(u.shape[:-1] + (d // k, k))
  r = lax.rsqrt(jnp.mean(jnp.square(ug), axis=-1, keepdims=True) + epsilon)
  y = (ug * r).reshape(u.shape)
  if casting not in _CASTINGS:
    raise ValueError(f"casting must be one of {_CASTINGS}, got {casting!r}.")
  if casting != "float32" and not (casting == "t5" and scale is None):
    y = y.astype(x.dtype if casting == "llama" else scale.dtype)  # the early rounding
    if scale is not None:
      y = y * jnp.asarray(scale).reshape((1,) * (x.ndim - 1) + (d,))  # in its own dtype
    y = y.astype(dt)
  elif scale is not None:
    y = y * jnp.asarray(scale).astype(dt).reshape((1,) * (x.ndim - 1) + (d,))
  if norm_before_gate:
    y = y * gate
  return y.astype(dtype or x.dtype)
