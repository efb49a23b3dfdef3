"""A second backend, registered from outside the library: every role of every op that has a
backend (LayerNorm, RMSNorm, their residual add + norm, gated RMSNorm) as a host callback into
the float64 oracle, :mod:`jaxnorm.reference`, differentiated by ``jax.vjp`` in float64.

It is the proof of issue 51's goal 4 and issue 66's goal 3 that a backend is its own file plus
one call (:func:`jaxnorm.backends.table.register_backend`, with ``auto=True``): its own config
class (:class:`OracleConfig`, passed as ``backend_config=`` beside the library's backends'
configs), its own table, and its platform (``cpu``) in ``impl="auto"``'s per-platform choice
next to the library's two kernel backends, nothing of the library edited. It implements the ops
with shared parameters and the default options only (it refuses masks, ``axis_name`` and any
option; per-head parameters and ``casting=`` other than "float32" are not implemented: its roles
raise ``NotImplementedError`` on them). :data:`ENTRIES` records each table entry the dispatcher
called, :data:`CALLS` each ``(op, role)`` whose callback ran.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import reference
from jaxnorm.backends import table
from jaxnorm.backends.interface import Backend

CALLS: set = set()  # (op name, role) of every role the callbacks ran


@dataclasses.dataclass(frozen=True)
class OracleConfig:
  """The oracle backend's config: the dtype its callbacks compute in."""

  dtype: str = "float64"


def _host(op_name: str, role: str, fn, out_types, *args):
  """``fn(*args)`` on the host, in float64 numpy; ``out_types`` the results' (shape, dtype)."""

  def host(*arrays):
    CALLS.add((op_name, role))
    with jax.enable_x64(True):
      outs = fn(*(None if a is None else np.asarray(a, np.float64) for a in arrays))
    return tuple(np.asarray(o).astype(dt) for o, (_, dt) in zip(outs, out_types))

  structs = tuple(jax.ShapeDtypeStruct(s, dt) for s, dt in out_types)
  present = [a for a in args if a is not None]
  where = [a is not None for a in args]

  def unpacked(*arrays):
    it = iter(arrays)
    return host(*(next(it) if w else None for w in where))

  return jax.pure_callback(unpacked, structs, *present)


def _norm_kw(cfg):
  if cfg.heads or cfg.cast is not None and not cfg.cast.factors_first:
    raise NotImplementedError("the oracle backend takes shared parameters and casting='float32'")
  return dict(epsilon=cfg.epsilon, epsilon_placement=cfg.epsilon_placement,
              zero_centered_scale=cfg.zero_centered_scale)


def _norm_fn(cfg):
  """The oracle of the call's op as ``f(x, scale, bias)`` (float64 in, float64 out)."""
  kw = _norm_kw(cfg)
  if cfg.op.name == "layer_norm":
    return lambda x, s, b: reference.layer_norm(x, s, b, **kw)
  return lambda x, s, b: reference.rms_norm(x, s, **kw)


def _stats(cfg, x):
  """``(mean, 0, rstd)`` (LayerNorm) or ``(None, None, rstd)`` of float64 rows, as the XLA
  backend's statistics mean them (``shift + delta`` the mean)."""
  mean = x.mean(-1, keepdims=True)
  centred = x - mean if cfg.op.mean_path else x
  v = (centred ** 2).mean(-1, keepdims=True)
  rstd = (1.0 / np.sqrt(v + cfg.epsilon) if cfg.epsilon_placement == "inside"
          else 1.0 / (np.sqrt(v) + cfg.epsilon))
  return (mean, np.zeros_like(mean), rstd) if cfg.op.mean_path else (None, None, rstd)


