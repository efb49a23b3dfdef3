"""Internal API: every use of JAX outside its public ``jax.*`` API, in one fenced module.

jaxnorm defines one primitive of its own (the tangent map of :mod:`jaxnorm.ops.norm.rules`), and JAX
registers a primitive's rules through modules that are not covered by its API guarantees
(``jax.interpreters.ad``, ``batching``, ``mlir``), and records the mesh axes an array varies
over inside ``shard_map`` in an abstract-value field that has been renamed between releases
(``aval.vma`` up to about jax 0.8, ``aval.manual_axis_type.varying`` since). Everything of
that kind lives here, behind small helpers, so that a JAX release that moves one of them breaks
this file loudly (an ``ImportError``/``RuntimeError`` naming the JAX version and what is
missing) instead of degrading somewhere else silently.

The helpers are probed once, at import time: a layout of the abstract values that is neither of
the two known ones raises here, never falls back to "no mesh axes".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

try:
  from jax.extend.core import Primitive
  from jax.interpreters import ad as _ad
  from jax.interpreters import batching as _batching
  from jax.interpreters import mlir as _mlir
except ImportError as err:  # pragma: no cover - depends on the installed JAX
  raise ImportError(
      f"jaxnorm needs jax.extend.core.Primitive and jax.interpreters.{{ad,batching,mlir}}, "
      f"which JAX {jax.__version__} does not provide ({err}); install a JAX in the range "
      f"pyproject.toml declares.") from err

try:  # jax >= 0.4.36
  from jax.extend.core import Literal
except ImportError:  # pragma: no cover - depends on the installed JAX
  from jax.core import Literal

__all__ = [
    "Literal", "Primitive", "Zero", "aval_varying_axes", "enable_x64", "eval_jaxpr",
    "default_platform", "is_symbolic_zero", "is_tracer", "is_undefined_primal",
    "lowering_for_export",
    "register_batching", "register_jvp", "register_lowering", "register_transpose",
    "shaped_array", "varying_axes", "with_varying_axes",
]

def enable_x64():
  """``jax.enable_x64(True)``: a context manager with float64 on (``jax.experimental``'s name
  before 0.8)."""
  enable = getattr(jax, "enable_x64", None)
  if enable is None or not callable(enable):  # pragma: no cover (older JAX)
    from jax.experimental import enable_x64 as enable
  return enable(True)


def eval_jaxpr(jaxpr, consts, *args):
  """Evaluates a jaxpr on ``args`` (``jax.core.eval_jaxpr``; ``jaxnorm.testing`` compiles its
  oracle's jaxpr with the constants as arguments)."""
  return jax.core.eval_jaxpr(jaxpr, consts, *args)


#: The type of a symbolic-zero cotangent or tangent inside a primitive's rules.
Zero = _ad.Zero


def shaped_array(shape, dtype):
  """The abstract value of an array of ``shape`` and ``dtype`` (a primitive's output aval)."""
  return jax.core.ShapedArray(tuple(shape), dtype)


def _probe_varying_field() -> str:
  """Which field of a ``ShapedArray`` holds its varying mesh axes in this JAX."""
  aval = shaped_array((1,), jnp.float32)
  if hasattr(aval, "manual_axis_type"):
    return "manual_axis_type"
  if hasattr(aval, "vma"):
    return "vma"
  raise RuntimeError(
      f"jaxnorm does not know how JAX {jax.__version__} records the mesh axes an array varies "
      f"over (a ShapedArray has neither 'manual_axis_type' nor 'vma'); install a JAX in the "
      f"range pyproject.toml declares, or report this JAX version to jaxnorm.")


_VARYING_FIELD = _probe_varying_field()


def _probe_lowering_platforms() -> None:
  """A lowering rule reads the platforms it lowers for from ``ctx.platforms`` (narrowed inside
  a per-platform switch) and ``ctx.module_context.platforms``: both must exist."""
  fields = getattr(_mlir.LoweringRuleContext, "__dataclass_fields__", {})
  module_fields = getattr(_mlir.ModuleContext, "__dataclass_fields__", {})
  if "platforms" not in fields or "platforms" not in module_fields:
    raise RuntimeError(
        f"jaxnorm does not know how JAX {jax.__version__} tells a lowering rule its platforms "
        f"(no 'platforms' field on mlir.LoweringRuleContext or ModuleContext); install a JAX in "
        f"the range pyproject.toml declares, or report this JAX version to jaxnorm.")


_probe_lowering_platforms()


def aval_varying_axes(aval) -> frozenset:
  """The manual mesh axes an abstract value varies over inside ``shard_map`` (empty outside)."""
  if _VARYING_FIELD == "manual_axis_type":
    return frozenset(aval.manual_axis_type.varying)
  return frozenset(aval.vma)


def varying_axes(a) -> frozenset:
  """:func:`aval_varying_axes` of an array or tracer (``jax.typeof(a)``)."""
  return aval_varying_axes(jax.typeof(a))


def is_undefined_primal(x) -> bool:
  """Whether ``x`` is a linear (to-be-transposed) input inside a transpose rule."""
  return _ad.is_undefined_primal(x)


def is_tracer(x) -> bool:
  """Whether ``x`` is a traced value (its value is not known where it is seen)."""
  return isinstance(x, jax.core.Tracer)


def is_symbolic_zero(t) -> bool:
  """Whether ``t`` is a symbolic zero: a primitive rule's ``Zero`` or a ``custom_jvp``'s one."""
  return isinstance(t, (_ad.Zero, jax.custom_derivatives.SymbolicZero))


def register_transpose(prim: Primitive, rule) -> None:
  """``rule(cts, *args, **params)`` is ``prim``'s transpose (it is linear in some operands)."""
  _ad.primitive_transposes[prim] = rule


def register_jvp(prim: Primitive, rule) -> None:
  """``rule(primals, tangents, **params) -> (out, tangents_out)`` is ``prim``'s JVP."""
  _ad.primitive_jvps[prim] = rule


def register_batching(prim: Primitive, rule) -> None:
  """``rule(args, dims, *, vmap_axis_name, vmap_axis_size, **params) -> (out, out_dims)`` is
  ``prim``'s batching rule; ``vmap_axis_name`` is the name of the ``jax.vmap`` axis being
  batched (None if unnamed), ``vmap_axis_size`` its size."""

  def fancy(axis_data, args, dims, **params):
    return rule(args, dims, vmap_axis_name=axis_data.name, vmap_axis_size=axis_data.size,
                **params)

  _batching.fancy_primitive_batchers[prim] = fancy


def register_lowering(prim: Primitive, fn, *, platform: str | None = None,
                      with_platforms: bool = False, with_export: bool = False) -> None:
  """Lowers ``prim`` (multiple results) by tracing ``fn(*args, **params)``, plain JAX ops.

  ``platform``: register the rule for that platform only (JAX then lowers a program for
  several platforms with a switch over them); None: for every platform without a rule of its
  own. ``with_platforms``: also pass ``platforms=``, the tuple of platforms ("cpu", "cuda",
  "rocm", "tpu") the rule is lowering for. ``with_export``: also pass ``for_export=``, whether
  the program is being lowered by ``jax.export`` (:func:`lowering_for_export`).
  """
  if not (with_platforms or with_export):
    _mlir.register_lowering(prim, _mlir.lower_fun(fn, multiple_results=True), platform=platform)
    return

  def rule(ctx, *args, **params):
    f = fn
    if with_platforms:
      platforms = tuple(ctx.module_context.platforms)
      if ctx.platforms is not None:  # inside a per-platform branch: the platforms it serves
        platforms = tuple(ctx.platforms)
      f = functools.partial(f, platforms=platforms)
    if with_export:
      f = functools.partial(f, for_export=lowering_for_export(ctx))
    return _mlir.lower_fun(f, multiple_results=True)(ctx, *args, **params)

  _mlir.register_lowering(prim, rule, platform=platform)


def default_platform() -> str:
  """The platform of JAX's default backend as a lowering platform names it (``"cpu"``,
  ``"cuda"``, ``"rocm"``, ``"tpu"``): the host a program is traced on, for the choices made when
  tracing (``impl="auto"``'s backend, the XLA backend's per-platform tuning)."""
  platform = jax.default_backend()
  return {"gpu": "cuda"}.get(platform, platform)


def lowering_for_export(ctx) -> bool:
  """Whether the lowering rule's ``ctx`` belongs to a program ``jax.export`` is lowering (JAX's
  ``LoweringParameters.for_export``; False where a JAX has no such field)."""
  params = getattr(ctx.module_context, "lowering_parameters", None)
  return bool(getattr(params, "for_export", False))


def with_varying_axes(aval, axes: frozenset):
  """``aval`` re-typed to vary over the mesh axes ``axes`` (unchanged when it already does)."""
  axes = frozenset(axes)
  if aval_varying_axes(aval) == axes:
    return aval
  if _VARYING_FIELD == "manual_axis_type":
    return aval.update(manual_axis_type=aval.manual_axis_type.update(varying=axes))
  return aval.update(vma=axes)
