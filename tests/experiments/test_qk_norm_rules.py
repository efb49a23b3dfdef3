"""The verdict rules of the QK-norm and LayerNorm-Scaling studies on synthetic numbers.

Each rule gives yes, partly, no and "not testable" on some input, and the measurements under
them (LR sensitivity, logit growth, the block-input profile) match hand-computed values.
"""

import math

import pytest

from experiments.studies import norm_scaling_rules as ns
from experiments.studies import qk_norm_rules as qk
from experiments.suite import claims as claims_lib

NT = claims_lib.NOT_TESTABLE


def test_lr_sensitivity_caps_diverged_runs_at_the_initial_loss():
  # finals 2.0, 2.5, diverged (-> l0 = 5.5), 7.0 (capped at 5.5): mean 3.875, best 2.0.
  assert qk.lr_sensitivity([2.0, 2.5, None, 7.0], 5.5) == pytest.approx(3.875 - 2.0)
  assert qk.lr_sensitivity([3.0, float("nan")], 5.0) == pytest.approx(1.0)
  assert qk.lr_sensitivity([2.0, 2.0], 5.0) == 0.0


def test_logit_growth():
  g = qk.logit_growth([(1, [2.0, 3.0]), (2, [10.0, float("nan")]), (3, [30.0, 5.0])])
  assert g == {"first": 3.0, "peak": 30.0, "growth": 10.0}
  assert math.isnan(qk.logit_growth([])["peak"])


def _g(peak, growth):
  return {"first": peak / growth, "peak": peak, "growth": growth}


GROWS, FLAT = _g(200.0, 40.0), _g(8.0, 2.0)


@pytest.mark.parametrize("seeds, want", [
    ({0: {"noqk": GROWS, "qk": FLAT}, 1: {"noqk": GROWS, "qk": FLAT}}, "yes"),
    ({0: {"noqk": GROWS, "qk": FLAT}, 1: {"noqk": GROWS, "qk": _g(100.0, 30.0)}}, "partly"),
    ({0: {"noqk": GROWS, "qk": _g(50.0, 5.0)}}, "no"),              # peak not 10x lower
    ({0: {"noqk": _g(15.0, 20.0), "qk": FLAT}}, "no"),              # no growth: the claim's first half fails
    ({0: {"noqk": _g(60.0, 3.0), "qk": FLAT}, 1: {"noqk": GROWS, "qk": FLAT}}, "partly"),
    ({}, NT),                                                         # no seed ran
])
def test_claim_logit_growth(seeds, want):
  """Issue 50: the logit growth is the claim's first half, not a condition of the design: a seed without it
  fails (it was not judged)."""
  c = qk.claim_logit_growth(seeds)
  assert c["holds"] == want and c["id"] == "wortsman_qk_removes_logit_growth"
  if seeds and seeds[0]["noqk"]["peak"] < qk.MIN_PEAK_LOGIT:
    assert "[fails: no logit growth without QK-norm]" in c["ours"]
  assert c["ours"].startswith("not testable at this scale: ") is (want == NT)
  assert (qk.NEEDS in c["ours"]) is (want == NT)


def test_logit_growth_judged_on_the_peaks_with_and_without_qk_norm():
  """Issue 44: the committed cpu-extra seeds: with QK-norm the peak is 27-42 (a growth of 8-12x from a first logit
  near 3.5), without it 6e4-1e5. The peaks show the removal; the QK-norm run's own growth ratio is not judged."""
  seeds = {0: {"noqk": _g(1.05e5, 2.08e4), "qk": _g(42.1, 12.1)}, 1: {"noqk": _g(7.33e4, 1.32e4), "qk": _g(42.1, 11.7)},
           2: {"noqk": _g(5.98e4, 1.12e4), "qk": _g(27.3, 7.73)}}
  c = qk.claim_logit_growth(seeds)
  assert c["holds"] == "yes", c["ours"]
  assert c["ours"].count("[ok]") == 3 and "x lower with QK-norm" in c["ours"]


