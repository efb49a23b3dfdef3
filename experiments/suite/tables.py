"""The suite's data tables: TOML files next to this module.

``presets.toml`` (:mod:`experiments.suite.presets`), ``claims.toml``
(:mod:`experiments.suite.claims`) and ``rule_changes.toml`` (:mod:`experiments.suite.rule_changes`)
hold sizes and text, not logic; their modules define the fields, check the entries and expose the
tables as before. In such a file the ``[texts]`` table names texts
(a citation, a shared condition) that its other strings use as ``{NAME}``; a text may use the texts
above it, and ``{{``/``}}`` write a literal brace. Arrays are read as tuples.
"""

from __future__ import annotations

import pathlib
import tomllib

__all__ = ["load"]


def load(name: str | pathlib.Path) -> dict:
  """The TOML file ``name`` of this folder (or at the absolute path ``name``), its ``[texts]``
  filled into every string.

  Raises:
    KeyError: a string names a text that ``[texts]`` does not define (above it, for a text).
  """
  data = tomllib.loads((pathlib.Path(__file__).parent / name).read_text(encoding="utf-8"))
  texts: dict[str, str] = {}
  for key, text in data.pop("texts", {}).items():
    texts[key] = text.format_map(texts)
  return _fill(data, texts)


def _fill(value, texts: dict[str, str]):
  if isinstance(value, dict):
    return {k: _fill(v, texts) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_fill(v, texts) for v in value)
  if isinstance(value, str):
    return value.format_map(texts)
  return value
