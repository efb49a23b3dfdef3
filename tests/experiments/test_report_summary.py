"""The report's summary pieces on synthetic summaries: instabilities, the tally by kind, rule changes."""

from __future__ import annotations

import re
import statistics

import pytest

from experiments.suite import claims as claims_lib
from experiments.suite import report, rule_changes


def _point(values, rises, left):
  return {"values": values, "rise": rises, "left_plateau": left}


def test_instabilities_list_every_spike_and_late_exit():
  spike = {"rise": 5.94, "step": 40, "peak": 8.54}
  small = {"rise": 0.2, "step": 10, "peak": 3.0}
  summaries = {
      "warmup": {"config": {"steps": 120}, "seeds": [0, 1],
                 "grid": {"post|0.003125|10": _point([2.5, 2.6], [spike, small], [20, 110])}},
      "depth": {"config": {"steps": 120}, "seeds": [0, 1],
                "points": {"deepnorm/L24": _point([2.4, 3.05], [small, None], [40, None])}},
  }
  lines = report.instabilities(summaries)
  assert lines == [
      "warm-up grid `post|0.003125|10` seed 0: training loss spiked by 5.94 nats to 8.54 at step 40, "
      "final val loss 2.500",
      "warm-up grid `post|0.003125|10` seed 1: left the plateau late, at step 110 of 120; it counts as stalled "
      "(still on the plateau at 2/3 of the run)"]


def test_tally_keeps_checks_apart():
  rows = [{"kind": "training", "holds": "yes"}, {"kind": "training", "holds": claims_lib.NOT_TESTABLE},
          {"kind": "check", "holds": "yes"}]
  assert report.tally(rows) == {"training": {"yes": 1, claims_lib.NOT_TESTABLE: 1}, "check": {"yes": 1}}


def test_rule_changes_render_and_refuse_empty_entries():
  md = "\n".join(rule_changes.markdown())
  assert "## Rule changes" in md and "fab34dd" in md and "9bd691d" in md
  assert md.count("\n| issue") == len(rule_changes.RULE_CHANGES)
  with pytest.raises(ValueError, match="names when, which claims, what and why"):
    rule_changes.RuleChange("", ("x",), "what", "why", True, ("cpu:0-2",))
  with pytest.raises(ValueError, match="data_seen names whose data"):
    rule_changes.RuleChange("w", ("x",), "what", "why", True)
  with pytest.raises(ValueError, match="seen must be 'PRESET:SEEDS'"):
    rule_changes.RuleChange("w", ("x",), "what", "why", True, ("cpu",))
  assert "yes (cpu-extra seeds 10-12)" in md


def test_a_verdict_is_marked_only_where_its_own_runs_were_read():
  """Issue 63's third referee: the dagger names a rule changed after this report's preset's runs on the row's
  seeds were read; a change after another preset's, other seeds' or the pilots' runs does not mark it."""
  assert rule_changes.revised_after_seen("cpu-extra", "wortsman_qk_lr_sensitivity", [10, 11, 12])
  assert not rule_changes.revised_after_seen("cpu-extra-confirm", "wortsman_qk_lr_sensitivity", [50, 51, 52])
  assert not rule_changes.revised_after_seen("cpu-extra", "wortsman_qk_lr_sensitivity", [50, 51, 52])
  assert not rule_changes.revised_after_seen("gpu", "xiong_postln_needs_warmup", [0, 1, 2])
  assert not rule_changes.revised_after_seen("cpu-scale", "scale_preln_lead_lasts", [40, 41, 42])
  # issue 50's cpu part changed the bold lines' wording (verdict_rule = false), not a verdict rule:
  assert not rule_changes.revised_after_seen("cpu", "xiong_postln_needs_warmup", [10, 11, 12])
  assert rule_changes.revised_after_seen("cpu-extra", "derf_beats_all", [10, 11, 12])


def test_tables_fill_named_texts_and_read_arrays_as_tuples(tmp_path):
  from experiments.suite import tables
  path = tmp_path / "t.toml"
  path.write_text('[texts]\nA = "x"\nB = "{A}y"\n\n[rows.r]\ntext = "{B}, {{literal}}"\nids = ["a", "b"]\n')
  assert tables.load(path) == {"rows": {"r": {"text": "xy, {literal}", "ids": ("a", "b")}}}
  path.write_text('[texts]\nB = "{A}"\nA = "x"\n')
  with pytest.raises(KeyError, match="A"):
    tables.load(path)


