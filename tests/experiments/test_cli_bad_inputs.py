"""The command line's table of bad inputs (issue 56), in-process: every flag of ``train`` and ``run``
and the numeric flags of the benchmark commands, each with values it must refuse.

A refusal exits with status 2 and names the flag as spelled (``--budget``) on stderr, with no
traceback: argparse's usage and error lines for a value the parser refuses or a config built from
the flags refuses (``train``: the flags its message names, ``--heads/--d-model: n_heads=...``),
one line for what the library or the harness refuses while running
(``experiments.__main__.REFUSALS``).
"""

from __future__ import annotations

import argparse

import pytest

from experiments import argtypes
from experiments.__main__ import main
from experiments.harness import train_cli

_NUMBER_TYPES = {argtypes.positive_int: ("0", "-1", "nan", "1.5", "x"),
                 argtypes.nonneg_int: ("-1", "inf", "x"),
                 argtypes.positive_float: ("0", "-1", "nan", "inf", "x"),
                 argtypes.nonneg_float: ("-1", "nan", "-inf", "x"),
                 argtypes.epsilon: ("-1", "nan", "inf", "1e39", "3.5e38", "x"),
                 argtypes.positive_ints: ("0", "x", "1,,2", "", "2,-1"),
                 argtypes.float_pair: ("1", "x,1", "nan,1", "1,inf", "1,2,3", "")}


def _train_rows():
  """Every option of ``train``: bad numbers, unknown choices, a value given to a switch."""
  rows = []
  for action in build_actions():
    flag = action.option_strings[0]
    if action.type in _NUMBER_TYPES:
      rows += [(["train", flag, bad], flag) for bad in _NUMBER_TYPES[action.type]]
    elif action.type is train_cli._beta:
      rows += [(["train", flag, bad], flag) for bad in ("1", "-0.1", "nan")]
    elif action.choices:
      rows += [(["train", flag, bad], flag) for bad in ("bogus", "")]
    elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
      rows.append((["train", f"{flag}=yes"], flag))
  return rows


# What the model and training configs (and the multi-process setup) refuse after parsing: the
# message names the flags involved as spelled, each checked.
_CONFIG_ROWS = [
    (["--d-model", "30", "--heads", "4"], ("--heads", "--d-model")),
    (["--positions", "rotary", "--d-model", "12", "--heads", "4"], ("--positions", "--d-model", "--heads")),
    (["--norm-scaling", "--norm-position", "post"], ("--norm-scaling", "--norm-position")),
    (["--casting", "llama", "--norm-impl", "flax"], ("--casting", "--norm-impl")),
    (["--norm-type", "dyt", "--norm-impl", "flax"], ("--norm-type", "--norm-impl")),
    (["--qk-norm", "derf", "--norm-impl", "flax"], ("--qk-norm", "--norm-impl")),
    (["--norm-memory-efficient", "--norm-impl", "flax"], ("--norm-memory-efficient", "--norm-impl")),
    (["--norm-memory-efficient"], ("--norm-memory-efficient", "--no-fuse-residual-norm")),
    (["--alt-eval-steps", "50", "--steps", "10"], ("--alt-eval-steps", "--steps")),
    (["--process-id", "0"], ("--process-id", "--coordinator-address", "--num-processes")),
    (["--process-id", "3", "--num-processes", "2", "--coordinator-address", "localhost:1"],
     ("--process-id", "--num-processes")),
]


def _config_rows():
  return [(["train"] + argv, flag) for argv, flags in _CONFIG_ROWS for flag in flags]


def build_actions():
  return [a for a in train_cli.build_parser()._actions if a.option_strings and a.dest != "help"]


def _run_rows():
  rows = [(["run", "--budget", bad], "--budget") for bad in ("nan", "-1", "0", "inf", "-inf", "x", "")]
  rows += [(["run", "--preset", "bogus"], "--preset"), (["run", "--only", "bogus"], "bogus"),
           (["run", "--only", "bogus"], "--only"), (["run", "--only", ","], "--only"),
           (["run", "--force", "bogus"], "--force"), (["run", "--force", "99"], "--force"),
           (["run", "--out", ""], "--out"), (["run", "--export", ""], "--export"),
           (["run", "--list=1"], "--list"), (["run", "--report-only=1"], "--report-only"),
           (["run", "--progress", "--no-progress"], "--no-progress"),
           (["run", "--no-compile-cache=1"], "--no-compile-cache"), (["run", "--unknown"], "--unknown")]
  return rows


