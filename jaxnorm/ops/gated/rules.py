r"""Internal API: gated RMSNorm, an op of its own family, on the rule factory.

The op is declared in :mod:`jaxnorm._gated_op` (:data:`GATED_RMS_NORM`, its options, and
:class:`GatedConfig`, re-exported here); each backend's arithmetic for it lives in that
backend's package, in its table under the op's name (the XLA formulas,
:mod:`jaxnorm.backends.xla.gated`; the Triton kernels' entry,
:mod:`jaxnorm.backends.triton.gated_entry`). This module holds the rest and imports no
backend: the argument checks that build a call's :class:`GatedConfig` (:func:`gated_rms_norm`),
and what the rule factory (:mod:`jaxnorm._rules`) needs: the operands (residuals ``x, z,
scale, rstd``; tangents ``tx, tz, tscale``), the tangent (the XLA backend's ``"tangent"`` entry,
through :func:`jaxnorm.backends.table.formula`) and the derived backward (the call's backend's
``"backward"`` entry, through :func:`jaxnorm.backends.table.run`). The math and its derivation
(tangent and VJP of both orders) are in ``docs/derivations.md``, "Gated RMSNorm".

Numerics: the arithmetic runs in ``promote_types(x, z, scale, float32)``; ``y`` is rounded once
to ``dtype`` (with ``casting`` other than "float32", also where that mode rounds, see
:func:`gated_rms_norm`), cotangents come back in their primals' dtypes; second order
differentiates the forward and the backward in float32 copies of 16-bit inputs, as the norm
family does. Reverse mode keeps ``x``, ``z`` (tagged :data:`jaxnorm.INPUT_RESIDUAL`), the scale
and one compute-dtype number per group and row (``rstd``, tagged
:data:`jaxnorm.STATS_RESIDUAL`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxnorm.backends import table as _backends
from jaxnorm import _concrete_checks as _cc
from jaxnorm import _jax_compat
from jaxnorm import _validation as v
from jaxnorm._casting import CASTINGS, cast_plan
from jaxnorm._gated_op import GATED_RMS_NORM, GatedConfig, GatedOp
from jaxnorm._remat import INPUT_RESIDUAL, STATS_RESIDUAL
from jaxnorm._rules import Family, TangentRule, rows_of
from jaxnorm._wide import wide_jvp, wide_tangent

__all__ = ["GATED_RMS_NORM", "GatedConfig", "GatedOp", "check_layer_features",
           "check_layer_group", "check_options", "gated_rms_norm", "layer_options"]


# ---------------------------------------------------------------------------------------------
# The family's declarations for the rule factory.

_RESIDUALS = ("x", "z", "scale", "rstd")
_TANGENTS = ("tx", "tz", "tscale")
_PARAMS = frozenset({"scale", "tscale"})


def _formula(cfg: GatedConfig, a: dict):
  return [_backends.formula(cfg, "tangent")(*(a[k] for k in _RESIDUALS + _TANGENTS))]


def _backward(cfg: GatedConfig, a: dict, cts, wanted: dict) -> dict:
  (dy,) = cts  # never None: the factory answers an all-zero cotangent itself
  # Second order differentiates the backward in float32 copies of 16-bit inputs (wide_jvp), as
  # the norm family's, so each path's cotangent is rounded once.
  dx, dz, dscale = wide_jvp(functools.partial(_backends.run, cfg, "backward"))(
      a["x"], a["z"], a["scale"], a["rstd"], dy)
  out = {"tx": dx, "tz": dz}
  if "tscale" in wanted:
    shape, dtype = wanted["tscale"]
    out["tscale"] = dscale.reshape(shape).astype(dtype)
  return {k: c for k, c in out.items() if k in wanted}


def _out_types(cfg: GatedConfig, a: dict):
  return [(a["x"].shape, cfg.out_dtype)]


GATED = Family("gated", _RESIDUALS, _TANGENTS, _PARAMS, _formula, _backward, _out_types,
               rows_batch=rows_of(_PARAMS), second_order=wide_tangent,
               remat_names=(("x", INPUT_RESIDUAL), ("z", INPUT_RESIDUAL),
                            ("rstd", STATS_RESIDUAL)))
"""The family's declaration for :class:`jaxnorm._rules.TangentRule`."""

_RULE = TangentRule(GATED)
gated_tangent_p = _RULE.primitive


def _check_range(cfg: GatedConfig, x, z) -> None:
  """Each group's statistic within the float range where ``x`` and ``z`` are concrete (an eager
  call, also in the JVP rule under eager grad/vjp/jvp), as the norm ops check their rows
  (:func:`jaxnorm._concrete_checks.check_row_range`); a traced group is not checked (past the
  range it comes back NaN, as the norm ops' rows do, ``docs/derivations.md``)."""
  if _jax_compat.is_tracer(x) or _jax_compat.is_tracer(z):
    return
  u, name = cfg.grouped(x, cfg.compute_dtype), "x"  # each group one "row"
  if not cfg.norm_before_gate:
    u, name = u * jax.nn.silu(cfg.grouped(z, cfg.compute_dtype)), "x * silu(z)"
  _cc.check_row_range(GATED_RMS_NORM.name, u, cfg.epsilon, x_name=name)


