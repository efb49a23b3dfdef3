r"""Internal API: the plain norm's forward and derived backward, dispatched to XLA or the kernels.

Both ops normalize the last axis of an array ``x`` of shape ``(..., d)`` (the public wrappers
flatten the normalized trailing axes into that one axis) and differ only in whether the row is
centred first, switched by the static :class:`jaxnorm._spec.NormConfig` that :func:`prepare`
builds. This module holds no differentiation rule of its own: it gives the three functions the
one ``jax.custom_jvp`` of :mod:`jaxnorm._ad` is made of, :func:`forward_only` (the value of an
undifferentiated call: one pass, nothing kept), :func:`forward` (the value and the statistics
reverse mode keeps, computed in the JVP rule) and :func:`backward` / :func:`param_cotangents`
(the derived VJP, run where the tangent map is transposed). Their formulas are written out
below and derived in full in ``docs/derivations.md``.

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
float32)``. LayerNorm's variance uses *shifted data*: with a pivot :math:`K` close to the row
(its first element for unmasked, unsharded rows, as in the kernels: one level of row sums; the
plain floating-point mean otherwise), :math:`\delta = \tfrac1n\sum (x - K)` and
:math:`v = \tfrac1n\sum (x-K)^2 - \delta^2`. Because :math:`x - K` is exact in floating point
when both are close (Sterbenz), this keeps float32 accuracy at any mean/std ratio (a first
element :math:`k` standard deviations from the mean costs about :math:`2\log_2 k` bits of the
variance: see ``docs/derivations.md``); the single-pass
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

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm import _jax_compat
from jaxnorm import _pallas_config
from jaxnorm import _validation as v
from jaxnorm import _xla
from jaxnorm._casting import CASTINGS, cast_plan
from jaxnorm._kernel_call import kernel_call
from jaxnorm._pallas_config import PallasConfig
from jaxnorm._spec import NormConfig

__all__ = ["NormConfig", "backward", "check_pallas", "flat_params", "flat_stats", "forward",
           "forward_only", "kernels",
           "on_platform", "pallas_spec", "pallas_stats", "param_cotangents", "prepare"]


def kernels():
  """The Pallas kernel modules (``common``, ``forward``, ``backward``), imported on first use.

  Only a kernel launch or lowering needs ``jax.experimental.pallas``: ``import jaxnorm`` and
  every XLA-path call leave it unimported (its API moves between JAX releases, and importing it
  costs time on every start).
  """
  import types
  from jaxnorm import _pallas_backward, _pallas_common, _pallas_forward
  return types.SimpleNamespace(common=_pallas_common, forward=_pallas_forward,
                               backward=_pallas_backward)


def pallas_spec(cfg: NormConfig, x, scale, *, has_bias: bool, residual_scale: float = 1.0):
  """The kernels' launch spec for ``x: (..., d)`` from a checked config (no re-validation)."""
  d = x.shape[-1]
  return kernels().common.kernel_spec(
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


def over_heads(cfg: NormConfig, fn, kinds: str, out_kinds: str):
  """``fn(cfg, *args)`` on the kernels, mapped over the per-head axes of the parameters.

  The kernels take one parameter row for all rows. With per-head parameters (``cfg.heads``,
  e.g. ``x: (tokens, heads, d)``, ``scale: (heads, d)``) each head is one kernel problem, and
  ``jax.vmap`` over the head axes gives one launch with one more grid axis. ``kinds`` and
  ``out_kinds`` say, per argument and per result, "r" for a row-like ``(..., heads..., d|1)``
  array, "p" for a ``(heads..., d)`` parameter (broadcast to every head first; its cotangent
  comes back per head: see :func:`sum_to`). Without per-head parameters: ``fn`` itself.
  """
  if not cfg.heads:
    return functools.partial(fn, cfg)
  inner = dataclasses.replace(cfg, heads=(), bias_shape=None if cfg.bias_shape is None else
                              cfg.bias_shape[-1:])

  def mapped(*args):
    d = args[0].shape[-1]
    args = [jnp.broadcast_to(a, cfg.heads + (d,)) if k == "p" and a is not None else a
            for a, k in zip(args, kinds)]
    f = functools.partial(fn, inner)
    for j in range(len(cfg.heads)):  # innermost: the head axis next to d
      axis = {"r": -(j + 2), "p": 0}
      f = jax.vmap(f, in_axes=tuple(axis[k] for k in kinds),
                   out_axes=tuple(axis[k] for k in out_kinds))
    return f(*args)

  return mapped


def sum_to(ct, shape):
  """A per-head parameter cotangent summed over the head axes its parameter is shared on."""
  if ct is None or tuple(ct.shape) == tuple(shape):
    return ct
  extra = ct.ndim - len(shape)
  return jnp.sum(ct, axis=tuple(range(extra))).reshape(shape)


def _pallas_forward_one(cfg: NormConfig, x, scale, bias):
  d = x.shape[-1]
  spec = pallas_spec(cfg, x, scale, has_bias=bias is not None)
  y, *stats = kernels().forward.norm_forward(x.reshape(-1, d), _flat(scale), _flat(bias), spec=spec,
                                           out_dtype=cfg.out_dtype,
                                           interpret=cfg.pallas.interpret)
  return y.reshape(x.shape), pallas_stats(cfg, x.shape[:-1] + (1,), stats)


def _pallas_forward_call(cfg: NormConfig, x, scale, bias):
  return over_heads(cfg, _pallas_forward_one, "rpp", "rr")(x, scale, bias)


def _pallas_backward_one(cfg: NormConfig, x, scale, stats, dy):
  d = x.shape[-1]
  spec = pallas_spec(cfg, x, scale, has_bias=cfg.bias_dtype is not None)
  shift, delta, rstd = flat_stats(cfg, stats)
  dx, dscale, dbias = kernels().backward.norm_backward(
      x.reshape(-1, d), dy.reshape(-1, d), _flat(scale), shift, delta, rstd, spec=spec,
      interpret=cfg.pallas.interpret)
  return (dx.reshape(x.shape), *params_like(cfg, scale, dscale, dbias))


def _pallas_backward_call(cfg: NormConfig, x, scale, stats, dy):
  dx, dscale, dbias = over_heads(cfg, _pallas_backward_one, "rprr", "rpp")(x, scale, stats, dy)
  return (dx, None if scale is None else sum_to(dscale, scale.shape),
          None if dbias is None else sum_to(dbias, cfg.bias_shape))


def _flat(p):
  return None if p is None else p.reshape(-1)


def params_like(cfg: NormConfig, scale, dscale, dbias):
  """The kernels' ``dscale``/``dbias`` in their primals' shapes and dtypes (as XLA's come)."""
  if dscale is not None:
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
  if dbias is not None:
    dbias = dbias.reshape(cfg.bias_shape).astype(cfg.bias_dtype)
  return dscale, dbias


def param_cotangents(cfg: NormConfig, scale, dscale, dbias):
  """``dscale``/``dbias`` in their primals' shapes and dtypes, summed over replicated mesh axes."""
  if dscale is not None:
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
    dscale = _xla.match_vma(dscale, _jax_compat.varying_axes(scale))
  if dbias is not None:
    dbias = dbias.reshape(cfg.bias_shape).astype(cfg.bias_dtype)
    dbias = _xla.match_vma(dbias, cfg.bias_vma)
  return dscale, dbias


def on_platform(cfg: NormConfig, fn, *args):
  """``fn(cfg, *args)`` with ``cfg.impl`` resolved: "platform" is decided per lowering platform.

  ``impl="auto"`` on a call the kernels support becomes "platform": a
  ``lax.platform_dependent`` whose GPU branches run the kernels and whose default branch runs
  XLA. Only the branch of the platform a program is lowered for is compiled, so
  ``jax.export(..., platforms=["cuda"])`` from a CPU host carries the kernels and ``["tpu"]``
  the XLA formulas; both branches return the same shapes and dtypes. The kernels run behind
  :func:`jaxnorm._kernel_call.kernel_call`, so every branch can be differentiated again.
  """
  if cfg.impl == "xla":
    return fn(cfg, *args)
  pal = dataclasses.replace(cfg, impl="pallas")
  if cfg.impl == "pallas":
    return kernel_call(pal, fn, *args)
  xla = dataclasses.replace(cfg, impl="xla")
  # A program lowered for several platforms lowers every branch for each of them: the kernels'
  # branch then lowers to the XLA path where the kernels do not compile (elsewhere="xla").
  kernels = functools.partial(kernel_call, pal, fn, elsewhere="xla")
  gpu = dict.fromkeys(_pallas_config.GPU_PLATFORMS, kernels)
  return lax.platform_dependent(*args, default=functools.partial(fn, xla), **gpu)


def _forward_only(cfg: NormConfig, x, scale, bias, mask):
  if cfg.impl == "pallas":
    return _pallas_forward_call(cfg, x, scale, bias)[0]
  # Not differentiated: nothing kept for a backward (one level of row sums).
  return _xla.forward_only(cfg, x, scale, bias, mask)


def forward_only(cfg: NormConfig, x, scale, bias, mask):
  r"""``y`` of ``x: (..., d)``, nothing kept: the value of an undifferentiated call.

  .. math:: y = \gamma \odot (x - \mu)\, r + \beta
  """
  return on_platform(cfg, _forward_only, x, scale, bias, mask)


def _forward(cfg: NormConfig, x, scale, bias, mask):
  if cfg.impl == "pallas":
    return _pallas_forward_call(cfg, x, scale, bias)
  return _xla.forward(cfg, x, scale, bias, mask)


def forward(cfg: NormConfig, x, scale, bias, mask):
  """``(y, stats)`` of ``x: (..., d)`` on ``cfg.impl``: the XLA formulas or the kernels.

  ``stats = (shift, delta, rstd)``, each ``(..., 1)`` (``shift``/``delta`` None for RMSNorm):
  what reverse mode keeps beside ``x`` and ``scale`` (12 or 4 bytes per row in float32).
  """
  return on_platform(cfg, _forward, x, scale, bias, mask)


@dataclasses.dataclass(frozen=True)
class _Backward:
  """The backward on one implementation with ``dx`` in ``dx_dtype`` (a hashable function)."""

  dx_dtype: object = None

  def __call__(self, cfg: NormConfig, x, scale, mask, stats, dy):
    dx_dtype = self.dx_dtype
    if cfg.impl == "pallas":
      dx, dscale, dbias = _pallas_backward_call(cfg, x, scale, stats, dy)
      return dx.astype(x.dtype if dx_dtype is None else dx_dtype), dscale, dbias
    return _xla.backward(cfg, x, scale, mask, stats, dy, dx_dtype=dx_dtype)


def backward(cfg: NormConfig, x, scale, mask, stats, dy, dx_dtype=None):
  """``(dx, dscale, dbias)`` on ``cfg.impl``; ``dx`` in ``dx_dtype`` (default ``x.dtype``).

  The derived VJP of the module docstring. ``dscale``/``dbias`` come back unreduced over mesh
  axes: see :func:`param_cotangents`.
  """
  dx_dtype = None if dx_dtype is None else jnp.dtype(dx_dtype)
  return on_platform(cfg, _Backward(dx_dtype), x, scale, mask, stats, dy)


def _under_non_manual_mesh() -> bool:
  """Whether the current trace has an abstract mesh with an axis that is not Manual."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return False
  return any(t != jax.sharding.AxisType.Manual for t in mesh.axis_types)


def _resolve_impl(impl: str, x2_shape, dtype, mask, axis_name, pallas: PallasConfig,
                  fast_variance: bool = False) -> str:
  """Resolves ``impl`` in {"auto", "xla", "pallas"} to "xla", "pallas" or "platform".

  "auto" on a call the kernels support (no mask, no axis_name, not traced under a mesh with
  non-manual axes, a supported shape and dtype) is "platform": the kernels where the program is
  lowered for a GPU and XLA elsewhere, decided per lowering platform (:func:`on_platform`), not
  from the default backend at trace time; any other call is "xla". It never fails where "xla"
  works. "pallas" raises a ``ValueError`` saying why when the kernels cannot take the call, and
  lowering it for a platform they cannot be compiled for raises the same error there.
  """
  v.check_choice("impl", impl, v.IMPLS)
  if impl == "xla":
    return "xla"
  why_not = None
  if fast_variance:
    why_not = "the Pallas kernels compute the shifted-data variance only (use_fast_variance=True)"
  elif mask is not None:
    why_not = "the Pallas kernels do not take a mask"
  elif axis_name is not None:
    why_not = "the Pallas kernels do not take an axis_name (sharded feature axis)"
  elif _under_non_manual_mesh():
    why_not = ("the call is traced under a mesh with non-manual axes (explicit or automatic "
               "sharding); a pallas_call runs per device, inside shard_map only")
  else:
    ok, reason = _pallas_config.supported(x2_shape, dtype)
    if not ok:
      why_not = reason
  if impl == "auto":
    return "xla" if why_not is not None else "platform"
  if why_not is not None:
    raise ValueError(v.pallas_refusal(why_not))
  # Whether the platform can compile the kernels is asked where the program is lowered
  # (jaxnorm._kernel_call), for each platform it is lowered for: not here, from the default
  # backend at trace time, which need not be the platform the program runs on.
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
            casting="float32", x_name="x", use_fast_variance=False):
  """Validates the public arguments and returns ``(cfg, x2, mask2, restore)``.

  ``pallas``: a :class:`jaxnorm.PallasConfig` (how ``impl="pallas"`` runs the kernels) or None
  for the default one. ``casting``: one of :data:`jaxnorm._casting.CASTINGS`, checked here once
  and carried as the call's :class:`~jaxnorm._casting.CastPlan`. ``x_name``: what the messages
  call ``x`` (the kernel API's fused backward normalizes ``h``). ``use_fast_variance``:
  LayerNorm's variance as ``E[x^2] - E[x]^2`` (:attr:`NormConfig.fast_variance`; XLA only).

  ``x2`` is ``x`` with its normalized trailing axes flattened into one, ``mask2`` the mask
  broadcast and flattened the same way, and ``restore`` maps a ``(..., d)`` result back to the
  shape of ``x``.
  """
  v.check_floating(x_name, x)
  epsilon = v.check_epsilon(epsilon)
  axes = v.normalized_axes(x.ndim, axis)
  v.check_choice("epsilon_placement", epsilon_placement, v.EPSILON_PLACEMENTS)
  v.check_bool("zero_centered_scale", zero_centered_scale)
  v.check_bool("use_fast_variance", use_fast_variance)
  v.check_choice("casting", casting, CASTINGS)
  norm_shape = tuple(x.shape[axes[0]:])
  scale_heads = v.check_param("scale", scale, x.shape, axes[0], x_name=x_name)
  bias_heads = v.check_param("bias", bias, x.shape, axes[0], x_name=x_name)
  v.check_mask(mask, x.shape)
  dtype = v.check_out_dtype("dtype", dtype)
  if isinstance(axis_name, list):  # hashable: the config is a static argument
    axis_name = tuple(axis_name)
  if axis_index_groups is not None:
    if axis_name is None:
      raise ValueError("axis_index_groups needs axis_name (the mesh axis they group).")
    axis_index_groups = tuple(tuple(int(i) for i in grp) for grp in axis_index_groups)
  d = int(np.prod(norm_shape))
  lead = tuple(x.shape[:axes[0]])
  x2 = x.reshape(lead + (d,))
  pallas = check_pallas(pallas)
  fast_variance = bool(center and use_fast_variance)
  impl = _resolve_impl(impl, (int(np.prod(lead)), d), x.dtype, mask, axis_name, pallas,
                       fast_variance)
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
      bias_shape=None if bias is None else bias_heads + (d,),
      bias_vma=frozenset() if bias is None else _jax_compat.varying_axes(bias),
      impl=impl,
      pallas=pallas if impl != "xla" else PallasConfig(),
      cast=cast_plan(casting, x.dtype, None if scale is None else scale.dtype,
                     None if bias is None else bias.dtype),
      heads=max(scale_heads, bias_heads, key=len),
      fast_variance=fast_variance,
  )
  shape = tuple(x.shape)
  return cfg, x2, mask2, lambda y: y.reshape(shape)


def flat_params(x, x2, *params):
  """Each scale/bias as the ops take it: ``(heads..., d)``, its normalized axes flattened.

  ``x`` is the public input and ``x2`` the prepared one (normalized axes flattened into ``d``);
  a parameter of the normalized shape or ``(d,)`` becomes ``(d,)``, a per-head one
  ``(heads..., *normalized_shape)`` becomes ``(heads..., d)``. None stays None.
  """
  n_norm, d = x.ndim - x2.ndim + 1, x2.shape[-1]
  out = []
  for p in params:
    if p is not None:
      n_heads = max(p.ndim - n_norm, 0)
      p = p.reshape(tuple(p.shape[:n_heads]) + (d,))
    out.append(p)
  return tuple(out)
