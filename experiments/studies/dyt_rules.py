r"""The verdict rules of the ``dyt`` study (:mod:`experiments.studies.dyt`): when does removing the norm help?

Plain numbers in, claim dicts out (no training, no JAX); ``tests/experiments/test_dyt_rules.py`` feeds every rule
synthetic results for each verdict. Drafted while the pilots on seeds 100-102 ran (their learning-rate
stage seen, not their range stage), revised once after the pilots (T4: the best, not the final,
validation loss decides whether a reference run trained; ``experiments/suite/rule_changes.toml``) and
frozen before any run of the report's seeds 0-2 (``experiments/results/pilots/dyt/README.md``); the
report names its commit. Revised in issue 44 after the report on seeds 0-2 had been read (every change
is an entry of ``rule_changes.toml``): the second window set's relative differences are divided by the
reference's loss on that set; ``derf_generalization`` judged only where Derf has a gain; the best point
of each curve decides which norm is better where a final checkpoint overfit. Revised in issue 50 after
the report on seeds 10-12 had been read: the papers' regime is no longer a testability condition (it
was T5) but is stated in the rows of the claims of Zhu et al. and Chen et al., judged at this scale;
``derf_generalization`` without a gain to explain is "n/a", not "not testable"; ``verma_regularizer``
also needs DyT to be the better model where it counts (the best points where a final checkpoint overfit).

**What was read.**

* Zhu et al. 2025, "Transformers without Normalization" (CVPR; arXiv:2503.10622, June 2025
  revision), read in full by another reader of this project (issue 36): DyT
  :math:`\gamma\tanh(\alpha x) + \beta` with a learnable scalar :math:`\alpha` per layer,
  :math:`\alpha_0 = 0.5` by default; for LLMs :math:`\alpha_0` depends on the width (Sec. 7.2,
  Tables 10-11: attention/other 1.0/1.0 at 1024, 1.0/0.5 at 2048, 0.8/0.2 at 4096, 0.2/0.05 at 8192;
  depth does not matter); its LLaMA runs add a learnable scalar after the embedding initialized to
  :math:`\sqrt d` (Sec. 5, App. A).
* Chen et al. 2025, Derf (arXiv:2512.10938 v2), read in full by the same reader: Eq. 10
  :math:`\gamma\,\mathrm{erf}(\alpha x + s) + \beta`, :math:`\alpha_0 = 0.5`, :math:`s_0 = 0` (Sec. 5);
  GPT-2 124M on OpenWebText, validation loss (Table 12): LN 2.94, DyT 2.97, Derf 2.94, RMSNorm 2.95;
  the gain attributed to generalization, Sec. 6.1 Table 13 (evaluation-mode training loss
  Norm < Derf < DyT).
* Verma 2026, "When Does Removing LayerNorm Help? Activation Bounding as a Regime-Dependent Implicit
  Regularizer" (arXiv:2604.23434 v1): read here are the **abstract and the first paragraph of the
  introduction** (the HTML's opening, arxiv.org/html/2604.23434; the body was not reachable) and the
  **authors' artifact** (github.com/lucky-verma/dyt-composition-study): ``code/model.py`` (DyT without
  bias, ``alpha_init = 2.0``), ``code/train.py`` (AdamW 0.9/0.95, weight decay 0.1, clip 1.0, warm-up
  2000, lr 3e-4 for every norm; final losses by ``estimate_loss`` on random windows of each split),
  ``code/run_3seed.sh`` (64M: 12 layers, width 512, 5000 steps of 64 x 512 tokens, seeds 1337/42/7),
  ``code/prepare_wikitext.py`` (the 1M/10M/50M subsets are the *first* N tokens of WikiText-103's
  training split; validation is its validation split), ``code/activation_analysis.py`` (saturation =
  the fraction of DyT pre-tanh activations :math:`|\alpha x|` above a threshold, on 50 random
  512-token windows of the *training* data of the final checkpoint), ``results/activation_analysis.json``
  (threshold 2: 48.6% at 1M vs 21.3% at 118M for its 85M entry) and
  ``results/full/manifests/paper_sources.json`` (the sources of the paper's tables: the 64M phase
  diagram "tab:phase", vanilla/DyT validation loss 9.384/6.819 at 1M, 4.260/4.510 at 10M,
  3.666/4.386 at 50M, 3.631/4.313 at 118M; "tab:scaling": -27.3% at 64M/1M, +5.9% at 10M, +18.8% at
  118M; "tab:hardtanh": HardTanh 6.246 / 4.660 / 4.562 at 1M / 10M / 118M). The paper's section and
  table numbers are not cited: its body was not read.

**Design facts the rules read.** Every (norm, T/P, seed) cell gives the final validation loss on two
disjoint sets of validation windows (``val``, ``val_alt``; held-out files), the final loss on its own
training bytes (``train``), and for DyT/Derf the saturated fraction per norm input (``saturation``).
The *gap* is ``val - train``. A paired difference ``d = val(A) - val(B)`` (same seed: same init
stream, same batches) is computed on each set of validation windows, a relative one over B's loss on
the same set; it **holds in a seed** only if it is beyond the threshold on both sets (the second set
is the measured evaluation noise). Where either final checkpoint has overfit (its final loss more than
``OVERFIT_FINAL_NATS`` = 0.1 above the best point of its curve, :func:`overfit`), a rule that asks
which norm is better compares the best point of each curve instead (:func:`paired`; the curve is
evaluated on the first set of windows only, so that one difference decides); the final differences
are shown beside it. Verma's published numbers are final checkpoints of fixed-length runs: at the
best points, the "help" of a norm that merely overfits more slowly disappears.

**Testability** (each rule checks its conditions first; "not testable at this scale" with the reason
and the numbers, never a bold no):

* ``T1`` the T/P values span at least ``MIN_DECADES`` (1) decade;
* ``T2`` data are scarce at the smallest T/P: LayerNorm's gap there exceeds its gap at the largest
  T/P by at least ``OVERFIT_NATS`` (0.25 nats) in the seed mean (LayerNorm overfits; without that the
  regime of Verma's 1M cell is not reached);
* ``T3`` the data-rich end is single-epoch pre-training: the largest T/P is seen at most
  ``MAX_RICH_EPOCHS`` (2) times;
* ``T4`` every run a comparison reads finished (no divergence), and the reference runs trained: the
  best validation loss of their curve (the final one if no curve) lies at least ``TRAINED_NATS``
  (0.1) below the unigram plateau of the validation windows (the best, not the final: a run that
  overfits 59 passes over 2,090 bytes ends above the plateau after training well; pilot seed 102);
* three or more seeds.

**The papers' regime is stated, not a condition** (issue 50: "not testable" is kept for a design that
cannot show the effect at all). The language models of Zhu et al. and Chen et al. are trained
single-epoch at ``PAPERS_TPP`` (2.9-29) tokens per parameter (Zhu et al.: LLaMA 7B-70B on 200B tokens of
The Pile; Chen et al.: GPT-2 124M on OpenWebText with the original recipe, its token count not carried
over from the full text) at 124M-70B parameters; ``cpu-extra`` trains 0.92 tokens per parameter (133k
parameters, 2 layers, 240 steps). Their claims are judged at this scale and each row opens with both
regimes (:func:`regime`).

**Two tokens-per-parameter figures.** "T/P" (the study's axis, its cells' labels) is the number of
*unique* training tokens over the parameters: the data available. The tokens *trained* per parameter
are the bytes processed over the parameters, the same in every cell (240 x 16 x 32 / 133,120 = 0.92 in
``cpu-extra``): passes over the unique bytes times T/P (:func:`trained_tokens_per_param`). At T/P 1.84
half of the unique bytes are seen once; "0.92 tokens per parameter" is the figure to compare with the
papers' and with the other studies' regimes.

**Rules** (``REL`` = 1% of the reference's loss):

* ``zhu_dyt_matches_norm`` (judged at the largest T/P, T3/T4): DyT matches a reference (LayerNorm,
  RMSNorm) in a seed if ``|d| <= REL`` on both window sets; yes = matches both references in every
  seed, partly = some (reference, seed), no = none. The other T/P values are shown.
* ``zhu_alpha_width``: needs two or more widths (this study has one: not testable); with several, yes
  if the best :math:`\alpha_0` never increases with the width, no if it never decreases, else partly.
* ``derf_beats_all`` (largest T/P; T3/T4): Derf beats a competitor in a seed if ``d <= -REL`` on both sets;
  yes = all three competitors in every seed, partly = some, no = none.
* ``derf_generalization`` (largest T/P; T3/T4; Table 13's order): judged only in a seed where
  Derf has a gain to explain (:func:`derf_gain`: at least ``REL`` below LayerNorm and RMSNorm on
  each set, as ``derf_beats_all`` counts a win); there, training loss LayerNorm < Derf, RMSNorm <
  Derf and Derf < DyT (each by more than ``ORDER_NATS`` = 0.005); yes = all three in every judged
  seed, partly = some, no = none; "n/a" where no seed has the gain (nothing for the order to explain:
  the design could show it, the premise did not occur; issue 50).
* ``verma_regime_sign`` (smallest and largest T/P; T1/T2): DyT against LayerNorm, relative
  :math:`\Delta = d / \mathrm{val(LN)}` (each set over its own LN loss; the best points where a final
  checkpoint overfit, as at the smallest T/P); at the smallest T/P DyT helps in a seed if
  :math:`\Delta \le -` REL on both sets, at the largest it hurts if :math:`\Delta \ge` REL on both;
  yes = both in every seed, partly = one of the two in some seed, no = neither anywhere. RMSNorm is
  shown beside it, not judged (Verma's baseline is LayerNorm).
* ``verma_saturation`` (DyT, T1): the saturated fraction (mean over DyT layers, on the training bytes)
  at the smallest T/P exceeds that at the largest by at least ``SAT_DIFF`` (0.05) in a seed; yes =
  every seed, partly = some, no = none.
* ``verma_regularizer`` (smallest T/P; T2): DyT acts as a regularizer in a seed if its gap is
  smaller than LayerNorm's by at least ``GAP_NATS`` (0.05) **and** its training loss is higher (it
  fits the training bytes worse and generalizes better; a lower training loss with a lower validation
  loss would be "optimizes better", which is not a regularizer) **and** it is the better model where it
  counts: DyT against LayerNorm as ``verma_regime_sign`` compares them at the smallest T/P (the best
  points where a final checkpoint overfit) at least ``REL`` lower (issue 50: a smaller final gap alone
  is slower overfitting, not a better model); yes = every seed, partly = some, no = none.
* ``verma_hardtanh``: needs HardTanh runs (this study trains none: not testable); with them, the
  ``verma_regime_sign`` rule applied to HardTanh.

Every training verdict is also computed per seed; "yes" needs every seed alone to say yes
(:func:`experiments.suite.claims.seeds_agree`).
"""