def _forward(cfg: GatedConfig, x, z, scale):
  _check_range(cfg, x, z)
  y, rstd = wide_jvp(functools.partial(_backends.run, cfg, "forward"))(x, z, scale)
  return y, dict(x=x, z=z, scale=scale, rstd=rstd)


def _value(cfg: GatedConfig, x, z, scale):
  _check_range(cfg, x, z)
  return _backends.run(cfg, "forward_only", x, z, scale)


_gated = _RULE.op(_value, _forward, _TANGENTS, "_gated")


# ---------------------------------------------------------------------------------------------
# The public op (and the checks its layers share).


def check_layer_features(layer: str, x, num_features: int) -> None:
  """A ``ValueError`` unless ``x``'s last axis has ``num_features`` (the layers' check)."""
  if x.ndim < 1 or x.shape[-1] != num_features:
    raise ValueError(f"{layer} was built for {num_features} features (the last axis of x), got "
                     f"x of shape {tuple(x.shape)}.")


def check_layer_group(layer: str, num_features: int, group_size) -> None:
  """``group_size`` None or a positive int dividing ``num_features`` (the layers' check)."""
  if group_size is not None:
    v.check_positive_int("group_size", group_size)
    if num_features % group_size:
      raise ValueError(f"{layer}: group_size must divide num_features ({num_features}), got "
                       f"{group_size}.")


def check_options(layer: str | None = None, num_features: int | None = None, **options) -> dict:
  """The op's own options (:attr:`GATED_RMS_NORM.options <jaxnorm._gated_op.GatedOp.options>`),
  given by name, each checked, the ones left out at their defaults: ``{name: value}``, what the
  public function takes as keywords. A name the declaration does not have is a ``TypeError``.

  ``layer`` and ``num_features``: a layer's name and feature count, to check ``group_size``
  against them (:func:`check_layer_group`); the public function checks it against ``x``.
  """
  declared = GATED_RMS_NORM.defaults()
  unknown = sorted(set(options) - set(declared))
  if unknown:
    raise TypeError(f"gated_rms_norm has no option {unknown[0]!r}; its options are "
                    f"{tuple(declared)}.")
  opts = {**declared, **options}
  if opts["group_size"] is not None:
    v.check_positive_int("group_size", opts["group_size"])
  v.check_bool("norm_before_gate", opts["norm_before_gate"])
  v.check_choice("casting", opts["casting"], CASTINGS)
  if layer is not None:
    check_layer_group(layer, num_features, opts["group_size"])
  return opts


def layer_options(layer) -> dict:
  """The op's own options read off a layer (NNX or Linen), which stores each under its name."""
  return {o.name: getattr(layer, o.name) for o in GATED_RMS_NORM.options}


def _plan(casting: str, x, scale, ct):
  """``casting``'s :class:`~jaxnorm._casting.CastPlan` for the call, in the compute dtype
  ``ct``; None where nothing would round before ``y`` (every dtype it names is ``ct``)."""
  plan = dataclasses.replace(
      cast_plan(casting, x.dtype, None if scale is None else scale.dtype), compute=ct)
  if all(jnp.dtype(d) == ct for d in (plan.xhat, plan.gamma, plan.product)):
    return None
  return plan


