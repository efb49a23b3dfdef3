"""experiments.suite.compare_verdicts: the same verdicts give status 0, one differing verdict status 1."""

from __future__ import annotations

import json

import pytest

from experiments.suite import compare_verdicts


def _folder(tmp_path, name, verdicts):
  d = tmp_path / name / "warmup"
  d.mkdir(parents=True)
  claims = [{"id": k, "holds": v} for k, v in verdicts.items()] + [{"id": "obs", "holds": "obs"}]
  (d / "done.json").write_text(json.dumps({"claims": claims}))
  return str(tmp_path / name)


def test_same_and_different_verdicts(tmp_path, capsys):
  a = _folder(tmp_path, "a", {"c1": "yes", "c2": "partly"})
  b = _folder(tmp_path, "b", {"c1": "yes", "c2": "partly"})
  c = _folder(tmp_path, "c", {"c1": "yes", "c2": "no"})
  assert compare_verdicts.verdicts_of(a) == {"warmup/c1": "yes", "warmup/c2": "partly"}
  assert compare_verdicts.main([f"a={a}", f"b={b}"]) == 0
  out = tmp_path / "t.md"
  assert compare_verdicts.main([f"a={a}", f"c={c}", "--out", str(out)]) == 1
  assert "| `warmup/c2` | partly | no | **no** |" in out.read_text()
  capsys.readouterr()


def test_bad_arguments(tmp_path):
  with pytest.raises(SystemExit):
    compare_verdicts.main(["no-equals-sign"])
  with pytest.raises(SystemExit):
    compare_verdicts.main([f"empty={tmp_path}"])
  with pytest.raises(ValueError, match="folder must hold finished studies"):
    compare_verdicts.verdicts_of(tmp_path)


def test_a_claim_one_folder_lacks_is_not_compared_and_seeds_wording(tmp_path, capsys):
  """Issue 63: the fresh-seed folder runs fewer studies; a claim it lacks is "not compared" (neither the same
  nor different) and counted under the table; ``--differs-by seeds`` words the closing sentence for seeds."""
  a = _folder(tmp_path, "a", {"c1": "yes", "c2": "partly"})
  b = _folder(tmp_path, "b", {"c1": "yes"})
  out = tmp_path / "t.md"
  assert compare_verdicts.main([f"a={a}", f"b={b}", "--out", str(out)]) == 0
  text = out.read_text()
  assert "| `warmup/c2` | partly | - | not compared |" in text
  assert "1 of 1 claims judged in every folder have the same verdict in each; 1 claims are not in every" in text
  c = _folder(tmp_path, "c", {"c1": "no"})
  assert compare_verdicts.main([f"a={a}", f"c={c}", "--differs-by", "seeds", "--out", str(out)]) == 1
  assert "they depend on the seeds" in out.read_text() and "0 of 1 claims" in out.read_text()
  with pytest.raises(SystemExit):
    compare_verdicts.main([f"a={a}", f"c={c}", "--differs-by", "weather"])
  capsys.readouterr()