from __future__ import annotations

from experiments.studies.dyt_cells import (  # noqa: F401 (re-exported: the cells' readings)
    val_diff, as_float, usable, seeds_of, tpps_of, best_val, gap, mean_saturation, overfit, paired, regime, testability,
    trained_tokens_per_param, fmt_diff, fmt_pair, top_short, nearest_cut)
from experiments.studies.dyt_cells import (  # noqa: F401 (the rules' thresholds)
    MIN_DECADES, OVERFIT_NATS, MAX_RICH_EPOCHS, PAPERS_TPP, OVERFIT_FINAL_NATS, TRAINED_NATS, MIN_SEEDS, REL,
    ORDER_NATS, SAT_DIFF, GAP_NATS, REFS, PAPERS_REGIME, NAMES)
from experiments.suite import claims as claims_lib



def _finish(cid, crit, pooled_oks, per_seed_oks, parts, untestable, *, lead: str = "", short: str = "") -> dict:
  """The claim dict: "not testable" for the ``untestable`` reasons (then the measured ``parts``), else the
  verdict of the judged ``oks``; ``lead`` opens ``ours`` (the regime), ``short`` is the verdict table's
  text (whole: it opens with the compact regime)."""
  lead = lead + ": " if lead else ""
  if untestable:
    holds, why = claims_lib.not_testable(untestable)
    return {"id": cid, "criterion": crit, "ours": why + ". Measured: " + lead + "; ".join(parts), "holds": holds,
            "per_seed": parts}
  holds = claims_lib.verdict(pooled_oks) if pooled_oks else "no"
  per = [claims_lib.verdict(v) for v in per_seed_oks.values() if v]
  holds = claims_lib.seeds_agree(holds, per)
  out = {"id": cid, "criterion": crit, "ours": lead + "; ".join(parts), "holds": holds, "per_seed": parts}
  if short:
    out["short"] = short
  return out




