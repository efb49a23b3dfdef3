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
  counts as :math:`\ell_0`), :math:`\ell_0` the loss at initialization (the step-0 evaluation) of
  that grid's model: one per (layout, QK-norm or not, seed), :func:`init_loss`, in the claim and in
  the report's table alike (issue 50: the claim had capped both grids of a seed at the larger of the
  two models' initial losses, 0.726 where the table, capped at the model's own, said 0.707).

**Testability.** The grid spans at least two decades up to the paper's top rate (the study's
``Config`` refuses less). Fixed before running: the Pre-LN run *without* QK-norm at the top rate grows
its attention logits, its largest logit over training at least ``GROWTH_FACTOR`` (10) times its
largest logit at step 1 and at least ``MIN_PEAK_LOGIT`` (20: a logit gap of 20 already makes the
softmax one-hot to 2e-9). Since issue 50 (one testability rule: a condition may not read the outcome
it judges) that growth is the first half of ``wortsman_qk_removes_logit_growth``'s claim, so a seed
without it *fails* that claim; it stays the condition of the LR-sensitivity claim (it reads the logits,
not the losses that claim judges: the design reached the regime of the mechanism). The LR-sensitivity
claim's former conditions, a sensitivity without QK-norm of at least 0.05 nats and a rate where the run
without QK-norm diverged or spiked while the QK-norm run did not, read the outcome and were removed
in issue 50: a measured null is reported as a null, an effect in one seed as partly, with the rate it
rests on. With no seed judged the verdict is "not testable"
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
  lower by at least ``SENS_MARGIN`` (0.02 nats), in a seed and with any one rate of that seed left out
  of both grids (issue 63: a seed whose pass rests on one rate, e.g. one diverged run, fails and names
  it; a verdict must not hinge on one run). A yes must also survive leaving out any one (rate, seed).

yes = every judged seed, partly = some, no = none. The Post-LN runs beside them are an observation
(``qk_norm_post_ln``: the best final loss with and without QK-norm first, then the LR sensitivity and
the top-rate logits; no verdict).
"""

from __future__ import annotations

import math

import numpy as np

from experiments.suite import claims as claims_lib

GROWTH_FACTOR = 10.0     # largest logit over training / largest logit at step 1
MIN_PEAK_LOGIT = 20.0    # and at least this large (softmax one-hot to exp(-20))
LOGIT_RATIO = 10.0       # QK-norm's peak logit must be this many times smaller
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


def init_loss(init_losses) -> float:
  r""":math:`\ell_0` of one grid (one layout, QK-norm or not, one seed): the largest finite step-0 loss of
  its runs (they share the model's initialization, so the values agree; nan if none)."""
  vals = [float(v) for v in init_losses if v is not None and math.isfinite(float(v))]
  return max(vals) if vals else float("nan")


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
  crit = (f"per seed: Pre-LN without QK-norm at the top rate grows its largest attention logit >= "
          f"{GROWTH_FACTOR:g}x over training and to >= {MIN_PEAK_LOGIT:g} (the claim's first half; a seed without it "
          f"fails), with QK-norm the run finishes (a diverged run fails) and its peak logit is <= 1/{LOGIT_RATIO:g} of "
          "the run without (its own growth from a first logit near 3.5 is shown, not judged); yes/partly/no = "
          "every/some/no seed, not testable if no seed ran")
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
      oks.append(False)
      parts.append(text + " [fails: no logit growth without QK-norm]")
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
                "no seed ran")


def _claim(cid: str, crit: str, oks: list[bool], holds: str, ours: str, parts: list[str], none_judged: str) -> dict:
  """A claim's result from its judged seeds' ``oks``: where none was judged, "not testable" for the
  reason ``none_judged`` (and :data:`NEEDS`) followed by the measured numbers ``ours``."""
  if not oks:
    holds, why = claims_lib.not_testable([f"{none_judged}; {NEEDS}"])
    ours = why + ". Measured: " + ours
  return {"id": cid, "criterion": crit, "ours": ours, "holds": holds, "per_seed": parts}


def _inits(r: dict) -> tuple[float, float]:
  r""":math:`\ell_0` of a seed's grid without and with QK-norm (``init_noqk``, ``init_qk``; ``init``: both)."""
  return float(r.get("init_noqk", r.get("init"))), float(r.get("init_qk", r.get("init")))


def _seed_sens(r: dict, drop: int | None = None) -> tuple[float, float, bool]:
  """``(LRS without, LRS with, passes)`` of one seed, rate index ``drop`` left out of both grids."""
  keep = [i for i in range(len(r["finals_noqk"])) if i != drop]
  i0, i1 = _inits(r)
  a = lr_sensitivity([r["finals_noqk"][i] for i in keep], i0)
  b = lr_sensitivity([r["finals_qk"][i] for i in keep], i1)
  return a, b, b <= SENS_RATIO * a and a - b >= SENS_MARGIN


def _rests_on(r: dict) -> str:
  """The rates a passing seed rests on: leaving one out (of both grids) makes it fail."""
  lrs = r.get("lrs") or list(range(len(r["finals_noqk"])))
  out = []
  for i, lr in enumerate(lrs):
    a, b, ok = _seed_sens(r, i)
    if not ok:
      div = " (the run without QK-norm diverged there)" if r["finals_noqk"][i] is None else ""
      out.append(f"{'lr ' if r.get('lrs') else 'rate #'}{lr:g}{div}: without it LRS {a:z.3f} vs {b:z.3f}")
  return "; it rests on " + ", ".join(out) if out else ""


