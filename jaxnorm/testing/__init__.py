"""jaxnorm.testing: property tests for any custom derivative rule (``docs/testing.md``).

:func:`check_rule` checks a ``jax.custom_vjp`` or ``jax.custom_jvp`` function (or anything
calling them) against autodiff of a plain reference evaluated in float64: values, VJPs with
random cotangents, JVPs with random tangents, the adjoint identity between the two, under
``jit``, ``vmap``, second order, ``jax.checkpoint``, ``lax.scan`` and symbolic zeros, within
:class:`Tolerance` budgets in ulps of each result's dtype. It needs only JAX. The rule's
compiled programs are kept by rule and argument signature, so a later call on new values of the
same shapes compiles nothing (:func:`clear_cache` forgets them). The hypothesis
strategies (:func:`arrays`, :func:`dtypes`, :func:`masks`, :func:`shapes`,
:data:`ROW_KINDS`) and profiles (:data:`CI_PROFILE`, :data:`THOROUGH_PROFILE`) are loaded from
``jaxnorm.testing._strategies`` on first use, so hypothesis is needed only by who uses them
(``pip install jaxnorm[testing]``).
"""

from jaxnorm.testing._checks import MODES as MODES
from jaxnorm.testing._checks import TRANSFORMS as TRANSFORMS
from jaxnorm.testing._checks import Outcome as Outcome
from jaxnorm.testing._checks import Report as Report
from jaxnorm.testing._checks import RuleCheckError as RuleCheckError
from jaxnorm.testing._checks import check_rule as check_rule
from jaxnorm.testing._programs import clear_cache as clear_cache
from jaxnorm.testing._tolerance import Tolerance as Tolerance
from jaxnorm.testing._tolerance import ulp as ulp

# Names of jaxnorm.testing._strategies, imported on first access (it imports hypothesis).
_LAZY = ("CI_PROFILE", "ROW_KINDS", "THOROUGH_PROFILE", "arrays", "dtypes", "masks", "shapes")

__all__ = ["MODES", "TRANSFORMS", "Outcome", "Report", "RuleCheckError", "Tolerance",
           "check_rule", "clear_cache", "ulp", *_LAZY]


def __getattr__(name):
  if name in _LAZY:
    from jaxnorm.testing import _strategies
    return getattr(_strategies, name)
  raise AttributeError(f"module 'jaxnorm.testing' has no attribute {name!r}")
