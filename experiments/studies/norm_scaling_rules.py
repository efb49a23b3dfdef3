r"""The verdict rules of the LayerNorm-Scaling comparison (:mod:`experiments.studies.norm_scaling`).

Fixed before any run. Sources, both read in their abstracts only (so no figure is cited):

* Sun et al. 2025, "The Curse of Depth in Large Language Models" (arXiv:2502.05795), abstract:
  Pre-LN's "output variance exponentially grows with the model depth"; LayerNorm Scaling, which
  scales the output of the layer normalization "inversely by the square root of its depth", "mitigates
  the output variance explosion of deeper Transformer layers". (Also there: combining it with scaled
  initialization diminishes its effect, so the comparison uses the Xavier init, without GPT-2's
  :math:`1/\sqrt{2L}`.)
* Kim et al. 2025, "Peri-LN: Revisiting Normalization Layer in the Transformer Architecture"
  (arXiv:2502.02732, ICML), abstract: Peri-LN (a norm before and after each sub-layer: this
  project's ``"sandwich"``) "consistently achieves more balanced variance growth" than Pre-LN.

**Measurement.** The hidden state's mean square :math:`m_l = \mathbb E\|x_l\|^2/d` at the input of
block :math:`l = 1..L` and after the last block (``residual_sq_norm``: the mean square about zero;
the residual stream's per-token mean is small, so this is its variance up to that mean), at
initialization and after training. The growth over depth is :math:`g = m_{L+1} / m_1`.

**Testability.** In one phase (init or trained) of one seed the claims are judged only if Pre-LN's
growth is at least ``MIN_GROWTH`` (2: there is a variance growth to curb); otherwise that phase is
not judged, and with no judged phase the verdict is "not testable"
(:data:`experiments.suite.claims.NOT_TESTABLE`, the reason first, then the measured growths).

**Verdicts (issue 32: after training only).** Both claims are about trained models, and at
initialization the layouts' growths are built in (a sandwich block adds about 2 to :math:`m` by
construction: its sub-layer outputs are normalized; LayerNorm Scaling shrinks each block's input
by its depth), so the init phase is shown as a fact of construction and never judged. Per seed,
after training: ``sun_lns_curbs_variance`` is ok if the Pre-LN model with LayerNorm Scaling has
:math:`g \le g_\text{Pre-LN} / ` ``RATIO`` (1.5); ``kim_periln_balanced_variance`` is ok if the
Sandwich (Peri-LN) model has :math:`g \le g_\text{Pre-LN} /` ``RATIO``. yes = every judged seed,
partly = some, no = none; a seed within 10% of the threshold is marked.
"""

from __future__ import annotations

from experiments.suite import claims as claims_lib

MIN_GROWTH = 2.0   # Pre-LN's m_{L+1} / m_1 that makes a phase testable
RATIO = 1.5        # the compared layout must grow at least this many times less


def block_input_profile(residual_sq_norm: list, norm_position: str, n_layers: int) -> list[float]:
  """:math:`[m_1, \\dots, m_L, m_{L+1}]` from the model's ``residual_sq_norm`` (forward order).

  Pre-LN records 2 norm inputs per block (the stream, then the stream after attention) and the
  final norm's; Sandwich 4 per block (stream, attention output, stream, MLP output) and the final.

  Raises:
    ValueError: for another layout or a list of the wrong length.
  """
  per = {"pre": 2, "sandwich": 4}
  if norm_position not in per:
    raise ValueError(f"norm_position must be 'pre' or 'sandwich', got {norm_position!r}.")
  k = per[norm_position]
  vals = [float(v) for v in residual_sq_norm]
  if len(vals) != k * n_layers + 1:
    raise ValueError(f"residual_sq_norm of a {n_layers}-layer {norm_position} model has {k * n_layers + 1} "
                     f"entries, got {len(vals)}.")
  return [vals[k * i] for i in range(n_layers)] + [vals[-1]]


def growth(profile: list[float]) -> float:
  """:math:`m_{L+1} / m_1` of a :func:`block_input_profile`."""
  return profile[-1] / max(profile[0], 1e-30)


def _claim(cid: str, other: str, per: dict, label: str) -> dict:
  crit = (f"after training only, per seed, judged if Pre-LN's growth m_(L+1)/m_1 >= {MIN_GROWTH:g}: {label} growth "
          f"<= Pre-LN's / {RATIO:g}; yes/partly/no = every/some/no judged seed, not testable if none; the growths at "
          "initialization are shown as facts of construction, not judged (the claims are about trained models)")
  oks, parts, init = [], [], []
  for (seed, phase), g in per.items():
    text = f"s{seed} {phase}: growth Pre-LN {g['pre']:z.3g}, {label} {g[other]:z.3g}"
    if phase != "trained":
      init.append(text)
      continue
    if g["pre"] < MIN_GROWTH:
      parts.append(text + " [not testable]")
      continue
    ok = g[other] <= g["pre"] / RATIO
    near = abs(g[other] - g["pre"] / RATIO) <= 0.1 * g["pre"] / RATIO
    oks.append(ok)
    parts.append(text + (" [ok]" if ok else " [fails]") + (" (within 10% of the threshold)" if near else ""))
  holds, ours = claims_lib.verdict(oks), "; ".join(parts)
  if oks and len(set(oks)) > 1:
    ours += " (the seeds disagree)"
  if init:
    ours += "; at initialization, by construction (not judged): " + "; ".join(init)
  if not oks:
    holds, why = claims_lib.not_testable([f"after training, Pre-LN's growth m_(L+1)/m_1 is below {MIN_GROWTH:g} in "
                                          "every seed (or no trained model): no variance growth to curb"])
    ours = why + ". Measured: " + ours
  return {"id": cid, "criterion": crit, "ours": ours, "holds": holds, "per_seed": parts}


def claims(per: dict) -> list[dict]:
  """Both claims from ``{(seed, phase): {"pre": g, "lns": g, "sandwich": g}}`` (:func:`growth`)."""
  return [_claim("sun_lns_curbs_variance", "lns", per, "LayerNorm Scaling"),
          _claim("kim_periln_balanced_variance", "sandwich", per, "Peri-LN (sandwich)")]
