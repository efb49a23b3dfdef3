"""The no-crash matrix: jaxnorm's ops and layers against Flax's layers (or a plain ``jnp``
reference where Flax has none), each case's programs compiled and run in a child process.

A case is ``(api, op, scale, rows, loss, mode)``:

* ``api``: ``functional`` (``jaxnorm.layer_norm`` ...), ``nnx`` or ``linen`` (the layers);
* ``op``: ``layer_norm``, ``rms_norm``, ``add_rms_norm``, ``add_layer_norm`` (the layers'
  ``residual=``) or ``gated_rms_norm``;
* ``scale``: ``ones`` (a constant of equal entries: ``jnp.ones(d)`` inside the traced function
  for the functional ops, a freshly built layer closed over for the layers), ``const`` (a
  captured constant of unequal entries), ``arg`` (an argument of the jitted function, also
  differentiated) or ``none`` (no scale);
* ``rows``: the rows of ``x: (rows, 16)``;
* ``loss``: ``sum`` (``sum(y)``) or ``square`` (``sum(y**2)``);
* ``mode``: ``grad`` (``jit(grad)``), ``vjp`` (``jit`` of a ``vjp`` pulled back with the loss's
  cotangent), ``jvp`` (``jit(jvp)`` of the loss) or ``hvp`` (``jit`` of forward-over-reverse).

Run as ``python tests/_crash_matrix.py CASE...`` (each ``CASE`` a :func:`case_id`); it prints
``START <id>`` before a case and ``OK <id>``, ``MISMATCH <id> <why>``, ``ERROR <id> <why>`` (jaxnorm raised) or
``REFERR <id> <why>`` after it, flushed, so that the parent sees which case a crash killed.
The reference (Flax's layer, or ``jnp``) runs first in each case: a case whose reference
raises is reported as ``REFERR`` and does not count against jaxnorm. ``tests/jaxnorm/test_no_crash.py``
drives it; ``python tests/_crash_matrix.py --all`` lists every case id.

The child is given the user's XLA flags (the test session's are removed, see
:func:`child_env`): the crash this guards against was in XLA:CPU's default YNNPACK fusions,
which the suite's own emitter flags do not build.
"""

from __future__ import annotations

import itertools
import os
import sys

APIS = ("functional", "nnx", "linen")
OPS = ("layer_norm", "rms_norm", "add_rms_norm", "add_layer_norm", "gated_rms_norm")
SCALES = ("ones", "const", "arg", "none")
ROWS = (1024, 4096, 16384)
LOSSES = ("sum", "square")
MODES = ("grad", "vjp", "jvp", "hvp")
D = 16

# The flags the test session adds (tests/conftest.py) that change what XLA builds; the child
# drops them so that it compiles what a user's process compiles.
_SESSION_FLAGS = ("--xla_backend_optimization_level", "--xla_cpu_use_fusion_emitters",
                  "--xla_cpu_parallel_codegen_split_count",
                  "--xla_force_host_platform_device_count")


def case_id(case) -> str:
  return "-".join(str(c) for c in case)


def parse(case: str):
  api, op, scale, rows, loss, mode = case.split("-")
  return api, op, scale, int(rows), loss, mode


def all_cases():
  return [c for c in itertools.product(APIS, OPS, SCALES, ROWS, LOSSES, MODES)]


# The cases that killed the process at 4a7aa67 (issue 62), always in the suite's subset.
KNOWN_CRASHES = (
    ("functional", "rms_norm", "ones", 4096, "sum", "grad"),
    ("functional", "layer_norm", "ones", 16384, "square", "grad"),
    ("functional", "add_rms_norm", "ones", 4096, "sum", "grad"),
    ("nnx", "rms_norm", "ones", 4096, "sum", "grad"),
    ("nnx", "layer_norm", "ones", 16384, "square", "grad"),
    ("linen", "rms_norm", "ones", 4096, "sum", "vjp"),
)


def pairwise_cases(seed: int = 0):
  """A subset of :func:`all_cases` in which every pair of values of two dimensions occurs in
  some case (greedy, deterministic), plus :data:`KNOWN_CRASHES`: what the suite runs."""
  import random
  dims = (APIS, OPS, SCALES, ROWS, LOSSES, MODES)
  todo = {(i, a, j, b) for i, j in itertools.combinations(range(len(dims)), 2)
          for a in dims[i] for b in dims[j]}
  pool = all_cases()
  random.Random(seed).shuffle(pool)
  chosen = list(KNOWN_CRASHES)

  def pairs(c):
    return {(i, c[i], j, c[j]) for i, j in itertools.combinations(range(len(c)), 2)}

  for c in chosen:
    todo -= pairs(c)
  while todo:
    best = max(pool, key=lambda c: len(pairs(c) & todo))
    chosen.append(best)
    todo -= pairs(best)
  return chosen


