"""The scale study's rules (issues 50 and 55): every verdict reachable on synthetic runs, the best-tuned rate,
the sign change, the noise, and the answer's bold line only where every seed agrees at measured best rates.

Pure Python on synthetic dicts (no training): ``experiments.studies.scale_rules`` and ``scale_answer``.
"""

from __future__ import annotations

import pytest

from experiments.studies import scale_answer, scale_rules
from experiments.suite import claims as claims_lib

U = 3.0
SEEDS = (0, 1, 2)
LADDER = (100, 200, 400)
EVALS = (50, 100, 150, 200, 300, 400)


def _run(curve: dict, diverged_at=None) -> dict:
  vc = [(s, v) for s, v in sorted(curve.items()) if diverged_at is None or s < diverged_at]
  return {"val_curve": vc, "val_curve_alt": [(s, v + 0.01) for s, v in vc if s in LADDER],
          "diverged_at": diverged_at}


def _runs(pre: dict, post: dict, seq: int = 32) -> dict:
  """``pre``/``post``: ``{lr: f(step, seed) -> loss}``; every eval step of every seed."""
  out = {}
  for pos, table in (("pre", pre), ("post", post)):
    for lr, f in table.items():
      for s in SEEDS:
        out[(seq, pos, lr, s)] = _run({t: f(t, s) for t in EVALS})
  return out


def _table(runs, seq=32):
  return scale_rules.ladder_table(runs, seq, LADDER, SEEDS, U)


def _claim(tables: dict, n_seeds=3, cid="scale_preln_lead_lasts"):
  tpp = {seq: {t: t / 1000 for t in LADDER} for seq in tables}
  return {c["id"]: c for c in scale_rules.claims(tables, tpp, n_seeds)}[cid]


def lead(d):  # Post-LN's loss offset by d(step): Pre - Post = -d
  return lambda t, s: 2.0 + d(t) + 0.001 * s


PRE = {1e-3: lambda t, s: 2.0 + 0.001 * s}


@pytest.mark.parametrize("d, want", [
    (lambda t: 0.2, "yes"),                              # Pre-LN ahead everywhere
    (lambda t: -0.2 if t >= 400 else 0.2, "no"),         # Post-LN ahead at the longest
    (lambda t: 0.0 if t >= 400 else 0.2, "partly"),      # the lead melts into the margin
])
def test_lead_lasts_every_verdict(d, want):
  runs = _runs(PRE, {1e-3: lead(d)})
  assert _claim({32: _table(runs)})["holds"] == want


def test_lead_lasts_not_testable_by_design_only():
  runs = _runs(PRE, {1e-3: lead(lambda t: 0.2)})
  c = _claim({32: _table(runs)}, n_seeds=2)
  assert c["holds"] == claims_lib.NOT_TESTABLE and "seeds" in c["ours"]
  short = {t: t / 1000 for t in (100, 200)}
  table = scale_rules.ladder_table(runs, 32, (100, 200), SEEDS, U)
  c = {c["id"]: c for c in scale_rules.claims({32: table}, {32: short}, 3)}["scale_preln_lead_lasts"]
  assert c["holds"] == claims_lib.NOT_TESTABLE and "ladder" in c["ours"]


def test_best_rate_is_chosen_per_point_and_failures_count_at_the_plateau():
  post = {1e-3: lead(lambda t: 0.3), 3e-3: lead(lambda t: 0.4 if t < 300 else 0.1)}
  runs = _runs(PRE, post)
  runs[(32, "post", 3e-3, 1)]["diverged_at"] = 10_000   # diverged after the run: no effect
  table = _table(runs)
  assert [r["lr"]["post"] for r in table] == [1e-3, 1e-3, 3e-3]
  assert [r["n_rates"]["post"] for r in table] == [2, 2, 2]
  runs[(32, "post", 3e-3, 0)]["diverged_at"] = 250      # counts at the plateau from step 250 on
  table = _table(runs)
  assert table[-1]["lr"]["post"] == 1e-3
  v, f = scale_rules.value_at(runs[(32, "post", 3e-3, 0)], 400, U)
  assert (v, f) == (U, "diverged")


def test_noise_and_crossing_and_slope():
  runs = _runs(PRE, {1e-3: lead(lambda t: 0.2 - t / 1000)})  # Pre - Post = t/1000 - 0.2: crosses after 200
  table = _table(runs)
  assert scale_rules.noise(table)["max"] == pytest.approx(0.0, abs=1e-9)
  assert scale_rules.crossing(runs, 32, table, SEEDS, U) == [300, 300, 300]
  slope = scale_rules.slope_per_doubling(table, {t: t / 1000 for t in LADDER})
  assert slope > 0
  flat = _runs(PRE, {1e-3: lead(lambda t: 0.2)})
  assert scale_rules.crossing(flat, 32, _table(flat), SEEDS, U) == [None, None, None]


@pytest.mark.parametrize("d32, d256, want", [
    (lambda t: 0.2, lambda t: 0.2, "yes"),
    (lambda t: 0.2, lambda t: -0.2, "no"),
    (lambda t: 0.2, lambda t: 0.0, "partly"),
])
def test_seq_len_same_sign_every_verdict(d32, d256, want):
  tables = {32: _table(_runs(PRE, {1e-3: lead(d32)}, 32), 32),
            256: _table(_runs(PRE, {1e-3: lead(d256)}, 256), 256)}
  assert _claim(tables, cid="scale_seq_len_same_sign")["holds"] == want


def test_seq_len_claim_na_with_one_length_and_not_testable_with_two_seeds():
  t32 = _table(_runs(PRE, {1e-3: lead(lambda t: 0.2)}))
  assert _claim({32: t32}, cid="scale_seq_len_same_sign")["holds"] == "n/a"
  tables = {32: t32, 256: _table(_runs(PRE, {1e-3: lead(lambda t: 0.2)}, 256), 256)}
  assert _claim(tables, n_seeds=2, cid="scale_seq_len_same_sign")["holds"] == claims_lib.NOT_TESTABLE


def _summary(post: dict, pre=PRE) -> dict:
  runs = _runs(pre, post)
  table = _table(runs)
  return {"tables": {"32": table}, "tpp": {"32": {str(t): t / 1000 for t in LADDER}}, "tokens_per_step": 512,
          "params": 512_000, "per_seq": {"32": {"crossing": scale_rules.crossing(runs, 32, table, SEEDS, U),
                                               "slope_per_doubling": 0.01,
                                               "still_falling": {"pre": 0.05, "post": 0.04}}}}


def test_answer_bold_only_with_two_measured_rates_per_layout():
  one = scale_answer.answer(_summary({1e-3: lead(lambda t: 0.2)}))
  assert one[0].startswith("Regime: 512,000 parameters,") and "still falling" in one[0]
  assert "**" not in one[1] and "Pre-LN and Post-LN: one rate, the pilots' choice for their longest runs" in one[1]
  pre2 = {**PRE, 3e-3: lambda t, s: 2.1}
  two = scale_answer.answer(_summary({1e-3: lead(lambda t: 0.2), 3e-3: lead(lambda t: 0.3)}, pre2))
  assert two[1].startswith("sequence 32, 100-400 steps") and "): **Pre-LN** leads at every length" in two[1]
  mixed = scale_answer.answer(_summary({1e-3: lead(lambda t: 0.0 if t >= 400 else 0.2),
                                        3e-3: lead(lambda t: 0.3)}, pre2))
  assert "**" not in mixed[1]