def test_qk_and_lns_claims_are_tallied_and_summarized_like_the_others():
  from experiments.studies import norm_scaling_rules, qk_norm_rules
  flat = {"first": 4.0, "peak": 8.0, "growth": 2.0}   # no logit growth: the instability not reproduced
  qk = [qk_norm_rules.claim_logit_growth({0: {"noqk": flat, "qk": flat}}),
        qk_norm_rules.claim_lr_sensitivity({0: dict(finals_noqk=[2.0, 3.0], finals_qk=[2.0, 2.2], init=5.0,
                                                    noqk_top=flat)}),
        qk_norm_rules.claim_post_ln({0: dict(best_noqk=2.5, best_qk=2.4, lrs_noqk=0.5, lrs_qk=0.1, noqk_top=flat,
                                             qk_top=flat)})]
  lns = norm_scaling_rules.claims({(0, "trained"): dict(pre=10.0, lns=2.0, sandwich=9.0)})
  rows = report.claims_rows({"qk_norm": {"claims": qk}, "norm_scaling": {"claims": lns}})
  holds = {r["id"]: r["holds"] for r in rows if r["experiment"] in ("qk_norm", "norm_scaling")}
  assert holds == {"wortsman_qk_removes_logit_growth": "no",   # issue 50: no growth fails the claim's first half
                   "wortsman_qk_lr_sensitivity": claims_lib.NOT_TESTABLE, "qk_norm_post_ln": "obs",
                   "sun_lns_curbs_variance": "yes", "kim_periln_balanced_variance": "no"}
  t = report.tally(rows)["training"]
  assert t[claims_lib.NOT_TESTABLE] == 1 and t["yes"] == 1 and t["no"] == 2 and t["obs"] == 1
  text = "\n".join(report.summary_block({"preset": "cpu"}, rows, {}))
  assert "- **Claims about models and training** (" in text and "not testable at this scale: 1" in text
  assert "Did not hold: " in text and "Held: " in text
  why = [line for line in text.splitlines() if line.startswith("  - qk-layernorm lowers")]
  assert len(why) == 1 and "*Why:* in no seed did Pre-LN without QK-norm" in why[0] and "Measured" not in why[0]


def test_diverged_qk_norm_runs_are_listed_as_instabilities():
  lines = report.instabilities({"qk_norm": {"diverged": [
      {"position": "pre", "qk_norm": True, "lr": 0.3, "seed": 0, "step": 8}]}})
  assert lines == ["QK-norm sweep `Pre-LN + QK-norm, lr 0.3` seed 0: diverged (training loss above the "
                   "harness's threshold) at step 8; it counts as the initial loss in the LR sensitivity"]
  assert report.instabilities({"qk_norm": {"diverged": []}}) == []


def test_instabilities_read_every_run_of_every_study(tmp_path):
  """Issue 32: the list is built from every cached run's training curve, not from some studies' tables."""
  from experiments.suite.registry import write_json
  from experiments.suite.runs import scan_runs
  curves = {"vjp-post-rms_norm-a": [(1, 5.0), (42, 2.9), (43, 11.18), (44, 3.0)],
            "qk-pre-noqk-L2-lr0.3-s0-b": [(1, 5.0), (2, 4.0)], "grid-c": [(1, 5.0), (2, 4.8)]}
  for label, curve in curves.items():
    diverged = 2 if label.startswith("qk") else None
    write_json(tmp_path / "runs" / label / "run.json",
               {"label": label.rsplit("-", 1)[0], "config": {"steps": 120},
                "summary": {"train_curve": curve, "diverged_at": diverged, "steps_done": diverged or 120}})
  write_json(tmp_path / "runs" / "grid-d" / "run.json",
             {"label": "grid", "config": {"steps": 120, "seed": 2}, "summary": {"train_curve": curves["grid-c"]}})
  scan = scan_runs(tmp_path)
  assert [r["label"] for r in scan] == ["grid", "grid seed 2", "qk-pre-noqk-L2-lr0.3-s0", "vjp-post-rms_norm"]
  lines = report.instabilities({}, scan)
  assert lines == ["run `qk-pre-noqk-L2-lr0.3-s0`: diverged (training loss above the harness's threshold or not "
                   "finite) at step 2 of 120",
                   "run `vjp-post-rms_norm`: training loss spiked by 8.28 nats to 11.18 at step 43"]


def _numbers(text: str) -> list[float]:
  return [float(x) for x in re.findall(r"[+-]?\d+\.\d+", text)]