def _compare_at_top(cells, norm: str, others, passes, tags: tuple[str, str]):
  """``(oks, per_seed, parts)`` of ``norm`` against each of ``others``, every T/P and seed listed.

  A pair passes where every difference ``x`` that :func:`paired` judges (``norm`` minus the other;
  the final ones on both window sets, or the best-of-curve one where a final checkpoint overfit)
  satisfies ``passes(x, ref)``, ``ref`` the other's loss on the same windows; only the largest T/P is
  judged (``oks``, and per seed), and its parts carry ``tags`` (pass, fail).
  """
  tpps = tpps_of(cells)
  hi = tpps[-1] if tpps else None
  oks, per, parts = [], {}, []
  for t in tpps:
    for s in seeds_of(cells):
      for other in others:
        p = paired(cells, norm, other, t, s)
        ok = p is not None and all(passes(x, ref) for x, ref in p["pairs"])
        tag = ""
        if t == hi:
          oks.append(ok)
          per.setdefault(s, []).append(ok)
          tag = f" [{tags[0] if ok else tags[1]}]"
        parts.append(f"T/P {t:g} s{s} {NAMES[norm]}-{NAMES[other]} {fmt_pair(p)}{tag}")
  return oks, per, parts


def zhu_dyt_matches_norm(cells, *, epochs, unigram) -> dict:
  crit = (f"at the largest T/P, per seed: DyT matches a reference (LN, RMS) if |val(DyT) - val(ref)| <= {REL:z.0%} of "
          "val(ref) on each set of validation windows (the best-of-curve losses where a final checkpoint overfit); "
          "yes = both references in every seed, partly = some, no = none; needs T3, T4 and >= 3 seeds; judged at "
          "this scale, the papers' regime stated in the row")
  oks, per, parts = _compare_at_top(
      cells, "dyt", REFS, lambda x, ref: abs(x) <= REL * ref, ("ok", "differs"))
  return _finish("zhu_dyt_matches_norm", crit, oks, per, parts,
                 testability(cells, epochs=epochs, unigram=unigram, need=("T3", "T4"),
                             norms=("layer_norm", "rms_norm", "dyt")),
                 lead=regime(cells, epochs),
                 short=f"{regime(cells, epochs, compact=True)}: {top_short(cells, 'dyt', REFS)}")


