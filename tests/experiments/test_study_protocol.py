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
