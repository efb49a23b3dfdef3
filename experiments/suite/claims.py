"""The claims the suite tests: statement, source with the exact place, and the published number.

Each experiment's summary carries ``claims``: a list of ``{"id", "criterion", "ours", "holds"}``
(optionally ``"short"``, ``"per_seed"``) whose ``id`` is a key of :data:`CLAIMS`; the report joins
both into its final table "claim - source - published number - our number - holds?". The verdict
criteria are written in the experiment modules, next to the measurement, and are the same for
every preset.

Verdicts: ``"yes"``, ``"no"``, ``"partly"`` (some of the configurations agree), ``"not testable"``
(the preset's design cannot test the claim: a condition of :attr:`Claim.testable_when` does not
hold; the report prints "not testable at this scale" with the reason, never a bold no), ``"n/a"``
(nothing was measured that the rule could judge, e.g. no depth with both layouts in ``smoke``),
``"obs"`` (an observation without a published counterpart). Every rule can give each of yes /
partly / no / not testable on some input (``tests/test_verdicts.py`` feeds each one synthetic
results for each verdict); where one of them cannot occur the criterion says why.

**Testability before verdicts.** Every claim states, in :attr:`Claim.testable_when`, the
conditions under which a preset's design can test it; they were written before the run whose
report uses them (issue 24) and each rule checks them before it judges anything. Every claim also
has a :attr:`Claim.kind`: ``"training"`` for a claim about how models behave (at init, in
training, in time) and ``"check"`` for a check of this implementation (a formula compared with
itself, an identity at eps = 0, the derived backward against autodiff); the report tallies the
two apart.

How the published numbers were checked (issue 17): a claim is ``checked=True`` only where the
number was read in a text found in this project, and ``checked_in`` names that text. Read here:
the abstracts of Zhang & Sennrich (arXiv:1910.07467: "reduces the running time by 7%~64%",
RMSNorm and pRMSNorm together) and of Xiong et al. (arXiv:2002.04745, the qualitative claims);
the invariance table of Zhang & Sennrich as reproduced in the authors' repository README
(github.com/bzhangGo/rmsnorm); the seed notes in ``shared/seeds`` (000: gradient derivation and
invariance, Sec. 3.1-3.3; 001: LayerNorm -> RMSNorm, Sec. 2 "about 10%-40%"). The papers' full
texts were not reachable here; the exact places and numbers below that come from them (Xiong et
al.'s lemmas, figures and BLEU scores, Zhang & Sennrich's 6.9%-40.8% for full RMSNorm) are the
ones the issue-17 reviewer checked against the full texts, and stay ``checked=False``.
"""

from __future__ import annotations

import dataclasses

__all__ = ["CLAIMS", "Claim", "KINDS", "NOT_TESTABLE", "VERDICTS", "not_testable", "seeds_agree", "verdict"]

NOT_TESTABLE = "not testable"
VERDICTS = ("yes", "no", "partly", NOT_TESTABLE, "n/a", "obs")
KINDS = ("training", "check")


def not_testable(reasons: list[str]) -> tuple[str, str]:
  """``("not testable", text)`` naming the conditions of the design that do not hold.

  Raises:
    ValueError: ``reasons`` is empty (a claim is untestable for a stated reason or not at all).
  """
  if not reasons:
    raise ValueError("not_testable needs at least one reason, got an empty list.")
  return NOT_TESTABLE, "not testable at this scale: " + "; ".join(reasons)


def verdict(oks) -> str:
  r"""``"yes"`` if every configuration agrees, ``"partly"`` if some do, else ``"no"``.

  .. math:: v = \text{yes if } \forall i\, ok_i;\ \text{partly if } \exists i\, ok_i;\ \text{no otherwise}

  An empty ``oks`` gives ``"yes"`` (as ``all([])``); callers for whom no judged configuration
  means "no" say so.
  """
  oks = list(oks)
  return "yes" if all(oks) else ("partly" if any(oks) else "no")


