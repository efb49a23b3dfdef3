"""What the small benchmark commands (``bench-pointwise``, ``bench-gated``) share: the run's
description and where its table goes.

:func:`add_run_args` adds the options they share, :func:`bench_meta` describes the run
(device, date, command, rounds, load, versions); :func:`write_outputs` prints the markdown
table and, given a folder, writes ``<kind>-<tag>-<date>.json`` (``{"meta": ..., "rows": ...}``) and ``.md`` there.
"""

from __future__ import annotations

import datetime
import json
import os

import jax

from experiments.argtypes import folder, positive_float, positive_int
from experiments.suite.provenance import device_info


def add_run_args(parser, repeats: int = 15) -> None:
  """The options every small bench takes: ``--repeats``, ``--sample-ms``, ``--out``, ``--tag``."""
  parser.add_argument("--repeats", type=positive_int, default=repeats)
  parser.add_argument("--sample-ms", type=positive_float, default=20.0)
  parser.add_argument("--out", type=folder, default=None, help="folder for the JSON and markdown")
  parser.add_argument("--tag", default=None, help="device tag of the file names")


def bench_meta(command: str, repeats: int, **extra) -> dict:
  """The run's description: ``device``, ``date`` (UTC), ``command``, ``repeats``, ``load`` (the
  1-minute load average at the start), ``versions`` and ``extra``'s entries."""
  info = device_info()
  return {"device": f"{info['backend']} {info['device_kind']} ({info['cpu']}, "
                    f"{info['cpu_count']} cores)",
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": command, "repeats": repeats, "load": f"{info['load_avg_1m']:.1f}",
          "versions": {"jax": jax.__version__}, **extra,
          "default_tag": f"{info['backend']}-{info['cpu_count']}cores"}


def write_outputs(out: str | None, kind: str, tag: str | None, meta: dict, rows: list,
                  md: str) -> None:
  """Prints ``md``; with ``out``, writes the JSON and markdown named after ``kind``, ``tag``
  (default: the backend and core count) and the date."""
  print(md)
  if not out:
    return
  os.makedirs(out, exist_ok=True)
  stem = os.path.join(out, f"{kind}-{tag or meta['default_tag']}-{meta['date'][:10]}")
  with open(stem + ".json", "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
  with open(stem + ".md", "w") as f:
    f.write(md)