def _sens_oks(per_seed: dict, drop: tuple | None = None) -> tuple[list[bool], list[str]]:
  """Per judged seed, whether QK-norm lowers the LR sensitivity enough; ``drop = (seed, rate index)``
  leaves that rate out of that seed's two grids (the paired runs)."""
  oks, parts = [], []
  for seed, r in per_seed.items():
    a, b, ok = _seed_sens(r, drop[1] if drop is not None and drop[0] == seed else None)
    text = f"s{seed}: LRS {a:z.3f} without, {b:z.3f} with QK-norm"
    if not instability_reproduced(r["noqk_top"]):
      parts.append(text + " [not judged: no logit growth without QK-norm at the top rate]")
      continue
    rests = _rests_on(r) if ok and drop is None else ""
    oks.append(ok and not rests)
    parts.append(text + (" [fails: a null]" if not ok else
                         f" [fails: the effect{rests.replace('; it rests on', ' rests on one rate,')}]" if rests
                         else " [ok]"))
  return oks, parts


def claim_lr_sensitivity(per_seed: dict) -> dict:
  """``wortsman_qk_lr_sensitivity`` from ``{seed: {"finals_noqk", "finals_qk", "init_noqk", "init_qk",
  "noqk_top", "lrs"}}``.

  ``finals_*`` are the final validation losses over the grid's rates (None: diverged), ``init_*``
  :func:`init_loss` of each grid (``init``: one value for both), ``noqk_top`` :func:`logit_growth` of
  the no-QK-norm Pre-LN run at the top rate, ``lrs`` the rates (optional: the text names them). A seed
  is judged where the logit growth was reproduced; a yes must stay yes with any one (rate, seed) left
  out of both grids, else partly; a passing seed names the rates it rests on.
  """
  crit = (f"judged in a seed if Pre-LN without QK-norm grows its logits at the top rate (the logit-growth "
          f"condition: the regime of the mechanism, read from the logits, not the losses); there: LRS with QK-norm "
          f"<= {SENS_RATIO:g} x LRS without and lower by >= {SENS_MARGIN:g} nats (each grid capped at its own "
          "model's initial loss), and with any one rate of that seed left out of both grids; yes/partly/no = "
          "every/some/no judged seed (yes also with any one (rate, seed) left out), not testable if none is")
  oks, parts = _sens_oks(per_seed)
  holds = claims_lib.verdict(oks)
  flips = []
  if oks and holds == "yes":
    for seed, r in per_seed.items():
      for i in range(len(r["finals_noqk"])):
        o, _ = _sens_oks(per_seed, (seed, i))
        if claims_lib.verdict(o) != "yes" or not o:
          flips.append(f"rate #{i} of s{seed}")
  vals = np.array([_seed_sens(r)[:2] for r in per_seed.values()])
  spread = (f"; seed spread (max - min) {np.ptp(vals[:, 0]):z.3f} / {np.ptp(vals[:, 1]):z.3f}"
            if len(vals) > 1 else "; one seed")
  ours = "; ".join(parts) + spread
  if flips:
    holds = "partly"
    ours += "; not robust: leaving out " + ", ".join(flips) + " changes the verdict"
  out = _claim("wortsman_qk_lr_sensitivity", crit, oks, holds, ours, parts,
               "in no seed did Pre-LN without QK-norm grow its attention logits at the top rate")
  if oks:
    judged = {seed: r for seed, r in per_seed.items() if instability_reproduced(r["noqk_top"])}
    passed = [seed for seed, r in judged.items() if _seed_sens(r)[2]]
    robust = [seed for seed in passed if not _rests_on(judged[seed])]
    rests = "".join(f" (s{seed}{_rests_on(judged[seed]).replace('; it rests on', ' rests on')})"
                    for seed in passed if seed not in robust)
    out["short"] = (f"an effect in {len(robust)} of {len(judged)} judged seeds, one resting on a single rate in "
                    f"{len(passed) - len(robust)}{rests}, a null in {len(judged) - len(passed)}; LRS without -> "
                    "with QK-norm: "
                    + ", ".join(f"s{seed} {a:z.3f} -> {b:z.3f}" for seed, (a, b, _) in
                                ((seed, _seed_sens(r)) for seed, r in judged.items())))
  return out


def claim_post_ln(per_seed: dict) -> dict:
  """``qk_norm_post_ln`` (observation) from ``{seed: {"best_noqk", "best_qk", "lrs_noqk", "lrs_qk", "noqk_top",
  "qk_top"}}``: the best final loss over the rates first (issue 50: the loss, then the sensitivity)."""
  parts = []
  for seed, r in per_seed.items():
    loss = (f"best final loss {r['best_noqk']:z.3f} without, {r['best_qk']:z.3f} with QK-norm "
            f"({r['best_qk'] - r['best_noqk']:+z.3f}); ")
    parts.append(f"s{seed}: {loss}LRS {r['lrs_noqk']:z.3f} without, {r['lrs_qk']:z.3f} with; top-rate peak logit "
                 f"{r['noqk_top']['peak']:z.3g} without, {r['qk_top']['peak']:z.3g} with")
  d = [r["best_qk"] - r["best_noqk"] for r in per_seed.values()]
  rng = lambda k: f"{min(r[k] for r in per_seed.values()):z.3f}-{max(r[k] for r in per_seed.values()):z.3f}"  # noqa: E731
  short = (f"best final loss with minus without QK-norm {min(d):+z.3f} to {max(d):+z.3f} ({sum(x < 0 for x in d)}/"
           f"{len(d)} lower); LRS {rng('lrs_noqk')} without, {rng('lrs_qk')} with") if d else ""
  return {"id": "qk_norm_post_ln", "criterion": "observation (no published counterpart at this scale)",
          "ours": "; ".join(parts), "holds": "obs", **({"short": short} if short else {})}