def zhu_alpha_width(best_alpha: dict) -> dict:
  """``best_alpha``: width -> (attention, other) alpha_0 with the lowest loss (empty: one width only)."""
  crit = ("needs >= 2 widths: yes if the best alpha_0 never increases with the width (both roles), no if it never "
          "decreases, partly otherwise")
  widths = sorted(best_alpha)
  if len(widths) < 2:
    holds, why = claims_lib.not_testable([f"the study trains one width ({widths[0] if widths else 64}); the claim "
                                          "is about how alpha_0 moves with the width (Zhu et al. tabulate 1024-8192)"])
    return {"id": "zhu_alpha_width", "criterion": crit, "ours": why, "holds": holds}
  steps = [(best_alpha[a][k], best_alpha[b][k]) for a, b in zip(widths, widths[1:]) for k in (0, 1)]
  down = [y <= x for x, y in steps]
  up = [y >= x for x, y in steps]
  holds = "yes" if all(down) and not all(up) else ("no" if all(up) else "partly")
  ours = "; ".join(f"width {w}: {best_alpha[w]}" for w in widths)
  return {"id": "zhu_alpha_width", "criterion": crit, "ours": ours, "holds": holds}


def derf_beats_all(cells, *, epochs, unigram) -> dict:
  crit = (f"at the largest T/P, per seed: Derf beats a competitor (LN, RMS, DyT) if val(Derf) - val(other) "
          f"<= -{REL:z.0%} of val(other) on each set of validation windows (the best-of-curve losses where a final "
          "checkpoint overfit); yes = all three in every seed, partly = some, no = none; needs T3, T4; judged at this "
          "scale, the papers' regime stated in the row")
  oks, per, parts = _compare_at_top(
      cells, "derf", ("layer_norm", "rms_norm", "dyt"), lambda x, other: x <= -REL * other, ("beats", "does not"))
  return _finish("derf_beats_all", crit, oks, per, parts,
                 testability(cells, epochs=epochs, unigram=unigram, need=("T3", "T4")),
                 lead=regime(cells, epochs), short=f"{regime(cells, epochs, compact=True)}: "
                 + nearest_cut(cells, "derf", ("layer_norm", "rms_norm", "dyt")).lstrip("; ") + "; "
                 + top_short(cells, "derf", ("layer_norm", "rms_norm", "dyt")))




