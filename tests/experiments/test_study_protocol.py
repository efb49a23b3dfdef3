"""Every registered study follows the study protocol, and the planner's units are the studies' own."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from experiments.suite import plan, presets, study
from experiments.suite.registry import EXPERIMENTS


@pytest.mark.parametrize("preset_name", ["cpu", "cpu-extra"])
def test_every_study_follows_the_protocol_and_the_plan_is_their_units(preset_name):
  """Every registered study is run by the cpu or the cpu-extra preset, and the plan is their own units (rates
  in units of 1/d in a run key resolved with the preset's width)."""
  preset = presets.get_preset(preset_name)
  expected = []
  for name in presets.studies(preset):
    module = study.load(EXPERIMENTS[name])
    assert isinstance(module, study.Study), name
    units = module.units(module.Config(**preset[name]))
    assert units and all(u.experiment == name for u in units), name
    assert len({u.label for u in units}) == len(units), name
    expected += units
  d = preset["model"]["d_model"]
  assert plan.units(preset_name) == [dataclasses.replace(u, run_key=plan._resolve(u.run_key, d)) for u in expected]


def test_the_two_cpu_commands_split_the_studies():
  """Issue 31: the main job holds the flagship studies (issue 50: the ladder among them), the second command
  every other one; the sequence-length arm is the scale study again (issue 55)."""
  main, extra, arm = (presets.studies(presets.get_preset(n)) for n in ("cpu", "cpu-extra", "cpu-scale"))
  assert main == ["scale", "warmup", "depth"] and not set(main) & set(extra)
  assert set(main) | set(extra) == set(EXPERIMENTS) and arm == ["scale"]


def test_load_names_what_a_study_lacks(monkeypatch):
  fake = types.ModuleType("fake_study")
  fake.TITLE, fake.RAW_DATA = "t", ()
  monkeypatch.setitem(sys.modules, "fake_study", fake)
  with pytest.raises(TypeError, match=r"missing \['Config', 'units', 'run', 'report_section'\]"):
    study.load("fake_study")
  fake.Config, fake.units, fake.run, fake.report_section = dict, list, print, str
  with pytest.raises(TypeError, match="must be a dataclass"):
    study.load("fake_study")


def test_the_optional_names_of_every_study_have_their_kinds():
  """The optional names of the protocol (:data:`experiments.suite.study.OPTIONAL`), where a study declares
  them: ``HEADLINE`` a tuple of file names, ``TIMED_STEPS`` a bool, the rest functions."""
  seen = set()
  for name, module_name in EXPERIMENTS.items():
    module = study.load(module_name)
    for attr in study.OPTIONAL:
      if not hasattr(module, attr):
        continue
      seen.add(attr)
      value = getattr(module, attr)
      if attr == "HEADLINE":
        assert isinstance(value, tuple) and all(isinstance(f, str) for f in value), name
      elif attr == "TIMED_STEPS":
        assert isinstance(value, bool), name
      else:
        assert callable(value), (name, attr)
  assert seen == set(study.OPTIONAL)


def test_the_report_reads_a_new_study_through_its_optional_names(monkeypatch):
  """The summary block calls a study's ``instabilities``, ``noise_line`` and ``TIMED_STEPS`` through the
  registry: a study the report has never heard of is listed without an edit to the report."""
  from experiments.suite import report_summary
  fake = types.ModuleType("fake_study")
  fake.TITLE, fake.RAW_DATA, fake.report_section = "t", (), str
  fake.Config, fake.units, fake.run = dataclasses.make_dataclass("Config", []), list, print
  fake.instabilities = lambda summary, scanned: [f"fake {summary['n']} scanned={scanned}"]
  fake.noise_line = lambda summary, eval_bytes: f"- fake noise over {eval_bytes} bytes"
  fake.TIMED_STEPS = True
  monkeypatch.setitem(sys.modules, "fake_study", fake)
  monkeypatch.setattr(report_summary, "EXPERIMENTS", {"fake": "fake_study"})
  assert report_summary.instabilities({"fake": {"n": 3}}) == ["fake 3 scanned=False"]
  assert report_summary.instabilities({"fake": {"n": 3}}, []) == ["fake 3 scanned=True"]
  assert report_summary.noise_lines({"fake": {"eval_bytes": 64}}, {"fake": {}}) == ["- fake noise over 64 bytes"]
  assert report_summary.run_lengths({"fake": {"steps": 10}}, ["fake"]) == "none"
