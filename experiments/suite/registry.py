"""The registry of experiments and the JSON helpers of the results folder.

The small module that both the runner (:mod:`experiments.suite.runner`) and the report
(:mod:`experiments.suite.report`) import: which experiments exist, in the order of the report, and how
their results are written to and read from JSON (non-finite floats included).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any

import numpy as np

__all__ = ["EXPERIMENTS", "from_json_float", "read_json", "to_jsonable", "write_json"]

# Experiment name -> module, in the order of the report (the numbering of the issue).
EXPERIMENTS: dict[str, str] = {
    "grad_init": "experiments.studies.grad_init",
    "scale": "experiments.studies.scale",
    "warmup": "experiments.studies.warmup",
    "depth": "experiments.studies.depth",
    "invariance": "experiments.studies.invariance",
    "speed": "experiments.studies.speed",
    "vjp": "experiments.studies.vjp",
    "qk_norm": "experiments.studies.qk_norm",
    "norm_scaling": "experiments.studies.norm_scaling",
    "dyt": "experiments.studies.dyt",
}


def to_jsonable(obj: Any) -> Any:
  """Converts numpy/JAX scalars and arrays, tuples and dataclasses into JSON-ready values.

  Non-finite floats become the strings ``"nan"``/``"inf"``/``"-inf"`` so that the files stay
  valid JSON (diverged runs produce them).
  """
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return to_jsonable(dataclasses.asdict(obj))
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
    return to_jsonable(obj.tolist())
  if isinstance(obj, (bool, np.bool_)):
    return bool(obj)
  if isinstance(obj, (int, np.integer)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    f = float(obj)
    if math.isfinite(f):
      return f
    return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
  return obj


def from_json_float(value: Any) -> float:
  """Inverse of :func:`to_jsonable` for one float (``"nan"`` -> ``nan``; ``None`` -> ``nan``)."""
  if value is None:
    return float("nan")
  return float(value)


def write_json(path: pathlib.Path, obj: Any) -> None:
  """Writes ``obj`` as indented JSON atomically (a crash never leaves half a file)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(to_jsonable(obj), indent=1, sort_keys=False) + "\n")
  os.replace(tmp, path)


def read_json(path: pathlib.Path) -> Any:
  """Parses the JSON file at ``path`` (non-finite floats stay strings: :func:`from_json_float`)."""
  return json.loads(pathlib.Path(path).read_text())