def test_dyt_noise_line_uses_per_run_differences():
  """Issue 44: the noise line pairs each run's two window sets, never the seed mean, min and max of a
  summary (which gave 0.027 / 0.283 for the committed cpu-extra runs instead of 0.038 / 0.325)."""
  from experiments.studies import dyt
  cfg = dyt.Config(tokens_per_param=(1.0,), seeds=(0, 1, 2))
  vals = {"layer_norm": [(2.0, 2.3), (2.5, 2.1), (2.2, 2.25)], "rms_norm": [(2.0, 2.02), (2.1, 2.16), (2.9, 2.0)],
          "dyt": [(3.0, 3.07), (3.1, 3.11), (3.2, 3.23)], "derf": [(2.0, 2.5), (2.0, 2.04), (2.0, 2.08)]}
  cells = {(n, 1.0, s): {"val": v, "val_alt": a, "train": 1.0, "saturation": None, "epochs": 1.0,
                          "unique_bytes": 100, "val_curve": [[0, 5.0], [10, v]]}
           for n, runs in vals.items() for s, (v, a) in enumerate(runs)}
  per_run = sorted(abs(v - a) for runs in vals.values() for v, a in runs)
  noise = {"single": {"median": statistics.median(per_run), "max": max(per_run), "n": len(per_run)}}
  summary = {"table": dyt._table(cells, cfg), "eval_noise": noise}
  pc = {"dyt": {"eval_bytes": 4096}}
  (line,) = report.noise_lines(pc, {"dyt": summary})
  median, most = _numbers(line)[:2]
  assert median == pytest.approx(statistics.median(per_run), abs=5e-4)
  assert most == pytest.approx(max(per_run), abs=5e-4)
  assert f"over {len(per_run)} runs" in line
  # Without per-run values (an older summary) the line is the estimate, never a pairing of summaries.
  pc["dyt"]["steps"] = 240
  assert "an estimate" in report.noise_lines(pc, {"dyt": {"table": summary["table"]}})[0]
  assert dyt.eval_noise(list(cells.values()))["single"] == pytest.approx(noise["single"])


def test_reanalyse_rejudges_committed_runs_without_training(tmp_path):
  """``experiments.suite.reanalyse`` on a copy of the committed cpu-extra folder: new claims, tables and
  figures from the raw data, ``config``/``wall_s`` kept, the invocation in the provenance, and the noise
  line from per-run values."""
  import json
  import pathlib
  import shutil

  from experiments.suite import reanalyse
  src = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "results" / "cpu-extra"
  root = tmp_path / "cpu-extra"
  shutil.copytree(src, root)
  old = json.loads((root / "dyt" / "done.json").read_text())
  text = reanalyse.reanalyse(root, ["dyt", "qk_norm", "grad_init", "invariance"]).read_text()
  new = json.loads((root / "dyt" / "done.json").read_text())
  assert new["config"] == old["config"] and new["wall_s"] == old["wall_s"] and "dyt_curves.png" in new["files"]
  assert (root / "dyt" / "dyt_curves.png").exists() and "dyt/dyt_curves.png" in text
  # Issue 50: the "What to use" topics (dyt, qk_norm) keep their sections in the report; others move to make room.
  assert "(appendix.md#section-dyt)" not in text and "(appendix.md#section-qk_norm)" not in text
  assert len(text.encode()) <= report.REPORT_BYTES
  inv = json.loads((root / "suite.json").read_text())["invocations"][-1]
  assert "experiments.suite.reanalyse" in inv["command"] and inv["rejudged"][-1] == "invariance"
  assert "| re-judged from the raw data (dyt, qk_norm, grad_init, invariance; no unit recomputed" in text
  seeds = {c["id"]: c.get("seeds") for c in json.loads((root / "invariance" / "done.json").read_text())["claims"]}
  assert seeds["notes_grad_norms_close"] == "op [10, 11, 12]; model at init and in training [0] only"
  assert "| op [10, 11, 12]; model at init and in training [0] only |" in text
  rows = json.loads((root / "dyt" / "cells.json").read_text())
  per_run = [abs(r["val"] - r["val_alt"]) for r in rows]
  line = next(x for x in text.splitlines() if x.startswith("- Evaluation noise of dyt "))
  numbers = _numbers(line.split("measured")[1])
  assert numbers[:2] == pytest.approx([statistics.median(per_run), max(per_run)], abs=5e-4)
  with pytest.raises(ValueError, match="no reanalyse"):
    reanalyse.reanalyse(root, ["speed"])