def seeds_agree(pooled: str, per_seed: list[str]) -> str:
  """A training claim's verdict given what every seed alone would give.

  ``"yes"`` needs the seeds to agree: a pooled ``"yes"`` with any seed alone not ``"yes"`` becomes
  ``"partly"``; other verdicts are kept.
  """
  if pooled == "yes" and any(v != "yes" for v in per_seed):
    return "partly"
  return pooled


@dataclasses.dataclass(frozen=True)
class Claim:
  """One published (or source-note) claim.

  Attributes:
    experiment: the experiment that measures it.
    statement: the claim in one sentence.
    source: paper (authors, year) and the exact figure/table/section/lemma it comes from.
    published: the published number or qualitative result.
    checked: whether the published number was read in a text found in this project.
    checked_in: that text (required when ``checked``); the report prints it beside the source.
    testable_when: the conditions under which a preset's design can test the claim, stated
      before anything runs; a rule that finds one of them unmet says ``"not testable"``.
    kind: ``"training"`` (a claim about models: at init, in training, in time) or ``"check"``
      (a check of this implementation); the report's tally keeps them apart.
  """

  experiment: str
  statement: str
  source: str
  published: str
  checked: bool = False
  checked_in: str = ""
  testable_when: str = ""
  kind: str = "training"

  def __post_init__(self):
    if not self.testable_when:
      raise ValueError(f"every claim states when the design can test it (testable_when), got {self!r}.")
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}.")
    if self.checked and not self.checked_in:
      raise ValueError(f"a checked claim must say where it was checked (checked_in), got {self!r}.")


XIONG = "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (ICML; arXiv:2002.04745)"
LIU = "Liu et al. 2020, Understanding the Difficulty of Training Transformers (EMNLP; arXiv:2004.08249)"
DEEPNET = "Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers (arXiv:2203.00555)"
ZHANG = "Zhang & Sennrich 2019, Root Mean Square Layer Normalization (NeurIPS; arXiv:1910.07467)"
BA = "Ba et al. 2016, Layer Normalization (arXiv:1607.06450)"
SEED_000 = "seed note 000 (shared/seeds: LayerNorm & RMSNorm gradient derivation)"
SEED_001 = "seed note 001 (shared/seeds: LayerNorm -> RMSNorm)"
WORTSMAN = ("Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training instabilities "
            "(arXiv:2309.14322)")
SUN = "Sun et al. 2025, The Curse of Depth in Large Language Models (arXiv:2502.05795)"
KIM = ("Kim et al. 2025, Peri-LN: Revisiting Normalization Layer in the Transformer Architecture "
       "(ICML; arXiv:2502.02732)")
ZHU = "Zhu et al. 2025, Transformers without Normalization (CVPR; arXiv:2503.10622, June 2025 revision)"
CHEN = "Chen et al. 2025, Derf (arXiv:2512.10938 v2)"
VERMA = ("Verma 2026, When Does Removing LayerNorm Help? Activation Bounding as a Regime-Dependent Implicit "
         "Regularizer (arXiv:2604.23434 v1)")
VERMA_READ = ("the abstract and the opening of the introduction (arxiv.org/html/2604.23434), and the authors' artifact "
              "(github.com/lucky-verma/dyt-composition-study: code/, results/activation_analysis.json, "
              "results/full/manifests/paper_sources.json); the paper's body was not reachable")
DYT_TESTABLE = ("T/P spans >= 1 decade (T1); LayerNorm overfits at the smallest T/P: its gap val - train exceeds its "
                "gap at the largest by >= 0.25 nats (T2); the largest T/P is seen <= 2 times (T3); no compared run "
                "diverged "
                "and the LN/RMS runs left the unigram plateau by >= 0.1 nats (T4); >= 3 seeds")
PROJECT = "this project"
ZHANG_README = "the invariance table as reproduced in the authors' README (github.com/bzhangGo/rmsnorm)"

