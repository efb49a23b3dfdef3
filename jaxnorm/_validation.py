"""Argument validation shared by every public op, layer, kernel entry point, model config and
the testing kit's options. One home per rule: each value is checked by one function here, with
one message, wherever it is passed (an op, a Flax layer, the checked kernel API,
:class:`jaxnorm.models.TransformerConfig`, :func:`jaxnorm.testing.check_rule`).
All checks run at trace time (shapes, dtypes and Python config are static), raise
``TypeError`` for a wrong kind of thing and ``ValueError`` for a wrong value or shape (an
unknown option string is a wrong value, whatever its type), and say what was received, what
was expected and how to fix it.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

EPSILON_PLACEMENTS = ("inside", "outside")


def check_floating(name: str, x: Any) -> None:
  """Raises ``TypeError`` unless ``x`` is an array with a real floating dtype."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    raise TypeError(
        f"{name} must be a JAX or NumPy array with a floating dtype, got {type(x).__name__}; "
        f"wrap it with jnp.asarray(..., dtype=jnp.float32)."
    )
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
        f"{name} must have a floating dtype (float16, bfloat16, float32 or float64), got {dtype}; "
        f"cast it first, e.g. {name}.astype(jnp.float32)."
    )


def check_input(name: str, x: Any) -> None:
  """The rule of every array an op normalizes or gates (``x``, ``residual``, ``z``): a floating
  array (:func:`check_floating`: None, a gate left out, is refused by name) of 16 bits or more.
  An 8-bit float is refused here only: as a ``scale``, ``bias`` or ``dtype=`` it is allowed."""
  check_floating(name, x)
  if jnp.finfo(x.dtype).bits < 16:
    raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}; "
                    f"cast it first, e.g. {name}.astype(jnp.bfloat16).")


def check_layer_input(name: str, x: Any) -> None:
  """A Flax layer's input: an integer or bool array (Flax promotes it to float32), or one
  :func:`check_input` accepts; checked before the layer's dtype promotion."""
  dtype = getattr(x, "dtype", None)
  if dtype is None or not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)):
    check_input(name, x)


def check_axis_name(axis_name: Any):
  """``axis_name`` (None, a name, or a tuple/list of names) as a hashable value, checked bound
  (``shard_map`` over a mesh with that axis, or a named ``jax.vmap``): ``ValueError`` if not."""
  if axis_name is None:
    return None
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)
  try:
    jax.lax.axis_size(axis_name)
  except NameError:
    raise ValueError(
        f"axis_name={axis_name!r} is not bound here: it names the mesh axis the normalized "
        f"features are split over, so call the op inside jax.shard_map over a mesh with that "
        f"axis (or a jax.vmap with axis_name={axis_name!r}), or leave axis_name=None."
    ) from None
  return axis_name


def check_epsilon(epsilon: Any) -> float:
  """Returns ``epsilon`` as a Python float after checking it is a finite, non-negative number.

  A real number: a Python ``int``/``float`` or a NumPy scalar (``np.float32(1e-6)``); not a
  bool and not a JAX array (epsilon is static configuration, part of the compiled program).
  """
  if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
    raise TypeError(
        f"epsilon must be a real number (a Python or NumPy scalar: static configuration, not an "
        f"array), got {type(epsilon).__name__} {epsilon!r}; pass e.g. epsilon=1e-6."
    )
  epsilon = float(epsilon)
  if math.isnan(epsilon) or math.isinf(epsilon) or epsilon < 0:
    raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}.")
  return epsilon


def check_epsilon_range(epsilon: float, dtype: Any) -> None:
  """``ValueError`` naming ``epsilon=`` unless it is within the float range of the statistics
  (float64 where ``dtype``, the normalized array's, is float64, else float32): at most
  ``1 / (2 finfo.tiny)`` (4.3e37 for float32), so that ``1 / sqrt(var + epsilon)`` and
  ``1 / (sqrt(var) + epsilon)`` stay normal floats (never flushed to 0, which the ops read as a
  row past the float range) and ``var + epsilon`` finite for every row inside the range
  (``var < finfo.max / 4``). ``epsilon``: a finite float >= 0 (:func:`check_epsilon`)."""
  ct = jnp.dtype(jnp.promote_types(dtype, jnp.float32))
  limit = 0.5 / float(jnp.finfo(ct).tiny)
  if epsilon > limit:
    raise ValueError(
        f"epsilon={epsilon!r} is past the float range of the statistics ({ct.name}, for "
        f"{jnp.dtype(dtype).name} inputs): epsilon must be at most {limit:.3g} = "
        f"1 / (2 finfo.tiny), where 1 / (std + epsilon) stays a normal {ct.name} (every row would "
        f"come back NaN). Use a smaller epsilon (1e-6 is usual), or float64 inputs.")


