"""What a traced program runs: its jaxpr text with the kernel calls expanded into their kernels.

The kernels sit behind ``jaxnorm.backends.triton.kernel_call.kernel_call_p``, whose jaxpr equation names the
function it runs rather than holding its jaxpr (so that it can be typed without tracing the
kernels). :func:`program_text` traces each such equation's kernels on its input types and
splices their jaxpr in, so tests can count ``pallas_call``s and read the kernels' names.
"""

import functools

import jax

from jaxnorm.backends.triton import kernel_call as _kernel_call


def _sub_jaxprs(params):
  for value in params.values():
    for v in (value if isinstance(value, (tuple, list)) else (value,)):
      if hasattr(v, "eqns"):
        yield v
      elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        yield v.jaxpr


def _expand(jaxpr, out):
  for eqn in jaxpr.eqns:
    if eqn.primitive is _kernel_call.kernel_call_p:
      types = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
      inner = jax.make_jaxpr(functools.partial(_kernel_call._run, **eqn.params))(*types)
      out.append(str(inner))
      _expand(inner.jaxpr, out)
    for sub in _sub_jaxprs(eqn.params):
      _expand(sub, out)


def program_text(f, *args) -> str:
  """``str(jax.make_jaxpr(f)(*args))`` plus the jaxprs of the kernels its kernel calls run."""
  closed = jax.make_jaxpr(f)(*args)
  out = [str(closed)]
  _expand(closed.jaxpr, out)
  return "\n".join(out)


def count_pallas_calls(f, *args) -> int:
  """How many ``pallas_call``s the program of ``f`` runs (kernel calls expanded)."""
  return program_text(f, *args).count("pallas_call[")
