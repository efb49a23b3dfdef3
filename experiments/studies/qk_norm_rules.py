r"""The verdict rules of the QK-norm study (:mod:`experiments.studies.qk_norm`), fixed before any run.

Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities"
(arXiv:2309.14322). When these rules were fixed (commit d9acc84) only the abstract, the opening of
Sec. 1 and reading notes quoting Sec. 2 had been read. The full text (an ar5iv rendering: Secs.
1-5, the appendices and every figure caption; the figure images not seen) was read afterwards, in
the same session, before the claims' citations were written; it confirmed the formula below
(Sec. 2.2, the rates 3e-4 to 3e-1), the recipe (Sec. 2.1) and the claims (Sec. 3.1.1, Figs. 1-2:
"The max attention logit is reported for layer 0"; we take the largest over all layers). No rule
changed.

* The instability (abstract; Sec. 1): "the growth of logits in attention layers" appears "in small
  models when training at high learning rates", and qk-layernorm, the mitigation used at large
  scale, "is equally effective in this regime"; models with qk-layernorm show "considerably lower LR
  sensitivity" (Sec. 3.1.1, Fig. 1). The attention
  logit is :math:`z_{ij} = \langle q_i, k_j\rangle / \sqrt{d_h}`; the instability makes attention
  weights almost one-hot, with near-zero entropy.
* LR sensitivity (Sec. 2.2; Sec. 1: it "measures the deviation from optimal performance when
  varying LR across orders of magnitude"). We use, as the paper does

  .. math::

     \mathrm{LRS} = \mathbb E_{\eta \in G}\big[\min(\ell(\eta), \ell_0) - \ell^*\big],
     \qquad \ell^* = \min_{\eta \in G} \ell(\eta),

  :math:`G` the grid of peak rates, :math:`\ell(\eta)` the final validation loss (a diverged run
  counts as :math:`\ell_0`), :math:`\ell_0` the loss at initialization (the step-0 evaluation).

**Testability (fixed before running).** The claims about what QK-norm removes can only be judged
where the design reproduces the instability: in a seed, the Pre-LN run *without* QK-norm at the top
rate of the grid must show attention-logit growth, its largest logit over training at least
``GROWTH_FACTOR`` (10) times its largest logit at step 1 and at least ``MIN_PEAK_LOGIT`` (20: a
logit gap of 20 already makes the softmax one-hot to 2e-9). For the LR-sensitivity claim the
no-QK-norm Pre-LN LRS must also be at least ``MIN_SENSITIVITY`` (0.05 nats: there is sensitivity to
remove). A seed that fails is not judged; if no seed is judged the verdict is "not testable"
(:data:`experiments.suite.claims.NOT_TESTABLE`: "not testable at this scale", the reason, then
the measured numbers; it needs ``--preset gpu``).

**Verdicts (fixed before running).** Per judged seed, Pre-LN (the paper's setting, Sec. 2):

* ``wortsman_qk_removes_logit_growth``: with QK-norm, at the top rate, the run finishes and its
  largest logit over training is at most ``1 / LOGIT_RATIO`` (a tenth) of the run without QK-norm
  (the same seed and rate: what QK-norm removes is the difference). The QK-norm run's own growth
  factor is shown, not judged (issue 44; ``rule_changes.toml``): it starts from a logit near 3.5
  (the normalized q, k of a head of width 16 bound it by about sqrt(16) at init), so a bounded
  logit of 27-42 reads as a growth of 8-12x while the run without QK-norm reaches 6e4-1e5.
* ``wortsman_qk_lr_sensitivity``: LRS with QK-norm <= ``SENS_RATIO`` (0.5) x LRS without, and
  lower by at least ``SENS_MARGIN`` (0.02 nats).

yes = every judged seed, partly = some, no = none. The Post-LN runs beside them are an observation
(``qk_norm_post_ln``: the same numbers, no verdict).
"""

from __future__ import annotations

import math

import numpy as np

from experiments.suite import claims as claims_lib

GROWTH_FACTOR = 10.0     # largest logit over training / largest logit at step 1
MIN_PEAK_LOGIT = 20.0    # and at least this large (softmax one-hot to exp(-20))
LOGIT_RATIO = 10.0       # QK-norm's peak logit must be this many times smaller
MIN_SENSITIVITY = 0.05   # nats: the no-QK-norm LRS that makes the sensitivity claim testable
SENS_RATIO = 0.5         # QK-norm's LRS at most this fraction of the no-QK-norm LRS
SENS_MARGIN = 0.02       # nats: and lower by at least this much
NEEDS = "needs a larger scale (`--preset gpu --only qk_norm`)"  # where no seed reproduces the instability


def lr_sensitivity(finals: list, init_loss: float) -> float:
  r"""Wortsman et al.'s LR sensitivity of one grid: the mean of :math:`\min(\ell, \ell_0) - \ell^*`.

  Args:
    finals: the final validation loss at each rate of the grid (``None`` or a non-finite value
      for a diverged run, which counts as ``init_loss``).
    init_loss: :math:`\ell_0`, the loss at initialization.
  """
  capped = [init_loss if (v is None or not math.isfinite(float(v))) else min(float(v), init_loss)
            for v in finals]
  return float(np.mean(capped) - min(capped))