def test_committed_reports_open_with_the_answer_within_25_kb():
  """Issue 44: each committed preset's report.md opens with "What to use" (at most 150 words) and is at most
  REPORT_BYTES (25 KB until issue 63); the criteria and rule history are in its appendix.md."""
  import pathlib
  results = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "results"
  for preset in ("cpu", "cpu-extra", "gpu"):
    text = (results / preset / "report.md").read_text()
    assert len(text.encode()) <= report.REPORT_BYTES, (preset, len(text.encode()))
    head = text[text.index("## What to use"):text.index("## Verdicts")]
    words = len(head.split("## What to use", 1)[1].split("The appendix (")[0].split())
    assert 0 < words <= report.ANSWER_WORDS + 2 * head.count("\n- "), (preset, words)
    assert (results / preset / "appendix.md").exists()


def test_warmup_answer_reads_a_summary_without_the_per_seed_field():
  """A warm-up summary written before ``highest_trained_per_seed`` existed (the committed gpu report's,
  at 20ad8f4) still gives the per-seed highest rate, read from the grid's recorded failures, and the
  paired sentences; a summary without a grid gives none."""
  from experiments.studies import flagship_answer
  lo, hi = 0.001, 0.003
  def cell(values, failures):
    return {"values": values, "failures": failures}
  grid = {f"post|{lo}|0": cell([2.5, 2.6], [None, None]), f"post|{hi}|0": cell([3.0, 2.7], ["stalled", None]),
          f"post|{lo}|40": cell([2.4, 2.5], [None, None]), f"post|{hi}|40": cell([2.3, 2.35], [None, None]),
          f"pre|{lo}|0": cell([2.2, 2.3], [None, None]), f"pre|{hi}|0": cell([2.1, 2.2], [None, None])}
  old = {"grid": grid, "lrs": [lo, hi], "seeds": [0, 1], "config": {"warmups": [0, 40]}}
  new = {**old, "highest_trained_per_seed": {"post|0": [lo, hi], "post|40": [hi, hi], "pre|0": [hi, hi]}}
  assert flagship_answer.warmup_answer(old) == flagship_answer.warmup_answer(new)
  text = " ".join(flagship_answer.warmup_answer(old))
  assert "Post-LN without warm-up 0.001, >= 0.003, with warm-up 40 >= 0.003, >= 0.003" in text  # the grid's top
  # Issue 50: bold only where every seed agrees at each layout's best-tuned rate (lowest mean where it trains)
  # (issue 63's third referee: a best rate at the grid's bottom is named, as one at its top is)
  assert ("**With Post-LN, use warm-up**: at each one's best rate (0.001 without, 0.003 with; without: the grid's "
          "bottom rate, not bracketed from below) it gains") in text
  gain = text.split("it gains")[1]
  assert _numbers(gain.split("nats")[0]) == pytest.approx([0.2, 0.25])
  assert "**Pre-LN** trained at higher rates" in text and "(0.003) minus Post-LN with warm-up (0.003)" in text
  assert flagship_answer.warmup_answer({"config": {"warmups": [0, 40]}}) == []


def test_answer_refuses_more_than_its_words(monkeypatch):
  from experiments.studies import flagship_answer
  too_many = ["word " * (report.ANSWER_WORDS + 1)]
  monkeypatch.setattr(flagship_answer, "depth_answer", lambda s: too_many)
  from experiments.studies import depth
  monkeypatch.setattr(depth, "answer", lambda s: too_many)
  with pytest.raises(ValueError, match=f"at most {report.ANSWER_WORDS} words"):
    report.answer({"depth": {}})


def test_provenance_shows_a_dirty_tree_for_every_invocation():
  """Issue 50: a re-render on a tree with uncommitted changes says so, as the first run's line does."""
  state = {"git": {"commit": "abc", "dirty": False}, "invocations": [
      {"command": "run"}, {"command": "x --report-only", "report_only": True, "git": {"commit": "def", "dirty": True}},
      {"command": "y", "git": {"commit": "123", "dirty": False}}]}
  lines = report.provenance_lines(state)
  assert lines[-1].endswith("(git `def`, dirty: with uncommitted changes) |") and "re-rendered" in lines[-1]
  assert lines[-2].endswith("(git `123`) |") and "later invocation" in lines[-2]