def _sens(noqk, qk_, top=GROWS):
  """A seed's LR-sensitivity inputs over a four-rate grid (init loss 9)."""
  return dict(finals_noqk=list(noqk), finals_qk=list(qk_), init=9.0, noqk_top=top)


SENSITIVE, CALM = (2.0, 2.0, 3.5, 3.5), (2.0, 2.0, 2.05, 2.05)      # LRS 0.75 and 0.025


@pytest.mark.parametrize("seeds, want", [
    ({0: _sens(SENSITIVE, CALM), 1: _sens(SENSITIVE, CALM)}, "yes"),
    ({0: _sens(SENSITIVE, CALM), 1: _sens(SENSITIVE, (2.0, 2.0, 3.4, 3.4))}, "partly"),
    ({0: _sens((2.0, 2.0, 2.05, 2.1), CALM)}, "no"),                 # little sensitivity: a measured null, judged
    ({0: _sens(SENSITIVE, CALM, top=FLAT)}, NT),                     # logit growth not reproduced
    ({0: _sens(SENSITIVE, (2.0, 2.0, 3.4, 3.4))}, "no"),
    ({0: _sens((2.0, 2.0, 2.0, 4.0), CALM)}, "no"),   # the seed's effect rests on one rate: it fails (issue 63)
])
def test_claim_lr_sensitivity(seeds, want):
  """Issue 50: no condition reads the losses the claim judges (the former 'sensitivity >= 0.05' and 'a loss-level
  instability avoided' conditions made a null and a one-seed effect 'not testable')."""
  c = qk.claim_lr_sensitivity(seeds)
  assert c["holds"] == want, c["ours"]
  if seeds[0]["finals_noqk"] == [2.0, 2.0, 2.0, 4.0]:
    assert "[fails: the effect rests on one rate, rate #3" in c["ours"]


def test_lr_sensitivity_reports_a_one_seed_effect_and_nulls_as_they_are():
  """The committed cpu-extra seeds 10-12 (issue 50): seed 10's 0.707 -> 0.296 rests on its one divergence at lr
  0.3 (without that rate 0.199 vs 0.211), so since issue 63 it fails and says why; seeds 11 and 12 are nulls.
  Each grid is capped at its own model's initial loss, as the report's table (one number: 0.707, not 0.726)."""
  lrs = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
  seeds = {10: dict(finals_noqk=[2.792, 2.524, 2.398, 2.506, 2.765, None], init_noqk=5.646,
                    finals_qk=[2.805, 2.518, 2.353, 2.395, 2.747, 3.074], init_qk=5.757, noqk_top=GROWS, lrs=lrs),
           11: dict(finals_noqk=[2.794, 2.506, 2.360, 2.491, 2.734, 3.066], init_noqk=5.762,
                    finals_qk=[2.786, 2.504, 2.337, 2.368, 2.692, 3.053], init_qk=5.753, noqk_top=GROWS, lrs=lrs)}
  c = qk.claim_lr_sensitivity(seeds)
  assert c["holds"] == "no" and "[fails: a null]" in c["ours"]
  s10 = c["per_seed"][0]
  assert _nums(s10)[:2] == pytest.approx([0.707, 0.296], abs=1.5e-3)
  assert "rests on one rate, lr 0.3 (the run without QK-norm diverged there)" in s10
  assert c["short"].startswith("an effect in 0 of 2 judged seeds, one resting on a single rate in 1 (s10 rests "
                               "on lr 0.3")
  assert qk.lr_sensitivity(seeds[10]["finals_noqk"], 5.646) == pytest.approx(_nums(s10)[0], abs=5e-4)


def _nums(text):
  import re
  return [float(x) for x in re.findall(r"[+-]?\d+\.\d+", text)]


def test_init_loss_is_one_per_grid():
  assert qk.init_loss([5.6, 5.6, None, float("nan")]) == 5.6
  assert math.isnan(qk.init_loss([None]))


