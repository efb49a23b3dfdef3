"""The experiment suite: the smoke preset end to end, resume, report, and the verdict logic.

The smoke preset runs once, in one test (so that ``pytest -n 2`` does not run it once per
worker), into a temporary folder; the checks are structural facts, never timings: every
experiment produces its files, the report renders with its plots and the claims table, the
Post-LN/Pre-LN gradient ratio at init, the invariance errors, the agreement of jaxnorm and Flax
training curves, resume and export.
"""

from __future__ import annotations

import json
from unittest import mock
import math
import re

import numpy as np
import pytest

from experiments.studies import vjp
from experiments.suite import claims as claims_lib
from experiments.suite import plan, presets, registry, report, runner


@pytest.mark.slow
def test_smoke_suite_end_to_end(tmp_path):
  root = tmp_path / "smoke"
  lines = []
  state = runner.run_suite("smoke", root, progress=False, log=lines.append)
  smoke = (root, state, lines)
  check_every_experiment_produces_its_files(smoke)
  check_provenance_is_recorded(smoke)
  check_report_renders_with_plots_and_claims_table(smoke)
  check_post_ln_gradient_ratio_above_pre_ln(smoke)
  check_rms_invariance_errors_are_tiny(smoke)
  check_jaxnorm_and_flax_curves_agree(smoke)
  check_grid_depth_and_first_screen(smoke)
  check_export_and_report_only(smoke, tmp_path)
  check_rerun_resumes_finished_experiments(smoke)
  check_plan_lists_the_cached_units(smoke)
  check_budget_stops_and_resumes_at_a_unit(smoke)


def _done(root, name):
  return json.loads((root / name / "done.json").read_text())


def check_every_experiment_produces_its_files(smoke):
  root, state, _ = smoke
  assert state["failed"] == []
  assert (root / "suite.json").exists()
  for name in runner.EXPERIMENTS:
    assert not (root / name / "error.json").exists(), (root / name / "error.json").read_text()
    summary = _done(root, name)
    assert summary["files"], name
    for f in summary["files"]:
      png = root / name / f
      assert png.suffix == ".png" and png.stat().st_size > 5_000, png
      assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((root / name).glob("*.json")) and list((root / name).glob("*.csv")), name
    for c in summary["claims"]:
      assert c["id"] in claims_lib.CLAIMS and c["holds"] in claims_lib.VERDICTS, c


def check_provenance_is_recorded(smoke):
  root, _, _ = smoke
  state = json.loads((root / "suite.json").read_text())
  assert state["preset"] == "smoke"
  assert re.fullmatch(r"[0-9a-f]{64}", state["corpus"]["sha256"])
  assert state["versions"]["jax"] and state["device"]["backend"]
  assert state["preset_config"]["grad_init"]["seeds"] == [0]
  assert all(state["experiments"][n]["status"] == "done" for n in runner.EXPERIMENTS)


def check_report_renders_with_plots_and_claims_table(smoke):
  root, _, _ = smoke
  text = (root / "report.md").read_text()
  for name, mod in runner.EXPERIMENTS.items():
    title = __import__(mod, fromlist=["TITLE"]).TITLE
    assert title in text, name
  appendix = (root / "appendix.md").read_text()   # sections moved there keep the report under REPORT_BYTES
  images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text + appendix)
  assert len(images) >= len(runner.EXPERIMENTS)
  for rel in images:
    assert (root / rel).exists(), rel
  table = appendix[appendix.index("\n## Claims\n"):]
  assert "| claim | kind | source | published | ours | holds? |" in table
  rows = [l for l in table.splitlines() if l.startswith("| ") and not l.startswith("| claim")]
  assert len(rows) == len(claims_lib.CLAIMS)
  assert "sha256" in text and "smoke" in text


def check_post_ln_gradient_ratio_above_pre_ln(smoke):
  root, _, _ = smoke
  data = json.loads((root / "grad_init" / "data.json").read_text())
  ratios = data["analysis"]["ratios"]
  for L in presets.PRESETS["smoke"]["grad_init"]["depths"]:
    post = ratios[f"xavier/post/layer_norm/L{L}"]["mlp_out"]
    pre = ratios[f"xavier/pre/layer_norm/L{L}"]["mlp_out"]
    assert post > 1.2 * pre, (L, post, pre)