def check_bool(name: str, value: Any) -> bool:
  """Raises ``TypeError`` unless ``value`` is a Python bool (e.g. ``zero_centered_scale``)."""
  if not isinstance(value, bool):
    raise TypeError(f"{name} must be a bool, got {value!r}.")
  return value


def check_positive_int(name: str, value: Any) -> int:
  """``value`` as a Python int >= 1 (a bool is not an int here).

  Raises:
    TypeError: ``value`` is not a Python int.
    ValueError: it is below 1.
  """
  if isinstance(value, bool) or not isinstance(value, int):
    raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}.")
  if value < 1:
    raise ValueError(f"{name} must be >= 1, got {value}.")
  return value


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
  """Checks that a string option is one of ``choices``: ``ValueError`` otherwise, any type.

  The message names the argument, the value received and the allowed set, e.g.
  ``epsilon_placement must be one of ('inside', 'outside'), got 'middle'.``
  """
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")
  return value


def check_residual_scale(value: Any) -> float:
  """``residual_scale`` (alpha in ``h = x + alpha * residual``) as a finite Python float.

  The one rule for the residual add + norm ops and their kernels' checked API: a real
  number, or a concrete scalar array (converted); not a bool, not a traced value (alpha is
  static configuration, like epsilon), not NaN or infinite.
  """
  if isinstance(value, bool):
    raise TypeError(f"residual_scale must be a Python float (e.g. DeepNorm's alpha), got "
                    f"{value!r}.")
  if not isinstance(value, numbers.Real):
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
      raise TypeError(f"residual_scale must be a Python float (e.g. DeepNorm's alpha), got "
                      f"{type(value).__name__} {value!r}.")
    if tuple(shape) != ():
      raise ValueError(f"residual_scale must be a scalar, got an array of shape {tuple(shape)}; "
                       f"the multiplier is one number for the whole residual stream.")
    if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
      raise TypeError(f"residual_scale must be a real number, got an array of dtype {dtype}.")
    try:
      value = float(value)
    except (jax.errors.ConcretizationTypeError, TypeError):
      raise TypeError(
          "residual_scale must be a static Python float (it is part of the op's configuration, "
          "like epsilon), got a traced array; compute it outside jit, e.g. float(alpha)."
      ) from None
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f"residual_scale must be finite, got {value!r}.")
  return value


def check_axes(name: str, ndim: int, axes: Any) -> tuple[int, ...]:
  """Canonicalizes ``axes`` (an int or a non-empty sequence of ints) to sorted non-negative axes.

  The one rule for every axis argument (the ops' ``axis``, the layers' ``reduction_axes`` and
  ``feature_axes``): negative axes count from the end, and an axis named twice (``(-1, -1)``,
  or ``(2, -1)`` at rank 3) is an error, never merged.

  Args:
    name: the argument name for the messages.
    ndim: the rank of ``x``.
    axes: an int, or a non-empty tuple/list/range of ints.

  Returns:
    The canonical axes, sorted ascending.

  Raises:
    TypeError: ``axes`` is not an int or a sequence of ints.
    ValueError: ``axes`` is empty, ``x`` is a scalar, an axis is out of range or repeated.
  """
  def is_int(a):
    return isinstance(a, (numbers.Integral, np.integer)) and not isinstance(a, bool)

  if is_int(axes):
    items = (int(axes),)
  elif isinstance(axes, (tuple, list, range)) and all(is_int(a) for a in axes):
    items = tuple(int(a) for a in axes)
  else:
    raise TypeError(f"{name} must be an int or a non-empty tuple of ints, got {axes!r}.")
  if not items:
    raise ValueError(f"{name} must name at least one axis, got {axes!r}.")
  if ndim == 0:
    raise ValueError("x must have at least one dimension to normalize over, got a scalar.")
  seen = {}
  for a in items:
    if not -ndim <= a < ndim:
      raise ValueError(f"{name}={axes!r}: axis {a} is out of range for an input of rank {ndim}; "
                       f"use axes in [{-ndim}, {ndim - 1}].")
    if a % ndim in seen:
      raise ValueError(f"{name}={axes!r} repeats axis {a % ndim} (as {seen[a % ndim]} and {a}); "
                       f"name each axis once.")
    seen[a % ndim] = a
  return tuple(sorted(seen))


