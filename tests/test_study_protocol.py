"""Every registered study follows the study protocol, and the planner's units are the studies' own."""

from __future__ import annotations

import sys
import types

import pytest

from experiments.suite import plan, presets, study
from experiments.suite.registry import EXPERIMENTS


def test_every_study_follows_the_protocol_and_the_plan_is_their_units():
  preset = presets.get_preset("cpu")
  expected = []
  for name, module_name in EXPERIMENTS.items():
    module = study.load(module_name)
    assert isinstance(module, study.Study), name
    units = module.units(module.Config(**preset[name]))
    assert units and all(u.experiment == name for u in units), name
    assert len({u.label for u in units}) == len(units), name
    expected += units
  assert plan.units("cpu") == expected


def test_load_names_what_a_study_lacks(monkeypatch):
  fake = types.ModuleType("fake_study")
  fake.TITLE, fake.RAW_DATA = "t", ()
  monkeypatch.setitem(sys.modules, "fake_study", fake)
  with pytest.raises(TypeError, match=r"missing \['Config', 'units', 'run', 'report_section'\]"):
    study.load("fake_study")
  fake.Config, fake.units, fake.run, fake.report_section = dict, list, print, str
  with pytest.raises(TypeError, match="must be a dataclass"):
    study.load("fake_study")