def test_provenance_collapses_the_re_renders_of_one_command():
  """Issue 63: the re-renders of one command are one row (their count, first and last date, the last commit);
  a re-judge between them keeps its own row, and a re-render with another command its own."""
  render = {"command": "r", "report_only": True}
  state = {"git": {"commit": "abc"}, "invocations": [
      {"command": "run"},
      {**render, "created": "t1", "git": {"commit": "c1", "dirty": True}},
      {"command": "j", "rejudged": ["qk_norm"], "created": "t2", "git": {"commit": "c2"}},
      {**render, "created": "t3", "git": {"commit": "c3"}},
      {"command": "other", "report_only": True, "created": "t4", "git": {"commit": "c4"}}]}
  lines = report.provenance_lines(state)
  rows = [x for x in lines if "re-rendered" in x or "re-judged" in x]
  assert len(rows) == 3
  assert "re-judged" in rows[0] and "`j`" in rows[0]
  assert "2 times, t1 to t3: `r` (the last at git `c3`" in rows[1]
  assert "t4: `other` (git `c4`)" in rows[2]


def test_what_to_use_sections_move_last():
  """Issue 50: the sections of the studies that answer "What to use" move to the appendix only when the
  other sections do not make room (there, the largest first)."""
  big = "x" * 6000
  sections = {"speed": ("## 5. s", big), "dyt": ("## 9. d", big), "qk_norm": ("## 7. q", big), "vjp": ("## 6. v", "y")}
  assert report._moved_sections(report.REPORT_BYTES - 18_000, sections) == {"speed"}
  assert report._moved_sections(report.REPORT_BYTES - 12_000, sections) == {"speed", "dyt"}
  assert report._moved_sections(1_000, sections) == set()


def test_warmup_noise_counts_the_trained_pairs_and_the_offset():
  """Issue 63: the paired Pre - Post noise where both runs trained, beside the one over every pair, and the mean
  offset of the second windows (a uniformly harder set is a fixed offset that a paired difference cancels)."""
  from experiments.studies.seeds import eval_noise
  def r(v, alt):
    return {"final_val_loss": v, "final_val_loss_alt": alt}
  runs = {("pre", 1e-3, 0): [r(2.0, 2.05), r(2.1, 2.15)], ("post", 1e-3, 40): [r(2.3, 2.36), r(2.96, 2.86)],
          ("post", 1e-3, 0): [r(2.4, 2.45), r(2.9, 2.95)]}
  grid = {("pre", 1e-3, 0): {"failures": [None, None]}, ("post", 1e-3, 40): {"failures": [None, "stalled"]}}
  noise = eval_noise(runs, [1e-3], 40, grid)
  assert noise["pre_post"]["n"] == 2 and noise["pre_post"]["max"] == pytest.approx(0.15)
  assert noise["pre_post_trained"] == pytest.approx({"n": 1, "median": 0.01, "max": 0.01})
  assert noise["single"]["offset"] == pytest.approx((0.05 * 4 + 0.06 - 0.10) / 6)
  line = report_summary_line({"eval_noise": noise}, 2048)
  assert "0.010 and 0.010 over the 1 pairs where both runs trained" in line and "higher on average" in line


def report_summary_line(summary, eval_bytes):
  from experiments.studies.summary_lines import warmup_noise_line
  return warmup_noise_line(summary, eval_bytes)


def test_a_span_keeps_its_sign_where_it_rounds_to_zero():
  """Issue 63: "-0.03 to +0.00" said a loss went up where every seed's went down; a float-trajectory zero
  (issue 44) still prints as 0.00."""
  from experiments.studies.seeds import signed, span
  assert span([-0.034, -0.0011, -0.010]) == "-0.03 to -0.001"
  assert signed(-1e-17) == signed(1e-17) == "0.00" and signed(0.004) == "+0.004" and signed(0.3) == "+0.30"


def test_provenance_groups_re_judgements_and_says_what_they_changed():
  """Issue 63's referees: a re-judgement's row says whether it changed a verdict (reanalyse records it); the
  re-judgements of one command are one row, older ones that recorded nothing counted apart."""
  rj = {"command": "j", "rejudged": ["dyt"]}
  state = {"git": {"commit": "abc"}, "invocations": [
      {"command": "run"}, {**rj, "created": "t1", "git": {"commit": "c1"}},
      {**rj, "created": "t2", "git": {"commit": "c2"}, "verdicts_changed": []},
      {"command": "k", "rejudged": ["qk_norm"], "created": "t3", "git": {"commit": "c3"},
       "verdicts_changed": ["wortsman_qk_lr_sensitivity: partly -> no"]}]}
  rows = [x for x in report.provenance_lines(state) if "re-judged" in x]
  assert len(rows) == 2
  assert "(dyt; no unit recomputed; the last one left every verdict unchanged) | 2 times, t1 to t2: `j`" in rows[0]
  assert "verdicts changed: wortsman_qk_lr_sensitivity: partly -> no)" in rows[1]