def normalized_axes(ndim: int, axis: Any) -> tuple[int, ...]:
  """The op's ``axis`` (:func:`check_axes`), which must name the trailing axes of ``x``.

  The normalized axes must be the last ``k`` axes of ``x`` (every op flattens them into one
  feature axis of size ``d = prod(x.shape[-k:])``). Modules that accept arbitrary reduction
  axes move them to the end before calling the op.
  """
  canon = check_axes("axis", ndim, axis)
  if canon != tuple(range(ndim - len(canon), ndim)):
    raise ValueError(
        f"axis must name the trailing axes of x (rank {ndim}), e.g. -1 or (-2, -1); got {axis!r}. "
        f"Move the axes to normalize to the end with jnp.moveaxis, or use the Flax modules, "
        f"which accept any reduction_axes."
    )
  return canon


def check_dtype(name: str, dtype: Any, *, none_ok: bool = False):
  """``dtype`` as a NumPy dtype: a real floating one (an 8-bit float too), or None where
  ``none_ok``; ``TypeError`` naming ``name`` otherwise.

  The one rule of every dtype argument (the ops' and layers' ``dtype=`` and ``param_dtype=``,
  the fused ops' ``residual_dtype=``, the testing kit's dtypes): anything NumPy cannot read as
  a dtype (``"float33"``, ``3``, a list, None where required) is refused here by name, as a
  non-floating one (``int32``, ``bool``, ``complex64``) is."""
  if dtype is None and none_ok:
    return None
  expected = "a floating dtype" + (" or None" if none_ok else "")
  try:
    dt = None if dtype is None else jnp.dtype(dtype)
  except (TypeError, ValueError):
    dt = None
  if dt is None:
    raise TypeError(f"{name} must be {expected} (e.g. jnp.float32), got "
                    f"{type(dtype).__name__} {dtype!r}, which is not a dtype.")
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"{name} must be {expected}, got {dt}.")
  return dt


def check_out_dtype(name: str, dtype: Any):
  """:func:`check_dtype` of an optional dtype (None: the default, e.g. ``x.dtype``)."""
  return check_dtype(name, dtype, none_ok=True)


def check_subset(name: str, values: Any, choices: Sequence[str]) -> tuple:
  """``values`` (a tuple, list or set of options, each one of ``choices``) as a tuple:
  ``TypeError`` for a string (one option: write ``(value,)``) or anything else not a collection,
  ``ValueError`` naming the entries that are not one of ``choices``."""
  if not isinstance(values, (tuple, list, set, frozenset)):
    hint = f"; write {name}=({values!r},)" if isinstance(values, str) else ""
    raise TypeError(f"{name} must be a tuple of options from {tuple(choices)}, got "
                    f"{type(values).__name__} {values!r}{hint}.")
  unknown = [a for a in values if not isinstance(a, str) or a not in choices]
  if unknown:
    raise ValueError(f"{name} must be a subset of {tuple(choices)}, got unknown {unknown!r}.")
  return tuple(values)


def check_op_options(op: str, declared, given) -> tuple:
  """An op's own options (bools) as sorted ``(name, value)`` pairs, defaults filled in.

  ``declared``: ``(name, default)`` pairs of the op's options; ``given``: the values passed.
  ``TypeError`` for a value that is not a bool, ``ValueError`` for an option the op lacks.
  """
  names = {name for name, _ in declared}
  for name in given:
    if name not in names:
      raise ValueError(f"{op} has no option {name!r}; its options are {sorted(names)}.")
  return tuple(sorted((name, check_bool(name, given.get(name, default)))
                      for name, default in declared))


def check_instance(name: str, value: Any, cls: type, example: str):
  """``value`` if it is a ``cls`` (None: ``cls()``); ``TypeError`` naming ``example`` otherwise.

  For configuration objects such as ``pallas=jaxnorm.PallasConfig(...)``.
  """
  if value is None:
    return cls()
  if not isinstance(value, cls):
    raise TypeError(f"{name} must be a jaxnorm.{cls.__name__} or None, got "
                    f"{type(value).__name__} {value!r}; e.g. {name}={example}.")
  return value