def derf_gain(cells, tpp, seed) -> tuple[bool, str]:
  """Whether Derf has a gain over both norms in a seed (what ``derf_beats_all`` calls beating: at least
  ``REL`` below LN and below RMS on each set of windows), and the text of its relative differences."""
  ok, texts = True, []
  for ref in REFS:
    p = paired(cells, "derf", ref, tpp, seed)
    ok = ok and p is not None and all(x <= -REL * r for x, r in p["pairs"])
    texts.append(f"vs {NAMES[ref]} {fmt_pair(p, rel=True)}")
  return ok, ", ".join(texts)


def derf_generalization(cells, *, epochs, unigram) -> dict:
  crit = (f"judged at the largest T/P in a seed only where Derf has a gain to explain: its validation loss at least "
          f"{REL:z.0%} below both LN's and RMS's on each set of windows (as derf_beats_all counts a win); there, Table "
          f"13's order of the training loss (final model on its training bytes): LN < Derf, RMS < Derf, Derf < DyT, "
          f"each by > {ORDER_NATS:g} nats; yes = all three in every judged seed, partly = some, no = none; "
          "n/a where no seed has the gain (nothing to explain); the gaps val - train are shown; needs T3, T4; judged "
          "at this scale, the papers' regime stated in the row")
  tpps = tpps_of(cells)
  oks, per, parts, gains = [], {}, [], []
  if tpps:
    hi = tpps[-1]
    for s in seeds_of(cells):
      c = {n: cells.get((n, hi, s)) for n in ("layer_norm", "rms_norm", "dyt", "derf")}
      tr = {n: as_float(x.get("train")) if usable(x) else float("nan") for n, x in c.items()}
      gain, gain_text = derf_gain(cells, hi, s)
      gains.append(gain)
      text = (f"T/P {hi:g} s{s} Derf's validation loss {gain_text}; train "
              + ", ".join(f"{NAMES[n]} {v:z.3f}" for n, v in tr.items())
              + "; gap " + ", ".join(f"{NAMES[n]} {gap(x):+z.3f}" for n, x in c.items() if x))
      if not gain:
        parts.append(text + " [not judged: no gain over the norms]")
        continue
      for a, b in (("layer_norm", "derf"), ("rms_norm", "derf"), ("derf", "dyt")):
        ok = tr[b] - tr[a] > ORDER_NATS
        oks.append(ok)
        per.setdefault(s, []).append(ok)
      parts.append(text)
  untestable = testability(cells, epochs=epochs, unigram=unigram, need=("T3", "T4"))
  lead = regime(cells, epochs)
  if tpps and not any(gains) and not untestable:
    why = (f"n/a: Derf has no gain over the norms to explain at T/P {tpps[-1]:g} in any seed (its validation loss is "
           f"not {REL:z.0%} below both LN's and RMS's)")
    return {"id": "derf_generalization", "criterion": crit, "holds": "n/a", "per_seed": parts,
            "ours": f"{why}; {lead}. Measured: " + "; ".join(parts),
            "short": f"n/a, no gain to explain: {top_short(cells, 'derf', REFS)}"}
  return _finish("derf_generalization", crit, oks, per, parts, untestable, lead=lead)


