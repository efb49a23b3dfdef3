"""The one progress helper (experiments.harness.progress): plain lines every n steps, iterate's lines."""

from __future__ import annotations

import pytest

from experiments.harness import progress


def test_plain_lines_every_n_steps_and_at_the_last():
  lines = []
  p = progress.Progress(10, desc="train", bar=False, log=lines.append, every=4)
  for step in range(1, 11):
    p.update(step, text=f"step {step}" if step == 10 else None)
  p.message("diverged")
  p.close()
  assert lines == ["train 4/10", "train 8/10", "step 10", "diverged"]
  quiet = progress.Progress(3, desc="x", bar=False)
  quiet.update(3)
  quiet.message("nothing")   # no log: nothing happens, nothing raised


def test_iterate_logs_before_each_item():
  lines, seen = [], []
  for item in progress.iterate("abc", desc="runs", bar=False, log=lines.append):
    seen.append((item, len(lines)))
  assert lines == ["runs 1/3", "runs 2/3", "runs 3/3"] and seen == [("a", 1), ("b", 2), ("c", 3)]


def test_bad_total_is_named():
  with pytest.raises(ValueError, match="total must be an int >= 0, got -1"):
    progress.Progress(-1, desc="x", bar=False)