def check_residual_shape(residual_shape: Any, x_shape: Any) -> None:
  """Raises ``ValueError`` unless ``residual`` has exactly the shape of ``x`` (no broadcasting)."""
  if tuple(residual_shape) != tuple(x_shape):
    raise ValueError(f"residual must have the shape of x {tuple(x_shape)} (h = x + residual is "
                     f"not broadcast), got shape {tuple(residual_shape)}.")


def backend_refusal(impl: str, why: str) -> str:
  """The message of an ``impl`` naming a backend that cannot run the call, ``why`` a phrase."""
  return f"impl={impl!r} cannot run this call: {why}. Use impl='xla' or 'auto'."


def check_param(name: str, p: Any, x_shape: tuple[int, ...], first_axis: int, *,
                x_name: str = "x") -> tuple[int, ...]:
  """Checks a scale/bias array; returns its per-head axes' sizes (``()`` for a shared one).

  With ``x_shape[first_axis:]`` the normalized shape and ``d`` its size, the parameter is
  floating and has either the normalized shape, or ``(d,)``, or a longer trailing block of
  ``x``'s shape, ``x_shape[k:]`` with ``k < first_axis``: one value per feature *and per
  head*, e.g. ``x: (batch, seq, heads, head_dim)``, ``axis=-1``, ``scale: (heads, head_dim)``
  (QK-norm with a weight per head). The axes ``x_shape[k:first_axis]`` are the head axes.
  """
  if p is None:
    return ()
  check_floating(name, p)
  norm = tuple(x_shape[first_axis:])
  d = int(np.prod(norm))
  shape = tuple(p.shape)
  if shape in (norm, (d,)):
    return ()
  k = len(x_shape) - len(shape)
  if 0 <= k < first_axis and shape == tuple(x_shape[k:]):
    return tuple(x_shape[k:first_axis])
  raise ValueError(
      f"{name} must have the normalized shape {norm} of {x_name} (or ({d},)), or a trailing "
      f"block of {x_name}'s shape {tuple(x_shape)} that extends it (one value per head, e.g. "
      f"{tuple(x_shape[first_axis - 1:]) if first_axis else norm}), got shape {shape}. Check "
      f"the feature size the parameter was created with.")


def check_mask(mask: Any, x_shape: tuple[int, ...]) -> None:
  """Checks a mask: boolean and broadcastable to the shape of ``x``."""
  if mask is None:
    return
  dtype = getattr(mask, "dtype", None)
  if dtype is None or dtype != jnp.bool_:
    raise TypeError(
        f"mask must be a boolean array broadcastable to x {tuple(x_shape)}, got "
        f"{getattr(mask, 'dtype', type(mask).__name__)}; build it with a comparison, e.g. "
        f"mask = tokens != pad_id."
    )
  try:
    out = np.broadcast_shapes(tuple(mask.shape), tuple(x_shape))
  except ValueError:
    out = None
  if out != tuple(x_shape):
    raise ValueError(
        f"mask of shape {tuple(mask.shape)} does not broadcast to x of shape {tuple(x_shape)}."
    )


def check_pointwise_param(name: str, p: Any, x_shape: tuple[int, ...]) -> None:
  """Checks a parameter of a pointwise op (DyT, Derf): None, or a floating array that
  broadcasts against ``x`` from its trailing axes without enlarging it.

  Allowed: a scalar (``()`` or ``(1,)``), one value per channel (``(d,)``), per head and
  channel (``(heads, d)``), or any shape whose every axis is 1 or the size of the matching
  trailing axis of ``x``.
  """
  if p is None:
    return
  check_floating(name, p)
  shape = tuple(p.shape)
  x_shape = tuple(x_shape)
  if len(shape) <= len(x_shape):
    tail = x_shape[len(x_shape) - len(shape):]
    if all(n in (1, m) for n, m in zip(shape, tail)):
      return
  raise ValueError(
      f"{name} must broadcast against x of shape {x_shape} from its trailing axes (a scalar, "
      f"({x_shape[-1] if x_shape else 1},) for one value per channel, or a trailing block of "
      f"x's shape with axes of size 1 where it is shared), got shape {shape}.")


def check_finite_real(name: str, value: Any) -> float:
  """``value`` as a Python float: a real number (not a bool, not an array), finite.

  The rule of the pointwise layers' initial ``alpha``/``shift`` and of the model's
  ``pointwise_alpha`` entries.
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise TypeError(f"{name} must be a finite real number, got {type(value).__name__} "
                    f"{value!r}.")
  return float(value)

