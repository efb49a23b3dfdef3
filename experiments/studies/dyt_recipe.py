r"""The recipe of the ``dyt`` study (issue 36), shared by the study and its pilots.

Four Pre-LN models that differ only in the norm: LayerNorm, RMSNorm, DyT
(:math:`\gamma\tanh(\alpha x) + \beta`) and Derf (:math:`\gamma\,\mathrm{erf}(\alpha x + s) + \beta`),
in every position a norm takes (both block inputs and the final norm). One model size, one number
of optimizer steps; what varies is the number of **unique** training bytes the batches are drawn from
(:func:`experiments.harness.data.train_subset`), so tokens per parameter
:math:`T/P = U / P` (:math:`U` unique training bytes, :math:`P` parameters without the position table)
spans two decades while the bytes processed stay fixed -- Verma 2026's design (WikiText-103 subsets of
1M/10M/118M tokens for a 64M model trained 5000 steps of 64 x 512 tokens in every cell).

The optimizer follows Verma 2026's artifact (``code/train.py``, ``run_3seed.sh``): AdamW with betas
(0.9, 0.95), weight decay 0.1 on matrices only (never on biases, norm scales, alpha or shift), global-norm
clipping at 1.0, a linear warm-up over 40% of the steps (2000 of 5000 there) and then a constant rate
(their cosine runs over 600000 steps, so it barely moves in 5000). The peak rate is chosen per norm by
the pilots (``experiments/results/pilots/dyt/README.md``); Verma uses 3e-4 for every norm.
"""

from __future__ import annotations

from experiments.suite.runs import param_sizes

__all__ = ["ALPHA", "NORMS", "NORM_NAMES", "RECIPE", "WARMUP_FRACTION", "model_fields", "param_count",
           "train_fields", "unique_bytes"]

NORMS = ("layer_norm", "rms_norm", "dyt", "derf")
NORM_NAMES = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm", "dyt": "DyT", "derf": "Derf"}

# The initial alpha as (attention, other) at width 64 (the "other" value covers the MLP norm and the
# final norm):
# * DyT, Zhu et al. 2025 (CVPR), Sec. 7.2, Tables 10-11: alpha_0 for LLMs depends on the width alone
#   (1.0/1.0 at 1024, 1.0/0.5 at 2048, 0.8/0.2 at 4096, 0.2/0.05 at 8192), larger for narrower models;
#   the narrowest width tabled is 1024, so width 64 takes that entry, 1.0/1.0 (an extrapolation: the
#   paper tables nothing below 1024; its non-LLM default 0.5 is for ViT-style models). Verma 2026 uses
#   2.0 in every DyT layer (its artifact's ``dyt_alpha_init = 2.0  # paper default=0.5, we use 2.0``).
# * Derf, Chen et al. 2025 (arXiv:2512.10938), Sec. 5: alpha_0 = 0.5 and s_0 = 0 (shift) everywhere.
ALPHA = {"dyt": (1.0, 1.0), "derf": (0.5, 0.5)}

WARMUP_FRACTION = 0.4   # Verma's 2000 warm-up steps of 5000

RECIPE = {"b1": 0.9, "b2": 0.95, "weight_decay": 0.1, "clip_norm": 1.0, "schedule": "constant"}


def model_fields(norm: str, n_layers: int) -> dict:
  """The :class:`~jaxnorm.models.TransformerConfig` fields of one model of the study (the preset
  supplies the width, heads, FFN width and sequence length)."""
  fields = {"n_layers": n_layers, "norm_position": "pre", "norm_type": norm, "init": "xavier"}
  if norm in ALPHA:
    fields["pointwise_alpha"] = ALPHA[norm]
  return fields


def train_fields(lr: float, steps: int, seed: int, unique: int) -> dict:
  """The :class:`~experiments.harness.train_config.TrainConfig` fields of one run."""
  return {**RECIPE, "lr": lr, "steps": steps, "warmup": int(round(WARMUP_FRACTION * steps)), "seed": seed,
          "train_bytes": unique, "eval_train": True, "log_attention": False, "log_grad_norms": False}


def param_count(model_config) -> int:
  """:math:`P`: the model's parameters without the position table (Verma's count: nanoGPT's
  ``get_num_params`` leaves out ``wpe``; its tied token embedding counts once, our untied head counts
  too)."""
  n, positions = param_sizes(model_config)
  return n - positions


def unique_bytes(tokens_per_param: float, params: int) -> int:
  """:math:`U = \\mathrm{round}(T/P \\cdot P)` unique training bytes."""
  return int(round(tokens_per_param * params))