def test_a_diverged_qk_norm_run_is_never_judged_as_finished():
  c = qk.claim_logit_growth({0: {"noqk": GROWS, "qk": FLAT, "qk_diverged_at": 8}})
  assert c["holds"] == "no" and "diverged at step 8" in c["ours"]


def test_level_off_says_where_the_peak_came():
  shape = qk.level_off([1, 10, 20, 30, 40, 50, 60, 80], [1, 50, 60, 60, 59, 60, 58, 59])
  assert shape["peak_step"] == 20 and shape["late_ratio"] == pytest.approx(59 / 60)
  c = qk.claim_logit_growth({0: {"noqk": GROWS, "qk": FLAT, "noqk_shape": shape}})
  assert "at step 20; its last quarter keeps 98% of it" in c["ours"]


def test_post_ln_is_an_observation_that_states_the_loss():
  """Issue 50: the loss first (QK-norm lowered Post-LN's best loss in 3/3 committed seeds while its LRS rose)."""
  c = qk.claim_post_ln({0: dict(best_noqk=2.528, best_qk=2.431, lrs_noqk=0.264, lrs_qk=0.332, noqk_top=GROWS,
                                qk_top=FLAT),
                        1: dict(best_noqk=2.434, best_qk=2.357, lrs_noqk=0.333, lrs_qk=0.837, noqk_top=GROWS,
                                qk_top=FLAT)})
  assert c["holds"] == "obs" and c["ours"].startswith("s0: best final loss 2.528 without, 2.431 with QK-norm (-0.097)")
  assert c["short"].startswith("best final loss with minus without QK-norm -0.097 to -0.077 (2/2 lower)")


def test_block_input_profile():
  # Pre-LN, 2 layers: [x1, mid1, x2, mid2, final].
  assert ns.block_input_profile([1, 9, 2, 9, 4], "pre", 2) == [1.0, 2.0, 4.0]
  # Sandwich, 1 layer: [x1, attn, mid, mlp, final].
  assert ns.block_input_profile([1, 9, 9, 9, 3], "sandwich", 1) == [1.0, 3.0]
  assert ns.growth([2.0, 3.0, 8.0]) == 4.0
  with pytest.raises(ValueError, match="has 5 entries, got 4"):
    ns.block_input_profile([1, 2, 3, 4], "pre", 2)
  with pytest.raises(ValueError, match="norm_position"):
    ns.block_input_profile([1, 2, 3], "post", 1)


@pytest.mark.parametrize("per, want", [
    ({(0, "init"): dict(pre=10.0, lns=2.0, sandwich=30.0), (0, "trained"): dict(pre=20.0, lns=5.0, sandwich=4.0),
      (1, "trained"): dict(pre=20.0, lns=5.0, sandwich=4.0)}, ("yes", "yes")),
    ({(0, "trained"): dict(pre=20.0, lns=5.0, sandwich=4.0), (1, "trained"): dict(pre=20.0, lns=19.0, sandwich=19.0)},
     ("partly", "partly")),
    ({(0, "init"): dict(pre=10.0, lns=1.0, sandwich=1.0), (0, "trained"): dict(pre=10.0, lns=9.0, sandwich=12.0)},
     ("no", "no")),
    ({(0, "init"): dict(pre=10.0, lns=1.0, sandwich=1.0), (0, "trained"): dict(pre=1.5, lns=1.0, sandwich=1.0)},
     (NT, NT)),
])
def test_norm_scaling_claims(per, want):
  """Issue 32: judged after training only; the growths at init are shown as facts of construction."""
  got = ns.claims(per)
  assert [c["id"] for c in got] == ["sun_lns_curbs_variance", "kim_periln_balanced_variance"]
  assert tuple(c["holds"] for c in got) == want
  assert all(c["ours"].startswith("not testable at this scale: ") is (c["holds"] == NT) for c in got)
  if (0, "init") in per:
    assert all("by construction (not judged)" in c["ours"] for c in got)