def _bench_rows():
  rows = []
  for command, flags in {"bench": ("--repeats", "--sample-ms"), "bench-qk": ("--repeats", "--sample-ms"),
                         "tune": ("--repeats", "--sample-ms"), "demo": ("--tokens", "--d", "--repeats"),
                         "bench-gated": ("--group-size", "--repeats"), "bench-pointwise": ("--repeats",),
                         "bench-ensemble": ("--repeats",)}.items():
    for flag in flags:
      rows += [([command, flag, bad], flag) for bad in ("0", "-1", "nan")]
  rows += [(["bench", "--shapes", "abc"], "--shapes"), (["bench", "--clock", "sundial"], "--clock"),
           (["bench", "--ops", "batch_norm"], "--ops"), (["bench", "--dtypes", "int3"], "--dtypes"),
           (["bench-qk", "--dtype", "float8"], "--dtype"), (["bench-qk", "--heads", "x"], "--heads"),
           (["bench-qk", "--tokens", "0"], "--tokens"), (["bench-qk", "--head-dims", "64,x"], "--head-dims"),
           (["bench-qk", "--kinds", "bogus"], "--kinds")]
  for flag in ("--bwd-per-sm", "--bwd-rows"):  # parsed by the flag's type, before the GPU check
    rows += [(["tune", flag, bad], flag) for bad in ("x", "0", "1,,2")]
  for command in ("bench-gated", "bench-pointwise"):  # parsed by the flag's type, not NumPy's
    rows += [([command, "--shapes", bad], "--shapes") for bad in ("abc", "4x", "0x8", "-4x8")]
    rows += [([command, "--dtypes", bad], "--dtypes") for bad in ("foo", "float8", "int32")]
  rows += [(["bench-gated", "--impls", "cuda"], "--impls"), (["bench-gated", "--orders", "mid"], "--orders"),
           (["bench-ensemble", "--seeds", "x"], "--seeds"), (["bench-ensemble", "--seeds", "0"], "--seeds"),
           (["bench-ensemble", "--preset", "bogus"], "--preset")]
  return rows


PARSER_ROWS = _train_rows() + _config_rows() + _run_rows() + _bench_rows()


def _call(argv, capsys):
  try:
    rc = main(argv)
  except SystemExit as e:  # argparse's refusal
    rc = e.code
  return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", PARSER_ROWS, ids=[" ".join(r[0]) for r in PARSER_ROWS])
def test_the_parser_refuses_naming_the_flag(argv, flag, capsys):
  rc, err = _call(argv, capsys)
  assert rc == 2 and flag in err and "Traceback" not in err, err


@pytest.fixture()
def small_text(tmp_path):
  path = tmp_path / "small.txt"
  path.write_text("abcdefghij" * 300)  # 3,000 bytes
  return path


def test_train_on_data_too_short_names_the_data_size(small_text, capsys, tmp_path):
  rc, err = _call(["train", "--data", str(small_text), "--seq-len", "4096", "--out",
                   str(tmp_path / "run")], capsys)
  assert rc == 2 and len(err.strip().splitlines()) == 1, err
  assert "--seq-len 4096" in err and "3000 bytes" in err and "2700 training and 300 validation" in err
  assert not (tmp_path / "run").exists()  # refused before anything was written


def test_train_a_huge_seq_len_is_refused_by_the_memory_estimate(capsys, tmp_path):
  rc, err = _call(["train", "--seq-len", "100000000", "--out", str(tmp_path / "run")], capsys)
  assert rc == 2 and len(err.strip().splitlines()) == 1, err
  assert "--seq-len 100000000" in err and "GiB" in err and "memory" in err


def test_train_missing_data_file(capsys, tmp_path):
  rc, err = _call(["train", "--data", str(tmp_path / "none.txt")], capsys)
  assert rc == 2 and "--data" in err and "Traceback" not in err


# Output folders a file stands in the way of: refused by the parser, naming the flag, before
# anything runs ("{file}": a file; "{file}/run": a folder under it).
_FOLDER_ROWS = [(["train", "--out", "{file}/run"], "--out"), (["run", "--out", "{file}"], "--out"),
                (["run", "--out", "{file}/x/y", "--report-only"], "--out"),
                (["run", "--export", "{file}/exp"], "--export"), (["bench", "--out", "{file}"], "--out"),
                (["bench-qk", "--out", "{file}/qk"], "--out"), (["tune", "--out", "{file}"], "--out"),
                (["bench-gated", "--out", "{file}"], "--out"),
                (["bench-pointwise", "--out", "{file}/p"], "--out")]


@pytest.mark.parametrize("argv, flag", _FOLDER_ROWS, ids=[" ".join(r[0]) for r in _FOLDER_ROWS])
def test_an_output_folder_under_a_file_is_refused_naming_the_flag(argv, flag, small_text, capsys):
  rc, err = _call([a.format(file=small_text) for a in argv], capsys)
  assert rc == 2 and f"argument {flag}: expected a folder" in err and "is a file" in err, err
  assert "Traceback" not in err


def test_train_a_config_the_library_refuses(capsys):
  rc, err = _call(["train", "--d-model", "30", "--heads", "4"], capsys)
  assert rc == 2 and "Traceback" not in err, err
  assert "error: --heads/--d-model: n_heads=4 must divide d_model=30" in err, err


def test_run_report_only_on_an_empty_folder_is_one_line(tmp_path, capsys):
  rc, err = _call(["run", "--report-only", "--out", str(tmp_path)], capsys)
  assert rc == 2 and len(err.strip().splitlines()) == 1, err
  assert "suite.json not found" in err and "Traceback" not in err


def test_unknown_command(capsys):
  rc, err = _call(["trian"], capsys)
  assert rc == 2 and "trian" in err


def test_the_table_is_large():
  assert len(PARSER_ROWS) + len(_FOLDER_ROWS) >= 200