def check_rms_invariance_errors_are_tiny(smoke):
  root, _, _ = smoke
  data = json.loads((root / "invariance" / "data.json").read_text())
  a = np.asarray(data["op"]["a"])
  inner = (a >= 1e-2 - 1e-12) & (a <= 1e2 + 1e-12)
  scale = data["op"]["scale"]
  # Without epsilon: float32 rounding only, over the whole range.
  assert max(scale["RMSNorm eps=0"]["fwd"]) < 1e-5
  assert max(scale["RMSNorm eps=0"]["grad"]) < 1e-5
  # With the default epsilon: small in [1e-2, 1e2] and equal to epsilon's predicted effect.
  fwd = np.asarray(scale["RMSNorm eps=1e-6"]["fwd"])
  pred = np.asarray(data["op"]["predicted_rms_eps"])
  assert fwd[inner].max() < 5e-2
  assert np.all(np.abs(fwd[inner] - pred[inner]) < 1e-5 + 0.05 * pred[inner])
  assert max(np.asarray(scale["RMSNorm eps=1e-6"]["grad"])[inner]) < 5e-2
  # LayerNorm is shift invariant, RMSNorm is not.
  shift = data["op"]["shift"]
  assert max(np.asarray(shift["LayerNorm eps=1e-6"]["fwd"])[a <= 1e2]) < 1e-3
  assert min(np.asarray(shift["RMSNorm eps=1e-6"]["fwd"])[a >= 1]) > 0.1


def check_jaxnorm_and_flax_curves_agree(smoke):
  root, _, _ = smoke
  pairs = json.loads((root / "vjp" / "pairs.json").read_text())
  assert pairs
  for key, p in pairs.items():
    assert len(p["diff"]["steps"]) == presets.PRESETS["smoke"]["vjp"]["steps"], key
    assert p["diff"]["step1"] < 1e-5, key
    assert p["diff"]["max"] < 1e-3, key
    assert p["jaxnorm"]["run"] != p["flax"]["run"]


def check_grid_depth_and_first_screen(smoke):
  root, _, _ = smoke
  warm = _done(root, "warmup")
  cfg = presets.PRESETS["smoke"]["warmup"]
  # issue 31: Post-LN at every warm-up, Pre-LN without
  assert len(warm["grid"]) == len(cfg["lr_times_d"]) * (len(cfg["warmups"]) + 1)
  assert warm["telling_lr"] in warm["lrs"] and "tau 4" in warm["schedule"]
  assert all(len(p["values"]) == len(cfg["seeds"]) for p in warm["grid"].values())
  assert all(len(p["rise"]) == len(cfg["seeds"]) and p["rise"][0]["peak"] > 0 for p in warm["grid"].values())
  depth = _done(root, "depth")
  # issue 24: the depth study runs at its preset's rate, not the grid's telling rate
  assert depth["lr"] == presets.PRESETS["smoke"]["depth"].get("lr", 1e-3)
  assert "not read from the warm-up grid" in depth["lr_source"]
  dcfg = presets.PRESETS["smoke"]["depth"]
  for u in depth["update"].values():
    assert len(u["mean"]) == dcfg["update_steps"] and all(v > 0 for v in u["mean"])
  text = (root / "report.md").read_text()
  # issue 44: the answer first, then the verdicts, summary, limitations, provenance, the studies; the criteria,
  # rule changes and instabilities in the appendix; the report at most REPORT_BYTES
  assert text.index("## What to use") < text.index("## Verdicts") < text.index("## Summary") < \
      text.index("## Limitations") < text.index("## Provenance") < text.index("## 1. ")
  assert len(text.encode()) <= report.REPORT_BYTES
  appendix = (root / "appendix.md").read_text()
  assert "## Rule changes" in appendix and "## Instabilities" in appendix and "## Rule changes" not in text
  kinds = [c.kind for c in claims_lib.CLAIMS.values()]  # every claim, the QK-norm and LNS studies' too
  assert f"**Implementation checks** ({kinds.count('check')}," in text
  assert f"**Claims about models and training** ({kinds.count('training')}):" in text
  assert "| claim | testable when | criterion | ours | seeds | verdict |" in appendix
  # the smoke preset's single depth, single seed and CPU make several claims untestable, with reasons
  assert "- **Not testable at this scale** (a larger scale or an accelerator: `--preset gpu`" in text
  assert "*Why:*" in text
  assert "| not testable at this scale |" in text
  assert "![warmup/final_vs_rate.png](warmup/final_vs_rate.png)" in text   # the headline figure (issue 44)


def check_rerun_resumes_finished_experiments(smoke):
  root, _, _ = smoke
  stamps = {n: (root / n / "done.json").stat().st_mtime_ns for n in runner.EXPERIMENTS}
  lines = []
  state = runner.run_suite("smoke", root, progress=False, log=lines.append)
  assert state["failed"] == []
  assert sum("finished earlier, skipped" in l for l in lines) == len(runner.EXPERIMENTS)
  assert not any(" train " in l for l in lines)
  assert stamps == {n: (root / n / "done.json").stat().st_mtime_ns for n in runner.EXPERIMENTS}
  # --force recomputes one experiment, from the cached training runs.
  lines.clear()
  runner.run_suite("smoke", root, only=["vjp"], force=["vjp"], progress=False, log=lines.append)
  assert not any(" train " in l for l in lines)
  assert (root / "vjp" / "done.json").stat().st_mtime_ns != stamps["vjp"]