def _prepare(x, z, scale, *, epsilon, dtype, impl, backend_config=None, pallas=None,
             **options):
  """Checks a call; returns its :class:`GatedConfig`."""
  v.check_input("x", x)
  v.check_input("z", z)   # the gate: None (left out) is refused by name
  if scale is not None:
    v.check_input("scale", scale)   # the gated kernels take no 8-bit scale either
  if x.ndim < 1:
    raise ValueError(f"x must have at least one axis (the normalized features), got shape "
                     f"{tuple(x.shape)}.")
  if tuple(z.shape) != tuple(x.shape):
    raise ValueError(f"z (the gate) must have x's shape {tuple(x.shape)}, got "
                     f"{tuple(z.shape)}.")
  d = int(x.shape[-1])
  if scale is not None:
    if tuple(scale.shape) != (d,):
      raise ValueError(f"scale must have shape ({d},) (x's last axis), got "
                       f"{tuple(scale.shape)}.")
  epsilon = v.check_epsilon(epsilon)
  opts = check_options(**options)
  # No features: one group of one (nothing to normalize; the result is empty, as rms_norm's).
  k = (d or 1) if opts["group_size"] is None else opts["group_size"]
  if d % k:
    raise ValueError(f"group_size must divide x's last axis ({d}), got {k}; Mamba2's "
                     f"group_size is d // ngroups.")
  out_dtype = v.check_out_dtype("dtype", dtype)
  configs, config_arg = _backends.check_config(backend_config, pallas)
  dtypes = [a.dtype for a in (x, z, scale) if a is not None]
  ct = jnp.dtype(jnp.promote_types(jnp.result_type(*dtypes), jnp.float32))
  v.check_epsilon_range(epsilon, ct)  # its one home here: static, so traced x too
  rows = int(x.size // d) if d else 0
  resolved, names = _backends.resolve_impl(
      impl, (rows, d), jnp.result_type(*dtypes), None, None, GATED_RMS_NORM,
      tuple(dict(opts, group_size=k).items()))
  return GatedConfig(GATED_RMS_NORM, k, epsilon, opts["norm_before_gate"],
                     jnp.dtype(out_dtype or x.dtype), ct, resolved,
                     _backends.call_config(configs, names, impl, config_arg),
                     _plan(opts["casting"], x, scale, ct))


@_backends.documented
def gated_rms_norm(x, z, scale=None, *, epsilon=1e-6, group_size=None, norm_before_gate=True,
                   casting="float32", dtype=None, impl="auto", backend_config=None,
                   pallas=None):
  r"""Gated RMSNorm (Mamba2, Qwen3-Next) with hand-derived derivative rules.

  .. math::

     \text{norm\_before\_gate=True: } y = \gamma \odot \hat x \odot \operatorname{silu}(z),
     \qquad \text{False: } y = \gamma \odot \widehat{(x \odot \operatorname{silu}(z))},

  where :math:`\hat u = u / \sqrt{\overline{u^2} + \epsilon}` normalizes each group of
  ``group_size`` consecutive features of the last axis (one group, the whole row, by default).
  ``jax.grad`` runs the derived VJP and ``jax.jvp`` the derived tangent (both differentiate
  again); the arithmetic runs in float32 for 16-bit inputs, rounded once (``casting="float32"``).

  ``casting`` rounds the affine stage as the norms' modes do (:func:`jaxnorm.rms_norm`): with
  :math:`p = \mathrm{rd}_P(\mathrm{rd}_A(\hat u)\,\gamma)` (A: ``x.dtype`` for "llama", the
  scale's dtype for "t5"; P: the promoted dtype of A and the scale's), ``y`` is
  :math:`\mathrm{rd}_O(p \odot \operatorname{silu}(z))`, the gate applied in float32 (gate
  last), or :math:`\mathrm{rd}_O(p)` (gate first). "llama" is Hugging Face's order:
  ``Qwen3NextRMSNormGated`` (gate last) and Mamba2's ``MambaRMSNormGated`` (gate first). The
  backward rounds each cotangent where the forward rounded the value; the Triton kernels round
  at the same places.

  Args:
    x: ``(..., d)`` floating array.
    z: the gate, a floating array of ``x``'s shape.
    scale: ``(d,)`` floating array, :math:`\gamma`; None for none.
    epsilon: Python float >= 0.
    group_size: features per normalized group (must divide ``d``; Mamba2's ``d // ngroups``);
      None: the whole row.
    norm_before_gate: True normalizes ``x`` and then gates (Qwen3-Next; Mamba2's default);
      False gates first and normalizes ``x * silu(z)``.
    casting: "float32" (default), "llama" or "t5": where the affine stage rounds (above).
    dtype: dtype of ``y``; default ``x.dtype``.
    impl: IMPL_CHOICES (see :func:`jaxnorm.layer_norm`).
    backend_config: the config of the backend ``impl`` runs (a :class:`jaxnorm.PallasConfig`
      for the Triton kernels, a :class:`jaxnorm.backends.tpu.TpuConfig` for the TPU kernels),
      several of distinct backends as a tuple, or None; see :func:`jaxnorm.layer_norm`.
    pallas: the documented alias of ``backend_config``.

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError: a non-floating or 8-bit float ``x``, ``z`` or ``scale``, the gate left out
      (``z=None``), a non-bool ``norm_before_gate``, a non-int ``group_size``.
    ValueError: ``z`` not shaped like ``x``, ``scale`` not ``(d,)``, ``group_size`` not dividing
      ``d``, ``casting`` not one of its modes, ``impl="triton"`` on a call its kernels refuse
      (saying why), or a concrete group past the float range (as :func:`jaxnorm.rms_norm`'s
      rows, with ``d`` the group size and the group of ``x``, or of ``x * silu(z)`` with
      ``norm_before_gate=False``); a traced one is not checked and comes back as the norm ops'
      rows do (NaN, ``docs/derivations.md``).

  Example:
    >>> import jax.numpy as jnp, jaxnorm
    >>> y = jaxnorm.gated_rms_norm(jnp.ones((2, 4)), jnp.zeros((2, 4)), jnp.ones(4))
    >>> float(y.sum())  # silu(0) = 0
    0.0
  """
  cfg = _prepare(x, z, scale, epsilon=epsilon, dtype=dtype, impl=impl,
                 backend_config=backend_config, pallas=pallas, group_size=group_size,
                 norm_before_gate=norm_before_gate, casting=casting)
  return _gated(cfg, x, z, scale)