class OracleBackend(Backend):
  """The float64 oracle behind the norm family's roles (the add + norm roles are
  :class:`Backend`'s composition of an add in XLA and these)."""

  name = "oracle64"
  platforms = None
  auto_platforms = ("cpu",)  # what impl="auto" gives it (registered with auto=True)
  config_class = OracleConfig
  config_example = "OracleConfig()"

  def refusal(self, x2_shape, dtype, mask, axis_name, op, options=()):
    """An op without entries in its table (the default refusal, by name); masks, ``axis_name``
    and options away from their defaults (but gated RMSNorm's ``group_size`` and
    ``norm_before_gate``) are not implemented."""
    why = super().refusal(x2_shape, dtype, mask, axis_name, op, options)
    if why is not None:
      return why
    defaults = {o.name: o.default for o in op.options}
    # Gated RMSNorm's groups and both orders are implemented; its casting modes are not.
    free = ("group_size", "norm_before_gate") if op.name == "gated_rms_norm" else ()
    if mask is not None or axis_name is not None or any(
        value != defaults[name] for name, value in options if name not in free):
      return "the oracle backend takes no mask, no axis_name and no option"
    return None

  def forward_only(self, cfg, x, scale, bias, mask):
    """``y``."""
    return self.forward(cfg, x, scale, bias, mask)[0]

  def forward(self, cfg, x, scale, bias, mask):
    """``(y, stats)`` from the oracle in float64."""
    del mask
    f, ct = _norm_fn(cfg), jnp.promote_types(x.dtype, jnp.float32)
    row = x.shape[:-1] + (1,)
    n_stats = 3 if cfg.op.mean_path else 1
    types = [(x.shape, cfg.out_dtype)] + [(row, ct)] * n_stats

    def host(x, s, b):
      y = f(x, s, b)
      stats = [a for a in _stats(cfg, x) if a is not None]
      return [y] + stats

    y, *stats = _host(cfg.op.name, "forward", host, types, x, scale, bias)
    return y, (tuple(stats) if cfg.op.mean_path else (None, None, stats[0]))

  def backward(self, cfg, x, scale, mask, stats, dy, dx_dtype=None):
    """``(dx, dscale, dbias)`` by ``jax.vjp`` of the oracle in float64 (statistics unused)."""
    del mask, stats
    f = _norm_fn(cfg)
    has_bias = cfg.bias_dtype is not None
    types = [(x.shape, jnp.dtype(dx_dtype or x.dtype))]
    types += [] if scale is None else [(scale.shape, scale.dtype)]
    types += [(cfg.bias_shape, cfg.bias_dtype)] if has_bias else []

    def host(x, s, dy):
      b = np.zeros(x.shape[-1:]) if has_bias else None
      _, vjp = jax.vjp(lambda x, s, b: f(x, s, b), x, s, b)
      dx, ds, db = vjp(dy)
      return [dx] + ([] if s is None else [ds]) + ([db] if has_bias else [])

    outs = list(_host(cfg.op.name, "backward", host, types, x, scale, dy))
    dx = outs.pop(0)
    dscale = None if scale is None else outs.pop(0)
    return dx, dscale, (outs.pop(0) if has_bias else None)


def _gated_fn(cfg):
  kw = dict(epsilon=cfg.epsilon, group_size=cfg.group_size,
            norm_before_gate=cfg.norm_before_gate)
  return lambda x, z, s: reference.gated_rms_norm(x, z, s, **kw)


def gated_forward(cfg, x, z, scale):
  """``(y, rstd)``, ``rstd: (..., groups)`` in the compute dtype."""
  f, k = _gated_fn(cfg), cfg.group_size
  groups = x.shape[-1] // k

  def host(x, z, s):
    u = x if cfg.norm_before_gate else x * z / (1.0 + np.exp(-z))
    ug = u.reshape(u.shape[:-1] + (groups, k))
    return f(x, z, s), 1.0 / np.sqrt((ug ** 2).mean(-1) + cfg.epsilon)

  types = [(x.shape, cfg.out_dtype), (x.shape[:-1] + (groups,), cfg.compute_dtype)]
  return tuple(_host("gated_rms_norm", "forward", host, types, x, z, scale))


def gated_forward_only(cfg, x, z, scale):
  """``y``."""
  return gated_forward(cfg, x, z, scale)[0]


def gated_backward(cfg, x, z, scale, rstd, dy):
  """``(dx, dz, dscale)`` by ``jax.vjp`` of the oracle in float64 (``rstd`` unused)."""
  del rstd
  f = _gated_fn(cfg)
  types = [(x.shape, x.dtype), (z.shape, z.dtype)]
  types += [] if scale is None else [(scale.shape, cfg.compute_dtype)]

  def host(x, z, s, dy):
    _, vjp = jax.vjp(f, x, z, s)
    dx, dz, ds = vjp(dy)
    return [dx, dz] + ([] if s is None else [ds])

  outs = _host("gated_rms_norm", "backward", host, types, x, z, scale, dy)
  return outs[0], outs[1], (None if scale is None else outs[2])


def _recorded(op_name: str, roles: dict) -> dict:
  """``roles`` with each function recording ``(op_name, role)`` in :data:`ENTRIES` when the
  dispatcher calls it."""

  def wrap(role, fn):
    def entry(*args, **kw):
      ENTRIES.add((op_name, role))
      return fn(*args, **kw)
    return entry

  return {role: wrap(role, fn) for role, fn in roles.items()}


ENTRIES: set = set()  # (op name, role) of every table entry the dispatcher called

ORACLE = OracleBackend()
for _name in ("layer_norm", "rms_norm"):
  ORACLE.register(_name, **_recorded(_name, ORACLE.norm_roles()))
ORACLE.register("gated_rms_norm", **_recorded("gated_rms_norm", dict(
    forward_only=gated_forward_only, forward=gated_forward, backward=gated_backward)))


def registered():
  """The one call that makes :data:`ORACLE` a backend of the library
  (:func:`jaxnorm.backends.table.register_backend`, in ``impl="auto"``'s choice for its
  ``auto_platforms``), undone on exit: a context manager, so that the other tests see the
  library's own backends."""
  return _Registered()


class _Registered:
  def __enter__(self):
    table.register_backend(ORACLE, auto=True)
    return ORACLE

  def __exit__(self, *exc):
    table.unregister_backend(ORACLE.name)
