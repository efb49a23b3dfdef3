r"""The one ``jax.custom_vjp`` behind :func:`jaxnorm.layer_norm` and :func:`jaxnorm.rms_norm`.

Both ops normalize the last axis of an array ``x`` of shape ``(..., d)`` (the public wrappers
flatten the normalized trailing axes into that one axis) and differ only in whether the row is
centred first. One private function, :func:`_norm`, carries both, switched by the static
:class:`NormConfig`; its forward and backward rules are written out below and derived in full in
``docs/derivations.md``. The public ops reach it through the ``jax.custom_jvp`` of
:mod:`jaxnorm._forward_mode`, which calls :func:`apply` for the value, :func:`forward` in its JVP
rule and :func:`backward` / :func:`param_cotangents` where its tangent map is transposed.

Notation (one row; sums run over the ``d`` features, or over the masked-in ones for the
statistics):

.. math::

   n = \sum_i m_i, \quad
   \mu = \tfrac1n \sum_i m_i x_i \ \text{(LayerNorm; } \mu = 0 \text{ for RMSNorm)}, \quad
   v = \tfrac1n \sum_i m_i (x_i - \mu)^2,

   r = (v + \epsilon)^{-1/2} \ \text{("inside")} \quad\text{or}\quad
   r = (\sqrt v + \epsilon)^{-1} \ \text{("outside")}, \qquad
   \hat x = (x - \mu)\, r, \qquad y = \gamma \odot \hat x + \beta,

with :math:`\gamma = s` or :math:`1 + s` (zero-centred scale) and :math:`m \equiv 1` without a
mask. With :math:`g = \gamma \odot \partial L/\partial y` the backward rule is

.. math::

   \frac{\partial L}{\partial x} = r \Big( g
      - m\, \tfrac1n {\textstyle\sum_i} g_i
      - c\, m\, \hat x\, \tfrac1n {\textstyle\sum_i} g_i \hat x_i \Big), \qquad
   \frac{\partial L}{\partial s} = \sum_{\text{rows}} \frac{\partial L}{\partial y} \odot \hat x,
   \qquad \frac{\partial L}{\partial \beta} = \sum_{\text{rows}} \frac{\partial L}{\partial y},

where the middle (mean-path) term is absent for RMSNorm and :math:`c = 1` ("inside") or
:math:`c = (\sqrt v + \epsilon)/\sqrt v = 1/(1 - \epsilon r)` ("outside"), with the variance-path
term set to zero on a zero-variance row (its limit).

Numerics. Statistics and the backward's row reductions run in ``promote_types(x.dtype,
float32)``. LayerNorm's variance uses *shifted data*: with the pivot :math:`K` = the row's
plain floating-point mean (rounded, so not exact), :math:`\delta = \tfrac1n\sum (x - K)` and
:math:`v = \tfrac1n\sum (x-K)^2 - \delta^2`. Because :math:`x - K` is exact in floating point
when both are close (Sterbenz) and :math:`\delta` is only the rounding error of :math:`K`, this
is as accurate as an exact two-pass formula for any mean/std ratio; the single-pass
``E[x^2] - E[x]^2`` that Flax uses by default loses every digit at a ratio of ``1e4`` in
float32. The pivot and :math:`\delta` are kept separately as residuals (``mean = K + delta`` is
never rounded to one float), so the backward rebuilds :math:`x - \mu` exactly as the forward did.

Residuals (memory vs recompute): ``x`` itself, ``scale`` (if any), the mask (if any), and per row
``K, delta, rstd`` for LayerNorm (12 bytes per row in float32) or ``rstd`` for RMSNorm (4 bytes
per row). :math:`\hat x` is recomputed in the backward from ``x`` (one multiply-add per element)
rather than stored, which would cost ``d`` elements per row; ``bias`` is not needed at all.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import _pallas_config
from jaxnorm._pallas_config import PallasConfig
from jaxnorm import _validation as v
from jaxnorm import _xla
from jaxnorm._casting import CASTINGS, CastPlan, cast_plan
from jaxnorm._remat import name_residuals


@dataclasses.dataclass(frozen=True)
class NormConfig:
  """Static configuration of one call (hashable; passed as a ``nondiff_argnums`` value)."""

  center: bool  # True: LayerNorm (subtract the mean). False: RMSNorm.
  epsilon: float  # Python float >= 0.
  epsilon_placement: str  # "inside": rsqrt(v + eps). "outside": 1 / (sqrt(v) + eps).
  zero_centered_scale: bool  # gamma = 1 + scale instead of scale.
  axis_name: Any  # Mesh axis name(s) that split the feature axis, or None.
  axis_index_groups: Any  # Tuple of tuples, or None.
  out_dtype: Any  # NumPy dtype of y.
  bias_dtype: Any  # NumPy dtype of bias (for its cotangent), or None when there is no bias.
  bias_shape: Any  # Shape of bias (for its cotangent), or None.
  bias_vma: frozenset  # Mesh axes bias varies over inside shard_map (empty outside).
  impl: str  # "xla" or "pallas" (resolved, never "auto").
  pallas: PallasConfig = PallasConfig()  # How impl="pallas" runs the kernels (interpret, block).
  cast: CastPlan | None = None  # The affine stage's dtypes (casting=); None: "float32".

  def plan(self, x_dtype) -> CastPlan:
    """The :class:`CastPlan` of this call (``"float32"`` when none was set)."""
    return self.cast if self.cast is not None else cast_plan("float32", x_dtype)



def pallas_spec(cfg: NormConfig, x, scale, *, has_bias: bool, residual_scale: float = 1.0):
  """The kernels' launch spec for ``x: (..., d)`` from a checked config (no re-validation)."""
  from jaxnorm import _pallas_common  # pylint: disable=g-import-not-at-top

  d = x.shape[-1]
  return _pallas_common.kernel_spec(
      x.size // d, d, x.dtype, center=cfg.center, has_scale=scale is not None,
      has_bias=has_bias, epsilon=cfg.epsilon, epsilon_placement=cfg.epsilon_placement,
      zero_centered_scale=cfg.zero_centered_scale, residual_scale=residual_scale,
      block=cfg.pallas.block, cast=cfg.cast)