def child_env(environ=None) -> dict:
  """``environ`` (default ``os.environ``) with the test session's XLA flags removed and no
  compilation cache: the user's flags (an ``--xla_cpu_max_isa`` cap, say) are kept."""
  env = dict(os.environ if environ is None else environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if f.split("=")[0] not in _SESSION_FLAGS]
  env["XLA_FLAGS"] = " ".join(flags)
  for var in ("JAX_COMPILATION_CACHE_DIR", "JAXNORM_TEST_COMPILE_CACHE"):
    env.pop(var, None)
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _functions(api, op, scale, rows):
  """``(ours, theirs, args)``: two functions of ``args`` (x first; a residual or gate second for
  the add and gated ops; the scale last where it is an argument) returning ``y``."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import linen as fln
  from flax import nnx

  import jaxnorm
  from jaxnorm import linen as jln
  from jaxnorm import nnx as jnn
  from jaxnorm import reference as ref

  rng = np.random.default_rng(rows)
  x = jnp.asarray(rng.standard_normal((rows, D)), jnp.float32)
  other = jnp.asarray(rng.standard_normal((rows, D)), jnp.float32)
  s_const = jnp.asarray(1.0 + 0.25 * rng.standard_normal(D), jnp.float32)
  has_other = op.startswith(("add_", "gated_"))
  base = {"add_rms_norm": "rms_norm", "add_layer_norm": "layer_norm"}.get(op, op)
  args = (x, other) if has_other else (x,)
  if scale == "arg":
    args = args + (s_const,)

  def split(a):  # (x, other or None, scale argument or None)
    return a[0], (a[1] if has_other else None), (a[-1] if scale == "arg" else None)

  if api == "functional":
    def scale_of(s_arg):
      return {"ones": lambda: jnp.ones(D), "const": lambda: s_const, "arg": lambda: s_arg,
              "none": lambda: None}[scale]()

    def ours(*a):
      x, o, s = split(a)
      s = scale_of(s)
      if op == "gated_rms_norm":
        return jaxnorm.gated_rms_norm(x, o, s)
      if op.startswith("add_"):
        return getattr(jaxnorm, op)(x, o, s)[0]
      return getattr(jaxnorm, op)(x, s)

    def theirs(*a):
      x, o, s = split(a)
      s = scale_of(s)
      if op == "gated_rms_norm":
        return ref.gated_rms_norm(x, o, s)
      h = x if o is None else x + o
      return getattr(ref, base)(h, s)

    return ours, theirs, args

  use_scale = scale != "none"
  if op == "gated_rms_norm":
    def build(mod):
      return (jnn.GatedRMSNorm(D, use_scale=use_scale, rngs=nnx.Rngs(0)) if mod == "nnx" else
              jln.GatedRMSNorm(use_scale=use_scale))

    def their_fn(x, o, s):
      return ref.gated_rms_norm(x, o, s)
  else:
    cls = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}[base]

    def build(mod):
      if mod == "nnx":
        return getattr(jnn, cls)(D, use_scale=use_scale, rngs=nnx.Rngs(0))
      if mod == "linen":
        return getattr(jln, cls)(use_scale=use_scale)
      if mod == "flax-nnx":
        return getattr(nnx, cls)(D, use_scale=use_scale, rngs=nnx.Rngs(0))
      return getattr(fln, cls)(use_scale=use_scale)

  def call(layer_fn, x, o):
    if op == "gated_rms_norm":
      return layer_fn(x, o)
    if o is not None:
      return layer_fn(x, residual=o)[0]  # (y, h)
    return layer_fn(x)

  def their_call(layer_fn, x, o):
    return layer_fn(x if o is None else x + o)

  if api == "nnx":
    layer = build("nnx")
    if scale == "const":
      layer.scale.value = s_const
    other_layer = None if op == "gated_rms_norm" else build("flax-nnx")
    if other_layer is not None and scale == "const":
      other_layer.scale.value = s_const
    if scale != "arg":
      def ours(*a):
        x, o, _ = split(a)
        return call(layer, x, o)

      def theirs(*a):
        x, o, _ = split(a)
        if other_layer is None:
          return their_fn(x, o, layer.scale.value if use_scale else None)
        return their_call(other_layer, x, o)
    else:
      graph, state = nnx.split(layer)

      def ours(*a):
        x, o, s = split(a)
        return call(nnx.merge(graph, _with_scale(state, s)), x, o)

      if other_layer is None:
        def theirs(*a):
          x, o, s = split(a)
          return their_fn(x, o, s)
      else:
        tgraph, tstate = nnx.split(other_layer)

        def theirs(*a):
          x, o, s = split(a)
          return their_call(nnx.merge(tgraph, _with_scale(tstate, s)), x, o)
    return ours, theirs, args

  # linen
  layer = build("linen")
  init_args = (x, other) if op == "gated_rms_norm" else (x,)
  params = layer.init(jax.random.key(0), *init_args)
  if scale in ("const", "arg"):
    params = _with_scale(params, s_const)
  other_layer = None if op == "gated_rms_norm" else build("flax-linen")

  def ours(*a):
    x, o, s = split(a)
    p = params if s is None else _with_scale(params, s)
    return call(lambda *b, **k: layer.apply(p, *b, **k), x, o)

  def theirs(*a):
    x, o, s = split(a)
    p = params if s is None else _with_scale(params, s)
    if other_layer is None:
      return their_fn(x, o, p["params"]["scale"] if use_scale else None)
    return their_call(lambda h: other_layer.apply(p, h), x, o)

  return ours, theirs, args


def _with_scale(tree, s):
  """An NNX state or Linen variables with the ``scale`` parameter replaced by ``s`` (others
  kept)."""
  import jax
  return jax.tree_util.tree_map_with_path(
      lambda path, v: s if any(getattr(k, "key", None) == "scale" for k in path) else v, tree)


def _programs(fn, args, loss, mode):
  """What ``mode`` computes of ``loss(fn(*args))`` (or of its gradient), under ``jit``: a tuple
  of arrays. Differentiated with respect to every argument but a gate or residual's values
  are included too (all arguments are float arrays)."""
  import jax
  import jax.numpy as jnp

  def loss_of_y(y):
    return jnp.sum(y) if loss == "sum" else jnp.sum(y * y)

  def total(*a):
    return loss_of_y(fn(*a))

  nums = tuple(range(len(args)))
  if mode == "grad":
    return jax.jit(jax.grad(total, argnums=nums))(*args)
  if mode == "vjp":
    def pulled(*a):
      y, pull = jax.vjp(fn, *a)
      return pull(jax.grad(loss_of_y)(y))
    return jax.jit(pulled)(*args)
  tangents = tuple(jnp.cos(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape) for a in args)
  if mode == "jvp":
    return jax.jit(lambda a, t: jax.jvp(total, a, t))(args, tangents)
  return jax.jit(lambda a, t: jax.jvp(jax.grad(total, argnums=nums), a, t)[1])(args, tangents)


def run_case(case) -> str:
  """One case: the reference's programs, then jaxnorm's; ``OK``, ``MISMATCH`` or ``REFERR``."""
  import jax
  import numpy as np

  api, op, scale, rows, loss, mode = case
  ours, theirs, args = _functions(api, op, scale, rows)
  try:
    want = jax.tree.leaves(_programs(theirs, args, loss, mode))
  except Exception as e:  # noqa: BLE001 - the reference's failure is reported, not ours
    return f"REFERR {case_id(case)} {type(e).__name__}: {e}".replace("\n", " ")[:300]
  try:
    got = jax.tree.leaves(_programs(ours, args, loss, mode))
  except Exception as e:  # noqa: BLE001 - reported as this case's failure
    return f"ERROR {case_id(case)} {type(e).__name__}: {e}".replace("\n", " ")[:300]
  # A scalar (the loss, or its tangent in "jvp" mode) is a float32 sum over the rows x D
  # elements of y: both sides round it, each by up to about n u times its terms (O(1) here), and
  # where the exact value is 0 or nearly (LayerNorm's rows sum to 0, so the tangent of sum(y) and
  # of sum(y**2) cancels to about 1e-4) that noise is all there is: at 16,384 rows Flax gave
  # 4.4e-5 and jaxnorm -2.1e-4 where float64 gives 1.5e-13. So a scalar may also differ by
  # 4 n u; arrays keep the 2e-4 relative bound.
  n_u = rows * D * 2.0 ** -24
  for g, w in zip(got, want, strict=True):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    scale_w = max(1.0, float(np.max(np.abs(w))))
    slack = 4 * n_u / scale_w if g.ndim == 0 else 0.0
    err = float(np.max(np.abs(g - w))) / scale_w
    if not np.all(np.isfinite(g)) or err > 2e-4 + slack:
      return f"MISMATCH {case_id(case)} relative error {err:.3g} (finite: {np.isfinite(g).all()})"
  return f"OK {case_id(case)}"


def main(argv) -> int:
  if argv == ["--all"]:
    print("\n".join(case_id(c) for c in all_cases()))
    return 0
  for arg in argv:
    print(f"START {arg}", flush=True)
    print(run_case(parse(arg)), flush=True)
  return 0


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  raise SystemExit(main(sys.argv[1:]))