def check_plan_lists_the_cached_units(smoke):
  """The chunk plan enumerates exactly the units the suite cached (runs and probe settings)."""
  root, _, _ = smoke
  runs = list((root / "runs").glob("*/run.json"))
  probes = list((root / "cache").glob("*/*.json"))
  units = plan.units("smoke")
  assert len(runs) + len(probes) == len(units)
  for name in runner.EXPERIMENTS:
    expected = sum(u.experiment == name and u.kind != "train" for u in units)  # probe settings
    assert len(list((root / "cache" / name).glob("*.json"))) == expected, name


def check_budget_stops_and_resumes_at_a_unit(smoke):
  """A spent budget stops before an uncached unit (partial); the same command then finishes."""
  root, _, _ = smoke
  one = sorted((root / "cache" / "grad_init").glob("*.json"))[0]
  one.unlink()
  lines = []
  state = runner.run_suite("smoke", root, only=["grad_init", "vjp"], force=["grad_init", "vjp"],
                           progress=False, log=lines.append, budget_s=0.0, render=False)
  assert state["stopped"] and state["experiments"]["grad_init"]["status"] == "partial"
  assert any("not started: the budget is spent" in l for l in lines)  # vjp
  assert not one.exists()
  state = runner.run_suite("smoke", root, only=["grad_init"], force=["grad_init"], progress=False,
                           log=lines.append, render=False)
  assert not state["stopped"] and state["experiments"]["grad_init"]["status"] == "done"
  assert one.exists()


def check_export_and_report_only(smoke, tmp_path):
  root, _, _ = smoke
  dest = runner.export(root, tmp_path / "export")
  assert (dest / "report.md").exists() and not (dest / "runs").exists()
  assert (dest / "grad_init" / "grad_norms_xavier.png").exists()
  assert report.render(dest).read_text() == report.render_text(dest)
  assert runner.main(["--report-only", "--out", str(dest)]) == 0
  # A render that fails leaves suite.json as it was: no "re-rendered" row for a report never written.
  before = (dest / "suite.json").read_bytes()
  with mock.patch.object(report, "render", side_effect=ValueError("refused")):
    try:
      runner.main(["--report-only", "--out", str(dest)])
    except (ValueError, SystemExit):
      pass
  assert (dest / "suite.json").read_bytes() == before


def test_cli_list(capsys):
  assert runner.main(["--list"]) == 0
  out = capsys.readouterr().out
  assert all(name in out for name in runner.EXPERIMENTS) and "smoke" in out
  assert "chunk plan of preset 'cpu'" in out
  assert runner.main(["--list", "--preset", "gpu"]) == 0
  out = capsys.readouterr().out
  assert "--preset gpu --budget 7" in out
  for chunk in plan.chunks("gpu"):
    assert plan.COSTS["gpu"].invocation_s + sum(t for _, t in chunk) <= plan.CHUNK_S


def test_preset_budgets_by_the_cost_model():
  """The budgets on the cost model (estimates, not timings), issues 50 and 55: the main job (with the ladder)
  at most 18.5 minutes on the slower AVX2 CPU, the second command and the sequence-length arm at most 20,
  the gpu preset at most 8 on one H100/H200."""
  assert plan.total_s("cpu", "cpu-avx2") <= 18.5 * 60
  assert plan.total_s("cpu-extra", "cpu-avx2") <= 20 * 60
  assert plan.total_s("cpu-scale", "cpu-avx2") <= 20 * 60
  assert plan.total_s("cpu-scale-schedule", "cpu-avx2") <= 20 * 60   # issue 63: the 2 x 256 leg at tau 160
  assert plan.total_s("gpu", "gpu") <= 8 * 60
  assert plan.total_s("cpu", "cpu-avx2") == pytest.approx(plan.AVX2_FACTOR * plan.total_s("cpu", "cpu-avx512"))


def test_cost_model_prices_layouts_and_shared_runs():
  """A measured layout is its factor times the 16 x 32 step on each CPU kind; the gpu's mirror layout is a
  guess the plan names; a run two studies share (the depth study's 6-layer Post-LN, the grid's point) is
  priced once."""
  for kind, table in (("cpu-avx512", plan.LAYOUT_AVX512), ("cpu-avx2", plan.LAYOUT_AVX2)):
    cost = plan.COSTS[kind]
    assert cost.step(6, 256, 2) == pytest.approx(table[(2, 256)] * cost.step(6, 32))
    assert cost.step(6, 32, 8) == pytest.approx(cost.step(6, 32) / 2)
  assert "not calibrated on this kind" in plan.format_plan("gpu-scale", "gpu")
  assert "not calibrated" not in plan.format_plan("cpu-scale", "cpu-avx2")
  units = plan.units("cpu")
  shared = [u for u in units if u.experiment == "depth" and u.n_layers == 6 and u.kind == "train"]
  assert shared and all(u.run_key in {v.run_key for v in units if v.experiment == "warmup"} for u in shared)
  cost, compiled = plan.COSTS["cpu-avx512"], set()
  prices = {u.label: plan.unit_seconds(u, cost, compiled, 32) for u in units}
  assert all(prices[u.label] == 0.0 for u in shared)
  with pytest.raises(ValueError, match="seq_len must be one this cost model was calibrated at"):
    plan.COSTS["cpu-avx512"].step(6, 48)


