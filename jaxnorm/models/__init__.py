"""Models built from the jaxnorm Flax modules (Flax NNX).

:class:`TransformerLM` is a decoder-only Transformer whose normalization position
(Pre-/Post-/Sandwich-/DeepNorm), type (LayerNorm/RMSNorm), implementation (jaxnorm's custom
VJP or Flax's autodiff) and initialization are switches of :class:`TransformerConfig`.
"""

from jaxnorm.models._config import ACTIVATIONS as ACTIVATIONS
from jaxnorm.models._config import QK_NORM_SCALES as QK_NORM_SCALES
from jaxnorm.models._config import QK_NORMS as QK_NORMS
from jaxnorm.models._config import DTYPES as DTYPES
from jaxnorm.models._config import INITS as INITS
from jaxnorm.models._config import NORM_IMPLS as NORM_IMPLS
from jaxnorm.models._config import NORM_POSITIONS as NORM_POSITIONS
from jaxnorm.models._config import NORM_TYPES as NORM_TYPES
from jaxnorm.models._config import POSITIONS as POSITIONS
from jaxnorm.models._config import TransformerConfig as TransformerConfig
from jaxnorm.models._transformer import TransformerLM as TransformerLM
from jaxnorm.models._config import WEIGHT_GROUPS as WEIGHT_GROUPS
from jaxnorm.models._transformer import block_weight_paths as block_weight_paths
from jaxnorm.models._config import deepnorm_alpha_beta as deepnorm_alpha_beta

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "INITS",
    "NORM_IMPLS",
    "NORM_POSITIONS",
    "NORM_TYPES",
    "POSITIONS",
    "QK_NORMS",
    "QK_NORM_SCALES",
    "TransformerConfig",
    "TransformerLM",
    "WEIGHT_GROUPS",
    "block_weight_paths",
    "deepnorm_alpha_beta",
]