def _regime_sign(cid, other, cells, *, epochs, unigram) -> dict:
  crit = (f"{NAMES[other]} against LN, per seed, relative difference (val - val(LN)) / val(LN) on each set of "
          f"validation windows, each over its own LN loss: helps at the smallest T/P if <= -{REL:z.0%}, hurts at the "
          f"largest if >= +{REL:z.0%}; where a final checkpoint has overfit (final > best of its curve + "
          f"{OVERFIT_FINAL_NATS:g} nats) the best point of each curve is compared instead (which norm is better, not "
          "which overfits more slowly; the final ones are shown); yes = both in every seed, partly = one of them in "
          "some seed, no = neither; needs T1, T2, T4")
  tpps, parts, oks, per = tpps_of(cells), [], [], {}
  if tpps:
    lo, hi = tpps[0], tpps[-1]
    for s in seeds_of(cells):
      for t in tpps:
        row = []
        for ref in REFS:
          p = paired(cells, other, ref, t, s)
          rel = None if p is None else [x / r for x, r in p["pairs"]]
          tag = ""
          if ref == "layer_norm" and t in (lo, hi) and lo != hi:
            ok = rel is not None and (all(x <= -REL for x in rel) if t == lo else all(x >= REL for x in rel))
            oks.append(ok)
            per.setdefault(s, []).append(ok)
            tag = (" [helps]" if ok else " [does not help]") if t == lo else (" [hurts]" if ok else " [does not hurt]")
          row.append(f"vs {NAMES[ref]} {fmt_pair(p, rel=True)}{tag}")
        parts.append(f"T/P {t:g} s{s}: " + ", ".join(row))
  untestable = testability(cells, epochs=epochs, unigram=unigram, need=("T1", "T2", "T4"),
                           norms=("layer_norm", other))
  return _finish(cid, crit, oks, per, parts, untestable)


def verma_regime_sign(cells, *, epochs, unigram) -> dict:
  return _regime_sign("verma_regime_sign", "dyt", cells, epochs=epochs, unigram=unigram)


def verma_hardtanh(cells, *, epochs, unigram) -> dict:
  if not any(n == "hardtanh" for (n, _, _) in cells):
    crit = "the regime-sign rule applied to HardTanh runs; this study trains none"
    holds, why = claims_lib.not_testable(["the study trains no HardTanh model (jaxnorm has no HardTanh op; the "
                                          "budget of cpu-extra leaves no room for a fifth norm)"])
    return {"id": "verma_hardtanh", "criterion": crit, "ours": why, "holds": holds}
  return _regime_sign("verma_hardtanh", "hardtanh", cells, epochs=epochs, unigram=unigram)


