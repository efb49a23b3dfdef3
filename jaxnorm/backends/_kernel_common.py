"""Internal API: what the kernel backends (Triton, TPU) share besides their primitive.

* :class:`KernelBackend`: a :class:`~jaxnorm.backends.interface.Backend` whose kernels take no
  mask, no ``axis_name`` and no trace under a mesh with non-manual axes, implement the norm ops
  without their options (:meth:`KernelBackend.option_refusal`, the ops' ``"refusal"`` entry)
  and say the rest of what they refuse in :meth:`KernelBackend.shape_refusal`;
* the glue around one kernel problem: per-head parameters mapped as one more grid axis
  (:func:`over_heads`), a per-head cotangent summed back (:func:`param_sums`), the kernels'
  parameter cotangents and statistics in the XLA backend's shapes (:func:`params_like`,
  :func:`stats_from_kernels`);
* the availability probe of a Pallas module, which imports no Pallas (:func:`find_submodule`),
  and the lookup of a Pallas name with an error that names the JAX version (:func:`lookup`),
  for each backend's ``compat`` fence.

Imports no backend, and no Pallas.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import importlib.util
import sys

import jax
import jax.numpy as jnp

from jaxnorm.backends.interface import Backend

__all__ = ["KernelBackend", "find_submodule", "lookup", "over_heads", "param_sums",
           "params_like", "stats_from_kernels", "sum_to"]


def under_non_manual_mesh() -> bool:
  """Whether the current trace has an abstract mesh with an axis that is not Manual."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return False
  return any(t != jax.sharding.AxisType.Manual for t in mesh.axis_types)


class KernelBackend(Backend):
  """The refusals both kernel backends share. ``kernels``: how a message names them."""

  kernels = "the kernels"

  def refusal(self, x2_shape, dtype, mask, axis_name, op, options=()):
    """Why the kernels cannot take a plain call on ``x2: (rows, d)``, or None: the table's
    (:meth:`Backend.refusal`: an op without entries by name, then the op's ``"refusal"``
    entry), then a mask, ``axis_name``, a non-manual mesh, then :meth:`shape_refusal`."""
    why = super().refusal(x2_shape, dtype, mask, axis_name, op, options)
    if why is not None:
      return why
    if mask is not None:
      return f"{self.kernels} do not take a mask"
    if axis_name is not None:
      return f"{self.kernels} do not take an axis_name (sharded feature axis)"
    if under_non_manual_mesh():
      return ("the call is traced under a mesh with non-manual axes (explicit or automatic "
              "sharding); a pallas_call runs per device, inside shard_map only")
    return self.shape_refusal(x2_shape, dtype)

  def shape_refusal(self, x2_shape, dtype) -> str | None:
    """Why the kernels cannot take ``x2: (rows, d)`` of ``dtype``, or None (default: None)."""
    del x2_shape, dtype
    return None

  def option_refusal(self, op, x2_shape, dtype, options: dict) -> str | None:
    """The norm ops' ``"refusal"`` entry: any option away from its default (the kernels
    implement none), or None."""
    del x2_shape, dtype
    defaults = {o.name: o.default for o in op.options}
    changed = [f"{name}={value!r}" for name, value in options.items() if value != defaults[name]]
    if changed:
      return f"{self.kernels} implement {op.name} without its options ({', '.join(changed)})"
    return None

  def forward_only(self, cfg, x, scale, bias, mask):
    """``y`` from the forward kernel."""
    return self.forward(cfg, x, scale, bias, mask)[0]


def over_heads(cfg, fn, kinds: str, out_kinds: str):
  """``fn(cfg, *args)`` on the kernels, mapped over the per-head axes of the parameters.

  The kernels take one parameter row for all rows. With per-head parameters (``cfg.heads``,
  e.g. ``x: (tokens, heads, d)``, ``scale: (heads, d)``) each head is one kernel problem, and
  ``jax.vmap`` over the head axes gives one launch with one more grid axis. ``kinds`` and
  ``out_kinds`` say, per argument and per result, "r" for a row-like ``(..., heads..., d|1)``
  array, "p" for a ``(heads..., d)`` parameter (broadcast to every head first; its cotangent
  comes back per head: see :func:`param_sums`). Without per-head parameters: ``fn`` itself.
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


def param_sums(cfg, scale, dscale, dbias):
  """``(dscale, dbias)`` from :func:`over_heads`, each summed to its primal's shape."""
  return (None if scale is None else sum_to(dscale, scale.shape),
          None if dbias is None else sum_to(dbias, cfg.bias_shape))


def params_like(cfg, scale, dscale, dbias):
  """The kernels' ``dscale``/``dbias`` in their primals' shapes and dtypes (as XLA's come)."""
  if dscale is not None:
    dscale = dscale.reshape(scale.shape).astype(scale.dtype)
  if dbias is not None:
    dbias = dbias.reshape(cfg.bias_shape).astype(cfg.bias_dtype)
  return dscale, dbias


def stats_from_kernels(cfg, row_shape, flat_stats):
  """The kernels' statistics (the op's ``residuals``, in order) as ``(shift, delta, rstd)``,
  each reshaped to ``row_shape`` (None where the op keeps none)."""
  named = dict(zip(cfg.op.residuals, flat_stats))
  return tuple(None if named.get(k) is None else named[k].reshape(row_shape)
               for k in ("shift", "delta", "rstd"))


def find_submodule(package: str, name: str):
  """The import spec of ``package.name`` (a module object where it has none), found without
  importing ``package`` (``importlib.util.find_spec`` imports its parent only); None where
  either is absent or blocked (a ``None`` in ``sys.modules``, Python's marker for a module
  ``import`` refuses)."""
  parent = importlib.util.find_spec(package)  # None for a blocked package
  if parent is None or not parent.submodule_search_locations:
    return None
  full = f"{package}.{name}"
  if full in sys.modules:
    module = sys.modules[full]
    return None if module is None else (getattr(module, "__spec__", None) or module)
  return importlib.machinery.PathFinder.find_spec(full, parent.submodule_search_locations)


def lookup(module, names: tuple[str, ...], what: str, *, who: str, tail: str):
  """The first of ``names`` that ``module`` has; else a ``RuntimeError``: "``who`` do not know
  where jax X keeps ``what`` (looked for ...); ``tail``"."""
  for name in names:
    if hasattr(module, name):
      return getattr(module, name)
  raise RuntimeError(
      f"{who} do not know where jax {jax.__version__} keeps {what} (looked for "
      f"{', '.join(f'{module.__name__}.{n}' for n in names)}); {tail}")