# ---------------------------------------------------------------- arguments and verdict logic


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="preset must be one of .* got 'laptop'"):
    presets.get_preset("laptop")
  with pytest.raises(ValueError, match="--only .* got 'gradnorm'"):
    runner.select(["gradnorm"])
  assert runner.select(["1,vjp"]) == ["grad_init", "vjp"]
  with pytest.raises(SystemExit):
    runner.main(["--preset", "laptop"])
  with pytest.raises(ValueError, match="unknown claim id 'made_up'"):
    report.claims_rows({"x": {"claims": [{"id": "made_up", "ours": "", "holds": "yes"}]}})


def test_preset_fields_match_the_experiment_configs():
  import importlib
  for name in presets.PRESETS:
    preset = presets.get_preset(name)
    for exp in presets.studies(preset):
      importlib.import_module(runner.EXPERIMENTS[exp]).Config(**preset[exp])  # raises TypeError on a typo
    assert set(presets.studies(preset)) <= set(preset), name  # every study a preset runs has its sizes there


def test_to_jsonable_keeps_json_valid():
  out = registry.to_jsonable({"a": np.float32(1.5), "b": float("nan"), "c": (np.int64(2), float("-inf")),
                           "d": np.arange(2)})
  assert json.loads(json.dumps(out)) == {"a": 1.5, "b": "nan", "c": [2, "-inf"], "d": [0, 1]}
  assert math.isnan(registry.from_json_float("nan"))


# The verdict rules themselves: tests/experiments/test_verdicts.py (yes / partly / no for every claim).


def test_vjp_compare_and_depth_constants():
  a = {"train_curve": [(1, 5.0), (2, 4.0)], "val_curve": [(0, 5.1), (2, 4.1)]}
  b = {"train_curve": [(1, 5.0), (2, 4.01)], "val_curve": [(0, 5.1), (2, 4.2)]}
  d = vjp.compare(a, b)
  assert d["step1"] == 0.0 and abs(d["max"] - 0.01) < 1e-9 and d["argmax"] == 2
  assert abs(d["final_val"] - 0.1) < 1e-9



def test_a_later_invocation_keeps_the_instabilities_of_runs_no_longer_cached():
  from experiments.suite.runs import merge_scans

  old = [{"label": "a", "rise": 1.0}, {"label": "b", "rise": 2.0}]
  assert merge_scans(old, []) == old  # a committed folder: no run cache, nothing lost
  assert merge_scans(old, [{"label": "b", "rise": 3.0}, {"label": "c", "rise": None}]) == [
      {"label": "a", "rise": 1.0}, {"label": "b", "rise": 3.0}, {"label": "c", "rise": None}]
  assert merge_scans(None, [{"label": "x"}]) == [{"label": "x"}]


def test_preset_extends_merges_tables_and_refuses_bad_chains():
  """A preset with ``extends`` starts from its base: top-level entries replaced, an experiment's
  table merged field by field. cpu-extra-confirm differs from cpu-extra only in its seeds, studies
  and description; a cycle or an unknown base is a ValueError naming the preset."""
  base, confirm = presets.get_preset("cpu-extra"), presets.get_preset("cpu-extra-confirm")
  assert "extends" not in confirm
  assert confirm["model"] == base["model"] and confirm["train"] == base["train"]
  for study in confirm["studies"]:
    key = "seed" if study == "vjp" else "seeds"
    assert confirm[study][key] == (50 if study == "vjp" else (50, 51, 52))
    assert {k: v for k, v in confirm[study].items() if k != key} == {
        k: v for k, v in base[study].items() if k != key}
  assert set(confirm["studies"]) == set(base["studies"]) - {"speed"}
  merged = presets._resolve({"a": {"x": {"p": 1, "q": 2}, "d": "A"}, "b": {"extends": "a", "x": {"q": 3}}})
  assert merged["b"] == {"x": {"p": 1, "q": 3}, "d": "A"}
  with pytest.raises(ValueError, match="extends must not cycle"):
    presets._resolve({"a": {"extends": "b"}, "b": {"extends": "a"}})
  with pytest.raises(ValueError, match="b.extends must name a preset"):
    presets._resolve({"a": {}, "b": {"extends": "nope"}})