def verma_saturation(cells, *, epochs, unigram) -> dict:
  crit = (f"DyT, per seed: the saturated fraction (|alpha x| > 2, mean over the DyT layers, final model on its "
          f"training bytes) at the smallest T/P minus at the largest >= {SAT_DIFF:g}; yes = every seed, partly = some, "
          "no = none; "
          "needs T1, T4")
  tpps, parts, oks, per = tpps_of(cells), [], [], {}
  if tpps:
    lo, hi = tpps[0], tpps[-1]
    for s in seeds_of(cells):
      sat = {t: (mean_saturation(cells[("dyt", t, s)].get("saturation")) if usable(cells.get(("dyt", t, s)))
                 else float("nan")) for t in tpps}
      ok = lo != hi and sat[lo] - sat[hi] >= SAT_DIFF
      oks.append(ok)
      per.setdefault(s, []).append(ok)
      parts.append(f"s{s}: " + ", ".join(f"T/P {t:g} {v:z.1%}" for t, v in sat.items())
                   + (" [ok]" if ok else " [fails]"))
  return _finish("verma_saturation", crit, oks, per, parts,
                 testability(cells, epochs=epochs, unigram=unigram, need=("T1", "T4"), norms=("dyt",)))


def verma_regularizer(cells, *, epochs, unigram) -> dict:
  crit = (f"at the smallest T/P, per seed: DyT's gap (val - train) below LN's by >= {GAP_NATS:g} nats and DyT's "
          "training loss above LN's (fits worse, generalizes better; a lower training loss would be 'optimizes "
          f"better'), and DyT the better model: its validation loss >= {REL:z.0%} below LN's (the best point of each "
          "curve where a final checkpoint overfit, as the regime-sign rule compares them; a smaller final gap alone "
          "is slower overfitting); yes = every seed, partly = some, no = none; needs T1, T2, T4")
  tpps, parts, oks, per = tpps_of(cells), [], [], {}
  if tpps:
    lo = tpps[0]
    for s in seeds_of(cells):
      cd, cl = cells.get(("dyt", lo, s)), cells.get(("layer_norm", lo, s))
      if not (usable(cd) and usable(cl)):
        oks.append(False)
        per.setdefault(s, []).append(False)
        parts.append(f"T/P {lo:g} s{s}: missing")
        continue
      gd, gl = gap(cd), gap(cl)
      p = paired(cells, "dyt", "layer_norm", lo, s)
      better = p is not None and all(x <= -REL * r for x, r in p["pairs"])
      ok = gd <= gl - GAP_NATS and as_float(cd["train"]) > as_float(cl["train"]) and better
      oks.append(ok)
      per.setdefault(s, []).append(ok)
      parts.append(f"T/P {lo:g} s{s}: gap DyT {gd:+z.3f} LN {gl:+z.3f}, train DyT {as_float(cd['train']):z.3f} LN "
                   f"{as_float(cl['train']):z.3f}, val vs LN {fmt_pair(p, rel=True)}"
                   + (" [regularizes]" if ok else " [does not: not the better model]" if not better else " [does not]"))
  return _finish("verma_regularizer", crit, oks, per, parts,
                 testability(cells, epochs=epochs, unigram=unigram, need=("T1", "T2", "T4"),
                             norms=("layer_norm", "dyt")))


def claims(cells: dict, *, epochs: dict, unigram: float, best_alpha: dict | None = None) -> list[dict]:
  """Every claim of the study from ``cells`` ``{(norm, tpp, seed): {"val", "val_alt", "train",
  "saturation", "diverged"}}``, ``epochs`` (T/P -> passes over the unique bytes) and ``unigram`` (the
  validation windows' plateau)."""
  kw = {"epochs": epochs, "unigram": unigram}
  return [zhu_dyt_matches_norm(cells, **kw), zhu_alpha_width(best_alpha or {}), derf_beats_all(cells, **kw),
          derf_generalization(cells, **kw), verma_regime_sign(cells, **kw), verma_saturation(cells, **kw),
          verma_regularizer(cells, **kw), verma_hardtanh(cells, **kw)]