def pallas_stats(cfg: NormConfig, row_shape, flat_stats):
  """The kernels' ``(rows,)`` statistics as ``(shift, delta, rstd)``, each ``row_shape``."""
  flat = flat_stats if cfg.center else (None, None) + tuple(flat_stats)
  return tuple(None if s is None else s.reshape(row_shape) for s in flat)


def flat_stats(cfg: NormConfig, stats):
  """``(shift, delta, rstd)`` of shape ``(..., 1)`` as the kernels' float32 ``(rows,)``."""
  flat = tuple(None if s is None else s.reshape(-1).astype(jnp.float32) for s in stats)
  return flat if cfg.center else (None, None, flat[2])


def _pallas_forward(cfg: NormConfig, x, scale, bias):
  from jaxnorm import _pallas_forward as fwd  # pylint: disable=g-import-not-at-top

  d = x.shape[-1]
  spec = pallas_spec(cfg, x, scale, has_bias=bias is not None)
  y, *stats = fwd.norm_forward(x.reshape(-1, d), _flat(scale), _flat(bias), spec=spec,
                               out_dtype=cfg.out_dtype, interpret=cfg.pallas.interpret)
  return y.reshape(x.shape), pallas_stats(cfg, x.shape[:-1] + (1,), stats)


def _pallas_backward(cfg: NormConfig, x, scale, stats, dy):
  from jaxnorm import _pallas_backward as bwd  # pylint: disable=g-import-not-at-top

  d = x.shape[-1]
  spec = pallas_spec(cfg, x, scale, has_bias=cfg.bias_dtype is not None)
  shift, delta, rstd = flat_stats(cfg, stats)
  dx, dscale, dbias = bwd.norm_backward(x.reshape(-1, d), dy.reshape(-1, d), _flat(scale),
                                        shift, delta, rstd, spec=spec,
                                        interpret=cfg.pallas.interpret)
  return dx.reshape(x.shape), dscale, dbias


def _flat(p):
  return None if p is None else p.reshape(-1)