def logit_growth(curve: list) -> dict:
  """Peak, first and growth factor of one run's largest-attention-logit curve.

  Args:
    curve: ``[(step, [per-layer largest logit])]`` of the train lines, in step order
      (non-finite entries, from a diverged step, are skipped).

  Returns:
    ``{"first": max over layers at the first step, "peak": max over steps and layers,
    "growth": peak / first}`` (NaNs when the curve is empty).
  """
  rows = [[float(v) for v in vals if math.isfinite(float(v))] for _, vals in curve]
  rows = [r for r in rows if r]
  if not rows:
    return {"first": float("nan"), "peak": float("nan"), "growth": float("nan")}
  first, peak = max(rows[0]), max(max(r) for r in rows)
  return {"first": first, "peak": peak, "growth": peak / max(first, 1e-12)}


def instability_reproduced(noqk_top: dict) -> bool:
  """The testability condition: the no-QK-norm Pre-LN run at the top rate shows logit growth."""
  return noqk_top["growth"] >= GROWTH_FACTOR and noqk_top["peak"] >= MIN_PEAK_LOGIT


def level_off(steps: list, values: list) -> dict:
  """Where one run's largest-logit curve peaked and how much of the peak its last quarter keeps.

  Returns:
    ``{"peak_step", "late_ratio"}``: the step of the peak, and the largest value over the last
    quarter of the logged steps divided by the peak (1: still at its peak at the end; a curve that
    levelled off early and stayed has a ratio near 1 and an early peak step).
  """
  pts = [(int(st), float(v)) for st, v in zip(steps, values) if math.isfinite(float(v))]
  if not pts:
    return {"peak_step": None, "late_ratio": float("nan")}
  peak_step, peak = max(pts, key=lambda t: t[1])
  late = [v for _, v in pts[3 * len(pts) // 4:]]
  return {"peak_step": peak_step, "late_ratio": max(late) / max(peak, 1e-12)}


def claim_logit_growth(per_seed: dict) -> dict:
  """``wortsman_qk_removes_logit_growth`` from ``{seed: {"noqk": growth, "qk": growth, ...}}``.

  ``growth`` dicts are :func:`logit_growth` of the Pre-LN runs at the top rate; optional
  ``"qk_diverged_at"`` (the QK-norm run's divergence step, or None) and ``"noqk_shape"``
  (:func:`level_off` of the run without). A QK-norm run that diverged is never judged as if it
  had finished: its verdict input is "diverged at step k", which fails the claim (it did not
  keep training with a bounded logit).
  """
  crit = (f"testable in a seed if Pre-LN without QK-norm at the top rate grows its largest attention logit "
          f">= {GROWTH_FACTOR:g}x over training and to >= {MIN_PEAK_LOGIT:g}; judged: with QK-norm the run "
          f"finishes (a diverged run fails) and its peak logit is <= 1/{LOGIT_RATIO:g} of the run without (its own "
          "growth from a first logit near 3.5 is shown, not judged); yes/partly/no = every/some/no judged seed, not "
          "testable if none is")
  oks, parts = [], []
  for seed, r in per_seed.items():
    n, q = r["noqk"], r["qk"]
    shape = r.get("noqk_shape")
    text = (f"s{seed}: no QK-norm peak {n['peak']:z.3g} ({n['growth']:z.3g}x"
            + (f", at step {shape['peak_step']}; its last quarter keeps {shape['late_ratio']:z.0%} of it"
               if shape and shape["peak_step"] is not None else "")
            + f"), QK-norm peak {q['peak']:z.3g} ({q['growth']:z.3g}x from {q['first']:z.3g}), "
            + f"{n['peak'] / max(q['peak'], 1e-12):z.3g}x lower with QK-norm")
    if not instability_reproduced(n):
      parts.append(text + " [not testable]")
      continue
    if r.get("qk_diverged_at") is not None:
      oks.append(False)
      parts.append(text + f" [fails: the QK-norm run diverged at step {r['qk_diverged_at']}]")
      continue
    ok = q["peak"] <= n["peak"] / LOGIT_RATIO
    oks.append(ok)
    parts.append(text + (" [ok]" if ok else " [fails]"))
  ours = "; ".join(parts)
  if oks and len(set(oks)) > 1:
    ours += " (the seeds disagree)"
  return _claim("wortsman_qk_removes_logit_growth", crit, oks, claims_lib.verdict(oks), ours, parts,
                f"in no seed did Pre-LN without QK-norm at the top rate grow its largest attention logit >= "
                f"{GROWTH_FACTOR:g}x to >= {MIN_PEAK_LOGIT:g} (the instability was not reproduced)")


def _claim(cid: str, crit: str, oks: list[bool], holds: str, ours: str, parts: list[str], none_judged: str) -> dict:
  """A claim's result from its judged seeds' ``oks``: where none was judged, "not testable" for the
  reason ``none_judged`` (and :data:`NEEDS`) followed by the measured numbers ``ours``."""
  if not oks:
    holds, why = claims_lib.not_testable([f"{none_judged}; {NEEDS}"])
    ours = why + ". Measured: " + ours
  return {"id": cid, "criterion": crit, "ours": ours, "holds": holds, "per_seed": parts}


def _sens_oks(per_seed: dict, drop: tuple | None = None) -> tuple[list[bool], list[str]]:
  """Per judged seed, whether QK-norm lowers the LR sensitivity enough; ``drop = (seed, rate index)``
  leaves that rate out of that seed's two grids (the paired runs)."""
  oks, parts = [], []
  for seed, r in per_seed.items():
    keep = [i for i in range(len(r["finals_noqk"])) if drop is None or drop != (seed, i)]
    a = lr_sensitivity([r["finals_noqk"][i] for i in keep], r["init"])
    b = lr_sensitivity([r["finals_qk"][i] for i in keep], r["init"])
    text = f"s{seed}: LRS {a:z.3f} without, {b:z.3f} with QK-norm"
    unstable = r.get("loss_unstable")
    if not instability_reproduced(r["noqk_top"]) or a < MIN_SENSITIVITY:
      parts.append(text + " [not testable: no logit growth or no sensitivity to remove]")
      continue
    if unstable is not None and not unstable:
      parts.append(text + " [not testable: no rate where the run without QK-norm diverged or spiked (> 1 nat) "
                   "while the QK-norm run did not]")
      continue
    ok = b <= SENS_RATIO * a and a - b >= SENS_MARGIN
    oks.append(ok)
    parts.append(text + (" [ok]" if ok else " [fails]"))
  return oks, parts


def claim_lr_sensitivity(per_seed: dict) -> dict:
  """``wortsman_qk_lr_sensitivity`` from ``{seed: {"finals_noqk", "finals_qk", "init", "noqk_top",
  "loss_unstable"}}``.

  ``finals_*`` are the final validation losses over the grid's rates (None: diverged),
  ``init`` the loss at initialization, ``noqk_top`` :func:`logit_growth` of the no-QK-norm Pre-LN
  run at the top rate, ``loss_unstable`` the rates at which the run without QK-norm diverged or
  spiked while the QK-norm run did not (the loss-level instability QK-norm is meant to fix; None:
  not recorded). A seed is judged only where both the logit growth and the loss-level instability
  were reproduced. A yes must stay yes with any one (rate, seed) left out of both grids, else partly.
  """
  crit = (f"testable in a seed if the logit-growth condition holds, Pre-LN's LR sensitivity without QK-norm is >= "
          f"{MIN_SENSITIVITY:g} nats, and at some rate the run without QK-norm diverged or spiked (> 1 nat) while "
          f"the QK-norm run did not; judged: LRS with QK-norm <= {SENS_RATIO:g} x LRS without and lower by >= "
          f"{SENS_MARGIN:g} nats; yes/partly/no = every/some/no judged seed (yes also with any one (rate, seed) "
          "left out), not testable if none is")
  oks, parts = _sens_oks(per_seed)
  holds = claims_lib.verdict(oks)
  flips = []
  if oks and holds == "yes":
    for seed, r in per_seed.items():
      for i in range(len(r["finals_noqk"])):
        o, _ = _sens_oks(per_seed, (seed, i))
        if claims_lib.verdict(o) != "yes" or not o:
          flips.append(f"rate #{i} of s{seed}")
  vals = np.array([[lr_sensitivity(r["finals_noqk"], r["init"]), lr_sensitivity(r["finals_qk"], r["init"])]
                   for r in per_seed.values()])
  spread = (f"; seed spread (max - min) {np.ptp(vals[:, 0]):z.3f} / {np.ptp(vals[:, 1]):z.3f}"
            if len(vals) > 1 else "; one seed")
  ours = "; ".join(parts) + spread
  if flips:
    holds = "partly"
    ours += "; not robust: leaving out " + ", ".join(flips) + " changes the verdict"
  return _claim("wortsman_qk_lr_sensitivity", crit, oks, holds, ours, parts,
                f"in no seed did Pre-LN without QK-norm reproduce the logit growth, an LR sensitivity >= "
                f"{MIN_SENSITIVITY:g} nats and a loss-level instability that the QK-norm run avoided")


def claim_post_ln(per_seed: dict) -> dict:
  """``qk_norm_post_ln`` (observation) from ``{seed: {"lrs_noqk", "lrs_qk", "noqk_top", "qk_top"}}``."""
  parts = [f"s{seed}: LRS {r['lrs_noqk']:z.3f} without, {r['lrs_qk']:z.3f} with QK-norm; top-rate peak logit "
           f"{r['noqk_top']['peak']:z.3g} without, {r['qk_top']['peak']:z.3g} with" for seed, r in per_seed.items()]
  return {"id": "qk_norm_post_ln", "criterion": "observation (no published counterpart at this scale)",
          "ours": "; ".join(parts), "holds": "obs"}
