"""Every pointwise op of ``jaxnorm.OPS`` in its tails: its derived VJP, JVP and Jacobian, for
``x`` and every parameter, far out (``|u|`` up to 1e4, the ``u`` where the true slope crosses
the dtype's epsilon and smallest normal) and at the dtype's limits, against its float64 oracle's
own derivative evaluated without rounding (``tests/_pointwise_tails.py`` says how, and how the
tolerances follow the dtype).

The ops are read from the table, so a new op added by ``docs/adding-an-op.md`` is checked here
with nothing else written: ``pytest tests/jaxnorm/test_pointwise_tails.py -k <name>``.
"""

import jax.numpy as jnp
import pytest

import jaxnorm
from _pointwise_tails import DTYPES, failures, oracle, points
from jaxnorm import reference
from jaxnorm.ops import table
from jaxnorm.ops.pointwise import rules

POINTWISE = [op for op in jaxnorm.OPS.values() if op.family == table.POINTWISE_FAMILY]


def _report(bad):
  return f"{len(bad)} derivatives outside their tolerance:\n" + "\n".join(bad[:24])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", POINTWISE, ids=lambda o: o.name)
def test_derivatives_in_the_tails(op, dtype):
  bad = failures(op, dtype)
  assert not bad, _report(bad)


def test_the_points_reach_the_tails_and_the_limits():
  """u at +-1e4 and at the largest float32; u where tanh's slope is between 1 and 4 times the
  smallest normal, and where it is below float32's epsilon."""
  op = jaxnorm.OPS["dyt"]
  pts = points(op, "float32")
  u = pts["alpha"] * pts["x"]
  big, tiny, eps = (float(getattr(jnp.finfo(jnp.float32), k)) for k in ("max", "tiny", "eps"))
  assert {1e4, -1e4, big, -big} <= set(u.tolist())
  slopes = [float(oracle(op).slope(v)) for v in u.tolist()]
  assert any(tiny <= s <= 4 * tiny for s in slopes) and any(tiny < s < eps / 4 for s in slopes)


def _op_with_slope(name, slope):
  """DyT with another slope: an op of the family as the recipe declares one."""
  decl = rules.Squash(name, jnp.tanh, slope, has_shift=False)

  def fn(x, alpha, scale=None, bias=None, *, dtype=None):
    return rules.call(decl, x, alpha, None, scale, bias, dtype=dtype)

  return table.Op(name, table.POINTWISE_FAMILY, decl, fn, reference.dyt,
                  ("alpha", "scale", "bias"), "TanhSlope")


def test_a_slope_from_the_value_fails():
  """tanh's slope written from the value, 1 - t^2 (issue 66's maintainer's op), is all
  rounding error from |u| of about 9 on, where the true slope is 6e-8: 0 or 6 times too large
  there, depending on how XLA's tanh rounds. The check names those points."""
  bad = failures(_op_with_slope("one_minus_t2", lambda u, t: 1.0 - t * t), "float32")
  at_9 = [b for b in bad if "vjp d/dx at u=9 (" in b]
  assert len(at_9) == 3, _report(bad)


def test_a_slope_with_a_subnormal_factor_fails():
  """DyT's slope before issue 66, 4 e / (1 + e)^2 with e = exp(-2|u|): at |u| = 44, e is
  subnormal and flushed, so the slope is 0 where the true one is 2.4e-38, a normal float32."""

  def slope(u, t):
    del t
    e = jnp.exp(-2.0 * jnp.abs(u))
    return 4.0 * e / jnp.square(1.0 + e)

  bad = failures(_op_with_slope("subnormal_factor", slope), "float32")
  at_44 = [b for b in bad if "vjp d/dx at u=44 (" in b]
  assert at_44 and all("got 0.0," in b for b in at_44), _report(at_44 or bad)