CLAIMS: dict[str, Claim] = {
    # ---- 1. gradient norms at initialization
    "xiong_grad_growth": Claim(
        "grad_init",
        "At initialization Post-LN's per-layer gradient norm grows with the layer index (towards the output); "
        "Pre-LN's does not.",
        f"{XIONG}, Fig. 3(a)/(b) (per-layer gradient norm at init) and the extended theory of Sec. 3.3 "
        "(Theorem 1 itself bounds the last layer only)",
        "Post-LN grows towards the output layer; Pre-LN about flat (qualitative figure, no number)",
        testable_when=(
        "gradients at init (no training, so any width can test it) at >= 2 depths, one of them >= 12, "
        "with >= 2 seeds"),
        kind="training"),
    "xiong_grad_depth_scaling": Claim(
        "grad_init",
        "The last layer's gradient norm does not change with the depth L for Post-LN and decreases with L "
        "for Pre-LN.",
        f"{XIONG}, Fig. 3(c)/(d) (depth scaling); Theorem 1 (last layer only) gives upper bounds "
        "O(d sqrt(ln d)) for Post-LN and O(d sqrt(ln d / L)) for Pre-LN, not predicted slopes",
        "Post-LN: independent of L; Pre-LN: decreasing (bound ~ L^-1/2)",
        testable_when=(
        "gradients at init at >= 3 depths spanning at least a factor 4 (a log-log slope with a point to "
        "check its form), >= 2 seeds"),
        kind="training"),
    "xiong_lemma2_preln": Claim(
        "grad_init",
        "Pre-LN residual stream at init: (1 + l/2) d <= E||x_l||^2 <= (1 + 3l/2) d; per layer the FFN adds "
        "d/2 in expectation and attention between 0 and d, so the band is per whole layer.",
        f"{XIONG}, Lemma 2 (Pre-LN part; theory setting: ReLU, d_ff = d, W^Q = W^K = 0, unit-variance input)",
        "increment of E||x||^2/d per whole layer in [0.5, 1.5]",
        testable_when=(
        "the theory variant (ReLU, d_ff = d, W^Q = W^K = 0, unit-variance input) at >= 1 depth"),
        kind="training"),
    "xiong_lemma_postln": Claim(
        "grad_init",
        "Post-LN FFN norm inputs have E||x||^2/d = 3/2; attention norm inputs are bounded in [1, 2].",
        f"{XIONG}, Lemma 2 (Post-LN part: 3d/2) and its proof in App. C (attention norm input in [d, 2d]); "
        "Lemma 1 (E||ReLU(X)||^2 = sigma^2 d / 2) gives the FFN's d/2",
        "FFN: 3/2; attention: in [1, 2]",
        testable_when=(
        "the theory variant (ReLU, d_ff = d, W^Q = W^K = 0, unit-variance input) at >= 1 depth"),
        kind="training"),
    "init_changes_picture": Claim(
        "grad_init",
        "The Post-LN gradient growth at init depends on the initialization (Xiong's theory assumes Xavier).",
        f"{PROJECT} (issue: 'the init decides whether Post-LN is unstable at all')",
        "- (observation)", checked=True, checked_in="the project issue",
        testable_when=(
        "Xavier and the small init at the same depths and seeds"),
        kind="training"),
    # ---- 2. warm-up and learning rate
    "xiong_postln_needs_warmup": Claim(
        "warmup",
        "Post-LN trained with Adam without warm-up (T_warmup = 1) fails where it trains with warm-up "
        "and Pre-LN trains without.",
        f"{XIONG}, Sec. 3.2 and Fig. 2 (IWSLT14 De-En, Post-LN; 'no warm-up' there means T_warmup = 1)",
        "BLEU 8.45 without warm-up vs about 34 with T_warmup = 4000",
        testable_when=(
        "the longest warm-up is at most 1/5 of the run (a small fraction of training, as in the paper); "
        ">= 3 seeds, compared paired per seed (the same seed with and without warm-up); judged only at "
        "rates where Pre-LN without warm-up left the plateau within the first third of the run in every "
        "seed, and where no compared run (either side) left the plateau in the last third (a late start "
        "makes 'stalled at the end' fragile)"),
        kind="training"),
    "xiong_postln_lr_sensitive": Claim(
        "warmup",
        "Post-LN is sensitive to the peak learning rate: at a given warm-up a larger peak rate breaks it "
        "where a smaller one trains, and Pre-LN tolerates larger rates.",
        f"{XIONG}, Sec. 3.2 and Fig. 2 (IWSLT14 De-En; sensitive to T_warmup and to the peak rate)",
        "BLEU 31.16 at lr 5e-4 vs 2.77 at lr 1e-3 (Post-LN, T_warmup = 500)",
        testable_when=(
        ">= 3 seeds; at some warm-up, >= 2 judged rates (Pre-LN without warm-up left the plateau within "
        "the first third) at which no compared run, Post-LN or Pre-LN, left the plateau in the last third, "
        "and Post-LN trains in every seed at one of them"),
        kind="training"),
    "xiong_preln_no_warmup": Claim(
        "warmup",
        "Pre-LN trained without warm-up does as well as Post-LN trained with warm-up (the paper "
        "compares these two, not Pre-LN with and without warm-up).",
        f"{XIONG}, Sec. 4 and Fig. 4 (IWSLT14 De-En and WMT14 En-De; BERT is Fig. 5(a))",
        "Pre-LN without warm-up reaches BLEU comparable to Post-LN with warm-up",
        testable_when=(
        ">= 3 seeds, compared paired per seed; some judged rate (Pre-LN left the plateau within the first"
        " third) at which Post-LN with the longest warm-up trains in every seed and no compared run left "
        "the plateau in the last third"),
        kind="training"),
    "xiong_preln_faster": Claim(
        "warmup",
        "Pre-LN converges faster: it reaches Post-LN's validation loss in fewer updates.",
        f"{XIONG}, Sec. 4.2 (same peak rate) and Fig. 5(a) (BERT-base pre-training, Pre-LN with a 3x larger lr); the "
        "paper's sentence on Fig. 5(a) swaps Pre- and Post-LN (an evident typo: the figure shows Pre-LN faster), read "
        "here as the figure shows",
        "Fig. 5(a): val loss 1.69 at about 500k updates (Pre-LN) vs about 700k (Post-LN), the '40% speed-up' "
        "is 1.4x, i.e. about 29% fewer updates; Sec. 4.2: faster at the same rate",
        testable_when=(
        ">= 3 seeds; >= 4 evaluations per run; some judged rate at which Post-LN with the longest warm-up "
        "trains in every seed, no compared run left the plateau in the last third, and at least one layout "
        "reached the target (0.5 nats below the unigram plateau, fixed before the run) in some seed"),
        kind="training"),
    "warmup_variants": Claim(
        "warmup",
        "RMSNorm and GPT-2's small init at the grid's telling rate, beside LayerNorm with Xavier init.",
        f"{PROJECT} (the grid's telling rate; no published counterpart at this scale)",
        "- (observation)", checked=True, checked_in="the project issue",
        testable_when=(
        "the grid's rates include the observation's rate"),
        kind="training"),
    # ---- 3. depth
    "admin_deep_postln_fails": Claim(
        "depth",
        "Deep Post-LN fails to train (diverges or stalls) while Pre-LN trains.",
        f"{LIU}, the main BLEU table (Table 2 in the arXiv version per the issue-24 referee; WMT14 En-De; RAdam, 8000 "
        "warm-up steps, lr 1e-3, fp16)",
        "12L-12L and 18L-18L Post-LN fail (diverge); Pre-LN trains",
        testable_when=(
        ">= 3 seeds; a depth >= 12 and a shallowest depth <= 6 with Post-LN and Pre-LN; at the study's "
        "rate (fixed by pilots on other seeds) Post-LN trains at the shallowest depth in every seed (else "
        "the rate, not the depth, breaks it); the judged depth's Pre-LN ends >= 0.5 nats below the unigram "
        "plateau and left it within the first third; no compared run left the plateau in the last third"),
        kind="training"),
    "deepnet_update_constant": Claim(
        "depth",
        "Post-LN's model update ||F(x; theta_t) - F(x; theta_0)|| over the first steps grows with depth; "
        "DeepNorm's stays bounded, about constant in N.",
        f"{DEEPNET}, Fig. 5 (model update over early training at several depths); Fig. 4(a) shows the 18L-18L model "
        "only",
        "Post-LN update grows with depth (then stalls); DeepNorm bounded",
        testable_when=(
        ">= 3 depths spanning at least a factor 4 in the update probe, with Post-LN and DeepNorm; an "
        "early step at which Post-LN's relative update is below 1 at every depth"),
        kind="training"),
    "deepnet_constants": Claim(
        "depth",
        "DeepNorm constants for a decoder-only stack of N layers.",
        f"{DEEPNET}, Fig. 2(b) and Sec. 4.3 (decoder-only column; encoder-decoder differs)",
        "alpha = (2N)^(1/4), beta = (8N)^(-1/4)",
        testable_when=(
        "always (a formula compared with the constants the model uses)"),
        kind="check"),
    # ---- 4. invariance
    "notes_rms_scale_invariance": Claim(
        "invariance",
        "RMSNorm(a x) = RMSNorm(x) for every a > 0.",
        f"{SEED_000}, Sec. 3.1 (forward scale invariance)",
        "exact (ignoring epsilon)", checked=True, checked_in="seed note 000, Sec. 3.1",
        testable_when=(
        "always (an identity at eps = 0, checked in float32)"),
        kind="check"),
    "notes_rms_grad_invariance": Claim(
        "invariance",
        "The gradient of RMSNorm(a x) with respect to x does not depend on a.",
        f"{SEED_000}, Sec. 3.2 (backward gradient invariance)",
        "exact (ignoring epsilon)", checked=True, checked_in="seed note 000, Sec. 3.2",
        testable_when=(
        "always (an identity at eps = 0, checked in float32)"),
        kind="check"),
    "notes_ln_shift_invariance": Claim(
        "invariance",
        "LayerNorm(x + c) = LayerNorm(x) for a constant shift c; RMSNorm is not shift invariant.",
        f"{ZHANG}, Table 1 (invariance properties: LayerNorm is invariant to weight-matrix re-centering, "
        f"RMSNorm is not); {BA}, Table 1 (the same property for LayerNorm)",
        "exact for LayerNorm; RMSNorm not re-centering invariant", checked=True, checked_in=ZHANG_README,
        testable_when=(
        "always (an identity at eps = 0, checked in float32)"),
        kind="check"),
    "notes_grad_norms_close": Claim(
        "invariance",
        "Weight-gradient norms of LayerNorm and RMSNorm layers are close.",
        f"{SEED_000}, Sec. 3.3",
        "rms_w_gradient.norm() ~= ln_w_gradient.norm()", checked=True, checked_in="seed note 000, Sec. 3.3",
        testable_when=(
        "the op, a Pre-LN model at init and one in training, LN and RMS with the same seed"),
        kind="training"),
    # ---- 5. speed
    "zhang_rms_speedup": Claim(
        "speed",
        "RMSNorm reduces the running time of a model compared with LayerNorm.",
        f"{ZHANG}, abstract (7%-64%, RMSNorm and pRMSNorm together; read here) and the per-task result tables "
        "(full RMSNorm: 6.9% to 40.8%)",
        "full RMSNorm 6.9%-40.8% less running time (7%-64% including pRMSNorm)",
        testable_when=(
        "an accelerator backend (GPU or TPU: the paper timed GPUs) and >= 5 interleaved repeats of the "
        "training step"),
        kind="training"),
    "notes_rms_op_speedup": Claim(
        "speed",
        "RMSNorm is faster than LayerNorm as an op (on GPUs and similar hardware).",
        f"{SEED_001}, Sec. 2 ('about 10%-40%' on GPUs and similar hardware)",
        "10%-40%", checked=True, checked_in="seed note 001, Sec. 2 (advantages) and Sec. 3 (summary table)",
        testable_when=(
        "an accelerator backend (the notes say 'on GPUs and similar hardware') and >= 10 interleaved "
        "rounds per shape; jaxnorm's and Flax's ops both timed, so one implementation's slow op cannot "
        "decide it"),
        kind="training"),
    # ---- 6. custom VJP
    "vjp_matches_autodiff": Claim(
        "vjp",
        "Training with jaxnorm's hand-derived backward gives the same training as Flax's norms "
        "differentiated by autodiff.",
        f"{PROJECT} (the derived VJP in a real model, not only in unit tests)",
        "identical up to float rounding and its amplification by training", checked=True,
        checked_in="the project issue",
        testable_when=(
        "the same runs with both implementations and a chaos baseline (one-ulp input change) in the same "
        "invocation"),
        kind="check"),
    # ---- 7. QK-norm (issue 25)
    "wortsman_qk_removes_logit_growth": Claim(
        "qk_norm",
        "Attention logits grow without bound at high learning rates even in small models; qk-layernorm "
        "removes this growth.",
        f"{WORTSMAN}, Sec. 3.1.1, Fig. 1 (LR vs final loss with and without qk-layernorm) and Fig. 2 (max "
        "attention logit of layer 0 over training at two scales); text and captions read, figure images not seen",
        "logit growth 'appears in small models at high learning rates' (Fig. 2 caption); qk-layernorm 'enables "
        "stable training across three orders of magnitude' of LR (Sec. 3.1.1; qualitative, no numbers in the "
        "text)", checked=True,
        checked_in="the full text (ar5iv rendering of arXiv:2309.14322: Secs. 1-5, appendices, figure captions)",
        testable_when=(
        "in a seed, Pre-LN without QK-norm at the top rate grows its largest attention logit at least "
        "10x over training to at least 20 (the instability reproduced; qk_norm_rules, fixed before any "
        "run)")),
    "wortsman_qk_lr_sensitivity": Claim(
        "qk_norm",
        "qk-layernorm lowers the sensitivity of the final loss to the learning rate (LR sensitivity: the mean "
        "excess of the final loss over its best value across rates, losses capped at the initial loss).",
        f"{WORTSMAN}, Sec. 2.2 (the LR-sensitivity formula, over peak rates 3e-4 to 3e-1) and Sec. 3.1.1 / "
        "Fig. 1 bottom panel; text and captions read, figure images not seen",
        "'considerably lower LR sensitivity' with qk-layernorm (Sec. 3.1.1; the values are only in the figure, "
        "none in the text); 'LR sensitivity increases with scale' with and without it", checked=True,
        checked_in="the full text (ar5iv rendering of arXiv:2309.14322: Secs. 1-5, appendices, figure captions)",
        testable_when=(
        "in a seed, the logit-growth condition holds and Pre-LN's LR sensitivity without QK-norm is at "
        "least 0.05 nats over at least two decades of rates")),
    "qk_norm_post_ln": Claim(
        "qk_norm",
        "QK-norm in a Post-LN model, beside the Pre-LN runs: LR sensitivity and top-rate logits.",
        f"{PROJECT} (the issue asks for Post-LN beside Pre-LN; the paper studies Pre-LN)",
        "- (observation)", checked=True, checked_in="the project issue",
        testable_when="an observation beside the Pre-LN runs (no verdict)"),
    # ---- 8. LayerNorm Scaling and Peri-LN (issue 25)
    "sun_lns_curbs_variance": Claim(
        "norm_scaling",
        "Pre-LN's hidden-state variance grows with depth; LayerNorm Scaling (norm outputs times 1/sqrt(l)) "
        "curbs that growth.",
        f"{SUN}, abstract (read here; no figure or table read)",
        "Pre-LN output variance grows exponentially with depth; LNS mitigates the explosion (qualitative)",
        checked=True, checked_in="the abstract",
        testable_when="Pre-LN's residual mean square grows at least 2x from the first block to the last "
        "(per phase: at init, after training)"),
    "kim_periln_balanced_variance": Claim(
        "norm_scaling",
        "Peri-LN (norms around each sub-layer: this project's sandwich) has more balanced hidden-state "
        "variance growth than Pre-LN.",
        f"{KIM}, abstract (read here; no figure or table read)",
        "'consistently achieves more balanced variance growth' (qualitative)", checked=True,
        checked_in="the abstract",
        testable_when="Pre-LN's residual mean square grows at least 2x from the first block to the last "
        "(per phase: at init, after training)"),
    # ---- 9. DyT and Derf across tokens per parameter (issue 36)
    "zhu_dyt_matches_norm": Claim(
        "dyt",
        "DyT matches LayerNorm/RMSNorm in Transformers without tuning beyond alpha's initialization.",
        f"{ZHU}, abstract; LLaMA runs Sec. 5 (alpha_0 guidance Sec. 7.2)",
        "on par with the normalized models across tasks, LLaMA included (qualitative here: no table number was "
        "carried over from the full text)",
        checked=True, checked_in="the full text, read by another reader of this project (issue 36)",
        testable_when="judged at the largest T/P: " + DYT_TESTABLE.split("; ", 2)[2]),
    "zhu_alpha_width": Claim(
        "dyt",
        "For LLMs alpha_0 must be tuned with the width (smaller for wider models).",
        f"{ZHU}, Sec. 7.2, Tables 10-11",
        "attention/other alpha_0 1.0/1.0 at width 1024, 1.0/0.5 at 2048, 0.8/0.2 at 4096, 0.2/0.05 at 8192",
        checked=True, checked_in="the full text, read by another reader of this project (issue 36)",
        testable_when="two or more widths, each with several alpha_0 trained"),
    "derf_beats_all": Claim(
        "dyt",
        "Derf, erf(alpha x + s), beats LayerNorm, RMSNorm and DyT.",
        f"{CHEN}, abstract; GPT-2 124M on OpenWebText, Table 12",
        "validation loss LN 2.94, DyT 2.97, Derf 2.94, RMSNorm 2.95 (GPT-2: a tie with LN)",
        checked=True, checked_in="the full text, read by another reader of this project (issue 36)",
        testable_when="judged at the largest T/P: " + DYT_TESTABLE.split("; ", 2)[2]),
    "derf_generalization": Claim(
        "dyt",
        "Derf's gain comes from generalization, not fitting: its training loss lies between the norms' and DyT's.",
        f"{CHEN}, Sec. 6.1, Table 13",
        "evaluation-mode training loss Norm < Derf < DyT",
        checked=True, checked_in="the full text, read by another reader of this project (issue 36)",
        testable_when="judged at the largest T/P: " + DYT_TESTABLE.split("; ", 2)[2]),
    "verma_regime_sign": Claim(
        "dyt",
        "DyT's effect on validation loss changes sign with the data per parameter: it helps when unique data are "
        "scarce and hurts with more.",
        f"{VERMA}, abstract; the artifact's tab:phase / tab:scaling sources",
        "64M: -27.3% at 1M tokens (T/P 0.016), +5.9% at 10M, +18.8% at 118M (T/P 1.84); vanilla/DyT 9.384/6.819 "
        "at 1M, 3.631/4.313 at 118M",
        checked=True, checked_in=VERMA_READ, testable_when=DYT_TESTABLE),
    "verma_saturation": Claim(
        "dyt",
        "The mechanism is saturation: more DyT activations saturate when data are scarce.",
        f"{VERMA}, abstract; the artifact's results/activation_analysis.json",
        "49% of DyT activations saturated (|alpha x| > 2) at 1M tokens vs 23% at 118M",
        checked=True, checked_in=VERMA_READ, testable_when=DYT_TESTABLE),
    "verma_regularizer": Claim(
        "dyt",
        "DyT acts as an implicit regularizer where data are scarce: a smaller train/validation gap, not better "
        "optimization.",
        f"{VERMA}, title and abstract",
        "'a regime-dependent implicit regularizer' (qualitative; the artifact extracts train/val gaps)",
        checked=True, checked_in=VERMA_READ, testable_when=DYT_TESTABLE),
    "verma_hardtanh": Claim(
        "dyt",
        "HardTanh (hard clipping) reproduces DyT's regime pattern.",
        f"{VERMA}, abstract; the artifact's tab:hardtanh source",
        "64M HardTanh validation loss 6.246 / 4.660 / 4.562 at 1M / 10M / 118M (vanilla 9.384 / 4.260 / 3.631)",
        checked=True, checked_in=VERMA_READ, testable_when="HardTanh runs at every T/P; " + DYT_TESTABLE),
}