def param_cotangents(cfg: NormConfig, scale, dscale, dbias):
  """``dscale``/``dbias`` in their primals' shapes and dtypes, summed over replicated mesh axes."""
  if dscale is not None:
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
    dscale = _xla.match_vma(dscale, _xla.varying_axes(scale))
  if dbias is not None:
    dbias = dbias.reshape(cfg.bias_shape).astype(cfg.bias_dtype)
    dbias = _xla.match_vma(dbias, cfg.bias_vma)
  return dscale, dbias


def forward(cfg: NormConfig, x, scale, bias, mask):
  """``(y, stats)`` of ``x: (..., d)`` on ``cfg.impl``: the XLA formulas or the kernels."""
  if cfg.impl == "pallas":
    return _pallas_forward(cfg, x, scale, bias)
  return _xla.forward(cfg, x, scale, bias, mask)


def backward(cfg: NormConfig, x, scale, mask, stats, dy, dx_dtype=None):
  """``(dx, dscale, dbias)`` on ``cfg.impl``; ``dx`` in ``dx_dtype`` (default ``x.dtype``).

  ``dscale``/``dbias`` come back unreduced over mesh axes: see :func:`param_cotangents`.
  """
  if cfg.impl == "pallas":
    dx, dscale, dbias = _pallas_backward(cfg, x, scale, stats, dy)
    return dx.astype(x.dtype if dx_dtype is None else dx_dtype), dscale, dbias
  return _xla.backward(cfg, x, scale, mask, stats, dy, dx_dtype=dx_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _norm(cfg: NormConfig, x, scale, bias, mask):
  if cfg.impl == "pallas":
    y, _ = forward(cfg, x, scale, bias, mask)
  else:
    # Not differentiated: nothing kept for a backward (one level of row sums, see forward_only).
    y = _xla.forward_only(cfg, x, scale, bias, mask)
  return y


def _norm_fwd(cfg: NormConfig, x, scale, bias, mask):
  y, stats = forward(cfg, x, scale, bias, mask)
  x, stats = name_residuals(x, stats)  # remat-policy names (jaxnorm._remat)
  return y, (x, scale, mask, stats)


def _norm_bwd(cfg: NormConfig, res, dy):
  """Closed-form backward (see the module docstring and docs/derivations.md)."""
  x, scale, mask, stats = res
  dx, dscale, dbias = backward(cfg, x, scale, mask, stats, dy)
  return (dx, *param_cotangents(cfg, scale, dscale, dbias), None)


_norm.defvjp(_norm_fwd, _norm_bwd)


def _under_non_manual_mesh() -> bool:
  """Whether the current trace has an abstract mesh with an axis that is not Manual."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return False
  return any(t != jax.sharding.AxisType.Manual for t in mesh.axis_types)


def _resolve_impl(impl: str, x2_shape, dtype, mask, axis_name, pallas: PallasConfig) -> str:
  """Picks "xla" or "pallas" for ``impl`` in {"auto", "xla", "pallas"}.

  "auto" takes the Pallas kernels only on a GPU backend and only for calls they support (no
  mask, no axis_name, not traced under a mesh with non-manual axes, a supported shape and
  dtype); it never fails where "xla" works (checked by the op and module tests on an H100).
  "pallas" raises a ``ValueError`` saying why when the kernels cannot run the call.
  """
  v.check_choice("impl", impl, v.IMPLS)
  if impl == "xla":
    return "xla"
  backend = jax.default_backend()
  on_gpu = _pallas_config.pallas_compiles_on(backend)
  if impl == "auto" and not on_gpu:
    return "xla"
  why_not = None
  if mask is not None:
    why_not = "the Pallas kernels do not take a mask"
  elif axis_name is not None:
    why_not = "the Pallas kernels do not take an axis_name (sharded feature axis)"
  elif _under_non_manual_mesh():
    why_not = ("the call is traced under a mesh with non-manual axes (explicit or automatic "
               "sharding); a pallas_call runs per device, inside shard_map only")
  elif not on_gpu and not pallas.interpret:
    why_not = (f"the Pallas kernels need a GPU and the default backend is {backend!r} (pass "
               f"pallas=jaxnorm.PallasConfig(interpret=True) to run them in interpret mode, "
               f"slowly, for testing)")
  else:
    ok, reason = _pallas_config.supported(x2_shape, dtype)
    if not ok:
      why_not = reason
  if impl == "auto":
    return "xla" if why_not is not None else "pallas"
  if why_not is not None:
    raise ValueError(f"impl='pallas' cannot run this call: {why_not}. Use impl='xla' or 'auto'.")
  return "pallas"


def check_pallas(pallas) -> PallasConfig:
  """``pallas`` (a :class:`PallasConfig` or None) as a :class:`PallasConfig`."""
  if pallas is None:
    return PallasConfig()
  if not isinstance(pallas, PallasConfig):
    raise TypeError(f"pallas must be a jaxnorm.PallasConfig or None, got "
                    f"{type(pallas).__name__} {pallas!r}; e.g. pallas=jaxnorm.PallasConfig("
                    f"interpret=True).")
  return pallas


def prepare(x, scale, bias, *, center, epsilon, axis, mask, epsilon_placement,
            zero_centered_scale, axis_name, axis_index_groups, dtype, impl, pallas=None,
            casting="float32"):
  """Validates the public arguments and returns ``(cfg, x2, mask2, restore)``.

  ``pallas``: a :class:`jaxnorm.PallasConfig` (how ``impl="pallas"`` runs the kernels) or None
  for the default one. ``casting``: one of :data:`jaxnorm._casting.CASTINGS`, checked here once
  and carried as the call's :class:`~jaxnorm._casting.CastPlan`.

  ``x2`` is ``x`` with its normalized trailing axes flattened into one, ``mask2`` the mask
  broadcast and flattened the same way, and ``restore`` maps a ``(..., d)`` result back to the
  shape of ``x``.
  """
  v.check_floating("x", x)
  epsilon = v.check_epsilon(epsilon)
  axes = v.normalized_axes(x.ndim, axis)
  v.check_choice("epsilon_placement", epsilon_placement, v.EPSILON_PLACEMENTS)
  v.check_bool("zero_centered_scale", zero_centered_scale)
  v.check_choice("casting", casting, CASTINGS)
  norm_shape = tuple(x.shape[axes[0]:])
  v.check_param("scale", scale, norm_shape)
  v.check_param("bias", bias, norm_shape)
  v.check_mask(mask, x.shape)
  if dtype is not None:
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(f"dtype must be a floating dtype or None, got {dtype}.")
  if axis_index_groups is not None:
    if axis_name is None:
      raise ValueError("axis_index_groups needs axis_name (the mesh axis they group).")
    axis_index_groups = tuple(tuple(int(i) for i in grp) for grp in axis_index_groups)
  d = int(np.prod(norm_shape))
  lead = tuple(x.shape[:axes[0]])
  x2 = x.reshape(lead + (d,))
  pallas = check_pallas(pallas)
  impl = _resolve_impl(impl, (int(np.prod(lead)), d), x.dtype, mask, axis_name, pallas)
  mask2 = None
  if mask is not None:
    mask2 = jnp.broadcast_to(mask, x.shape).reshape(lead + (d,))
  cfg = NormConfig(
      center=center,
      epsilon=epsilon,
      epsilon_placement=epsilon_placement,
      zero_centered_scale=zero_centered_scale,
      axis_name=axis_name,
      axis_index_groups=axis_index_groups,
      out_dtype=jnp.dtype(dtype or x.dtype),
      bias_dtype=None if bias is None else jnp.dtype(bias.dtype),
      bias_shape=None if bias is None else tuple(bias.shape),
      bias_vma=frozenset() if bias is None else _xla.varying_axes(bias),
      impl=impl,
      pallas=pallas if impl == "pallas" else PallasConfig(),
      cast=cast_plan(casting, x.dtype, None if scale is None else scale.dtype,
                     None if bias is None else bias.dtype),
  )
  shape = tuple(x.shape)
  return cfg, x2, mask2, lambda y: y.reshape(shape)


def apply(cfg: NormConfig, x2, scale, bias, mask2):
  """Calls the custom-VJP op on prepared arguments."""
  return _norm(cfg, x2, scale, bias, mask2)
