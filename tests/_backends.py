"""The implementations the op test batteries run on: one :class:`Backend` per ``impl=``.

A battery is a base class of tests written once against ``self.backend`` and subclassed once
per backend (``class TestXla(Battery): backend = XLA``), as tokamax's ``test_base.py`` is
subclassed by ``pallas_triton_test.py``. The backend carries the op arguments that select it
(``impl=``, ``pallas=``), what its hypothesis draws may contain, and why it skips a case.

The Pallas kernels run in interpret mode off a GPU (slow: each new shape compiles an
interpreter of the kernel, about a second of CPU), so their battery draws fewer examples of
smaller shapes; the kernels' own block structure (row tiles, the column loop) is covered by
``tests/jaxnorm/test_pallas.py`` and the fused kernel cases of ``tests/jaxnorm/test_fused.py``.
"""

from __future__ import annotations

import dataclasses

import jax
import jaxnorm
import pytest
from hypothesis import given, settings
# Imported here, at collection, not first inside a hypothesis test (where registering the kit's
# profiles warns).
from jaxnorm.testing import ROW_KINDS

# Interpret mode where the Triton kernels cannot compile (a CPU); compiled on a GPU.
INTERPRET = not jaxnorm.pallas_compiles_on()


@dataclasses.dataclass(frozen=True)
class Backend:
  """One implementation of the ops, as the tests select and bound it."""

  impl: str  # The ops' impl= argument.
  pallas: jaxnorm.PallasConfig | None = None  # The ops' pallas= argument.
  dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")  # What it computes in.
  masks: bool = True  # Whether it takes mask=.
  max_d: int = 1024  # Largest normalized size the hypothesis strategies draw.
  example_share: float = 1.0  # Fraction of a battery test's max_examples this backend runs.

  @property
  def kw(self) -> dict:
    """The keyword arguments that select this backend on a public op."""
    return dict(impl=self.impl, pallas=self.pallas)

  def skip_unless(self, *, dtype=None, mask=False) -> None:
    """Skips the test, saying why, where this backend cannot run the call."""
    if dtype is not None and str(dtype) not in self.dtypes:
      pytest.skip(f"impl={self.impl!r} does not compute in {dtype} (the kernels take "
                  f"{', '.join(self.dtypes)}; test_pallas.py::test_supported checks the refusal)")
    if mask and not self.masks:
      pytest.skip(f"impl={self.impl!r} takes no mask (impl='pallas' raises, test_ops_errors "
                  f"checks it)")

  def given(self, max_examples: int, **strategies):
    """``@given(**strategies)`` with this backend's share of ``max_examples``, called at once.

    Hypothesis fixes ``settings`` when a test is defined, so a battery method builds its
    property per backend: ``self.backend.given(15, case=cases(self.backend))(body)``.
    """
    n = max(1, round(max_examples * self.example_share))

    def run(body):
      settings(max_examples=n)(given(**strategies)(body))()

    return run


XLA = Backend("xla")
PALLAS = Backend(
    "pallas", jaxnorm.PallasConfig(interpret=INTERPRET),
    dtypes=("float32", "bfloat16", "float16"), masks=False,
    max_d=256 if INTERPRET else 1024,
    example_share=0.4 if INTERPRET else 1.0,
)


# The finite row kinds of jaxnorm.testing.ROW_KINDS, which the batteries draw for x under every
# transformation (second order was drawn in float32/float64 on "normal" rows only until
# jaxnorm's second order was mended, docs/testing.md).
FINITE_KINDS = tuple(k for k in ROW_KINDS if k not in ("nan", "inf"))


# The transformation (of jaxnorm.testing.TRANSFORMS) each float32 entry of a battery's fixed
# grid (op x dtype x epsilon placement x zero-centred scale) adds to its base checks: every one
# once per battery and backend, whatever hypothesis draws (each hypothesis example adds one
# drawn transformation too, on its drawn dtype, shape and adversarial rows).
GRID_TRANSFORMS = {
    ("layer_norm", "inside", False): "eager",
    ("layer_norm", "inside", True): "vmap",
    ("layer_norm", "outside", False): "scan",
    ("layer_norm", "outside", True): "grad2",
    ("rms_norm", "inside", False): "checkpoint",
    ("rms_norm", "inside", True): "vmap_unbatched",
    ("rms_norm", "outside", False): "zeros",
    ("rms_norm", "outside", True): "eager",
}


def grid_transforms(op_name: str, dtype: str, placement: str, zero_centered: bool) -> tuple:
  """The ``transforms=`` of a grid entry: :data:`GRID_TRANSFORMS`' one for float32, else none."""
  if dtype != "float32":
    return ()
  return (GRID_TRANSFORMS[op_name, placement, zero_centered],)


def lowered_for(f, platforms, *args) -> str:
  """The StableHLO text of ``jax.jit(f)`` at ``args`` lowered for ``platforms`` (a tuple) from this
  host: what ``impl="auto"`` runs where the program is compiled for those platforms. (An export,
  ``jax.export``, takes the XLA path for ``impl="auto"`` on every platform:
  ``tests/jaxnorm/test_export.py``.)"""
  # A new function each time: jit's trace cache is per function, and would not see that a test
  # stands for another host (the gpu_host fixture of conftest.py).
  return jax.jit(lambda *a: f(*a)).trace(*args).lower(lowering_platforms=tuple(platforms)).as_text()
