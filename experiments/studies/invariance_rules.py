"""The verdict rules of the invariance study (:mod:`experiments.studies.invariance`).

Each claim has a rule fed plain numbers (largest errors, break points, ratios) that returns a
claim dict (``id``, ``criterion``, ``ours``, ``holds``); :func:`verdicts` reads those numbers
from the study's measurements. ``tests/experiments/test_verdicts.py`` feeds every rule synthetic numbers for
each verdict it can give. Scale and gradient invariance are exact properties (without epsilon):
they hold to float rounding or they do not, so their rules give yes or no, never partly, and
their criteria say so.
"""

from __future__ import annotations

import numpy as np

from experiments.suite import claims as claims_lib

ROUNDING_TOL = 1e-5        # float32 rounding level of an O(1) output with d <= 1024
GRAD_TOL = 10 * ROUNDING_TOL  # the same for the gradient's relative error (one more reduction)
BREAK_LEVEL = 1e-3         # an error above this is "invariance broken"
SHIFT_RANGE = 1e2          # LayerNorm's shift invariance is judged for |c| <= this
RMS_SHIFTED = 0.1          # RMSNorm is "not shift invariant" if its error at c = 1 exceeds this
CLOSE_RATIO = (0.8, 1.25)  # "close" gradient norms


def break_point(grid, err, level):
  """Largest a < 1 at which ``err`` exceeds ``level`` (None if never)."""
  below = [a for a, e in zip(grid, err) if a < 1 and e > level]
  return max(below) if below else None


def _eps_text(eps_max: float, brk: float | None) -> str:
  return (f"with eps=1e-6 {eps_max:z.1e} over [1e-2,1e2]"
          + (f", > {BREAK_LEVEL:g} for a <= {brk:z.2g}" if brk else f", never above {BREAK_LEVEL:g}"))


def scale_claim(err_eps0: float, err_eps_inner: float, brk: float | None) -> dict:
  """``notes_rms_scale_invariance``: the largest forward error without epsilon decides.

  Args:
    err_eps0: max |RMS(a x) - RMS(x)| over the whole grid of ``a``, epsilon 0.
    err_eps_inner: the same with epsilon 1e-6 inside the root, over a in [1e-2, 1e2] (reported).
    brk: the largest a < 1 at which epsilon's error exceeds :data:`BREAK_LEVEL` (reported).
  """
  return {"id": "notes_rms_scale_invariance",
          "criterion": f"max |RMS(ax) - RMS(x)| over a in [1e-3, 1e3] without epsilon <= {ROUNDING_TOL:g} "
                       "(float32 rounding): yes, else no; an exact property, so no partly (epsilon's break for "
                       "small a is reported beside it, with its closed form)",
          "ours": f"max|RMS(ax)-RMS(x)| over a in [1e-3,1e3]: {err_eps0:z.1e} with eps=0; "
                  + _eps_text(err_eps_inner, brk),
          "holds": "yes" if err_eps0 <= ROUNDING_TOL else "no"}


def grad_claim(err_eps0: float, err_eps_inner: float, brk: float | None) -> dict:
  """``notes_rms_grad_invariance``: the largest relative gradient error without epsilon decides.

  Arguments as in :func:`scale_claim`, for the gradient with respect to the original ``x``.
  """
  return {"id": "notes_rms_grad_invariance",
          "criterion": f"max relative error of grad_x over a in [1e-3, 1e3] without epsilon <= {GRAD_TOL:g}: yes, "
                       "else no; an exact property, so no partly",
          "ours": f"max rel. error of grad_x over a in [1e-3,1e3]: {err_eps0:z.1e} with eps=0; "
                  + _eps_text(err_eps_inner, brk),
          "holds": "yes" if err_eps0 <= GRAD_TOL else "no"}


def shift_claim(ln_err_in_range: float, ln_err_max: float, rms_err_at_1: float) -> dict:
  """``notes_ln_shift_invariance``: LayerNorm shift invariant, RMSNorm not.

  Args:
    ln_err_in_range: max |LN(x + c) - LN(x)| for c <= :data:`SHIFT_RANGE`.
    ln_err_max: the same up to c = 1e3 (reported: it grows like c x float32 epsilon).
    rms_err_at_1: the smallest |RMS(x + c) - RMS(x)| for c >= 1.
  """
  ln_ok, rms_ok = ln_err_in_range <= BREAK_LEVEL, rms_err_at_1 > RMS_SHIFTED
  return {"id": "notes_ln_shift_invariance",
          "criterion": f"two parts: max |LN(x+c) - LN(x)| for c <= {SHIFT_RANGE:g} is <= {BREAK_LEVEL:g} (LayerNorm "
                       f"invariant) and |RMS(x+c) - RMS(x)| > {RMS_SHIFTED:g} from c = 1 on (RMSNorm not); "
                       "yes/partly/no = both/one/neither",
          "ours": (f"max|LN(x+c)-LN(x)| for c <= {SHIFT_RANGE:g}: {ln_err_in_range:z.1e} ({ln_err_max:z.1e} at c=1e3, "
                   f"the rounding of x + c); RMSNorm: {rms_err_at_1:z.2g} already at c=1"),
          "holds": claims_lib.verdict([ln_ok, rms_ok])}


def grad_norms_claim(op_ratio: float, init_ratio: float | None = None, train_ratio: float | None = None, *,
                     op_seeds: list | None = None, op_range: tuple | None = None,
                     model_seed: int | None = None) -> dict:
  """``notes_grad_norms_close``: RMS/LN weight-gradient norm ratios in :data:`CLOSE_RATIO`.

  Args:
    op_ratio: the op-level ratio (``y = N(x W)``), the mean over ``op_seeds``.
    init_ratio: a Pre-LN model's at init (None if not measured).
    train_ratio: its median over training steps (None if not measured).
    op_seeds: the seeds of the op-level ratio (labels only).
    op_range: its (min, max) over those seeds (labels only).
    model_seed: the one seed of the model-level ratios (labels only; the verdict does not read it).

  The claim's ``seeds`` (the report's seed column) names the seeds of each part where they are known.
  """
  op_name = "op (y = N(xW))"
  if op_seeds is not None:
    op_name += f", mean over seeds {list(op_seeds)}"
  if op_range is not None:
    op_name += f" (range {op_range[0]:z.3f}-{op_range[1]:z.3f})"
  model_tag = "" if model_seed is None else f", seed {model_seed} only"
  checks = [(op_name, op_ratio), (f"Pre-LN model at init{model_tag}", init_ratio),
            (f"in training (median over steps{model_tag})", train_ratio)]
  checks = [(name, r) for name, r in checks if r is not None]
  # The seed column says which part ran which seeds (issue 50: the model parts, which decide a partly, ran one).
  parts = ([f"op {list(op_seeds)}"] if op_seeds is not None else []) + (
      [f"model at init and in training [{model_seed}] only"] if model_seed is not None and len(checks) > 1 else [])
  return {"id": "notes_grad_norms_close", **({"seeds": "; ".join(parts)} if parts else {}),
          "criterion": f"the RMS/LN weight-gradient norm ratio is in [{CLOSE_RATIO[0]}, {CLOSE_RATIO[1]}] ('close') "
                       "for the op, the model at init and the model in training; yes/partly/no = all/some/none",
          "ours": "; ".join(f"{name}: RMS/LN {r:z.3f}" for name, r in checks),
          "holds": claims_lib.verdict([CLOSE_RATIO[0] <= r <= CLOSE_RATIO[1] for _, r in checks])}


def verdicts(data: dict) -> list[dict]:
  """The claims of the invariance study from its measured ``data`` (see the rules above)."""
  grid = np.asarray(data["op"]["a"])
  sc, sh = data["op"]["scale"], data["op"]["shift"]
  inner = (grid >= 1e-2 - 1e-12) & (grid <= 1e2 + 1e-12)
  ed_f = np.asarray(sc["RMSNorm eps=1e-6"]["fwd"])
  ed_g = np.asarray(sc["RMSNorm eps=1e-6"]["grad"])
  ln_shift = np.asarray(sh["LayerNorm eps=1e-6"]["fwd"])
  rms_shift = np.asarray(sh["RMSNorm eps=1e-6"]["fwd"])
  model = data.get("model") or {}
  op_rows = data["op_weight_grads"].get("rows", [])
  op_ratios = [r["rms_over_ln"] for r in op_rows]
  return [
      scale_claim(max(sc["RMSNorm eps=0"]["fwd"]), float(ed_f[inner].max()), break_point(grid, ed_f, BREAK_LEVEL)),
      grad_claim(max(sc["RMSNorm eps=0"]["grad"]), float(ed_g[inner].max()), break_point(grid, ed_g, BREAK_LEVEL)),
      shift_claim(float(ln_shift[grid <= SHIFT_RANGE * (1 + 1e-9)].max()), float(ln_shift.max()),
                  float(rms_shift[grid >= 1].min())),
      grad_norms_claim(data["op_weight_grads"]["ratio_mean"], model.get("init_ratio"), model.get("train_ratio_median"),
                       op_seeds=[r["seed"] for r in op_rows] or None,
                       op_range=(min(op_ratios), max(op_ratios)) if op_ratios else None,
                       model_seed=model.get("seed", 0) if model else None),
  ]
