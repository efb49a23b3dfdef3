"""Every ```python block of README.md and docs/*.md runs as written, in order.

The blocks of one file share one namespace and run top to bottom, as a reader would paste them;
each file is one test, run in a temporary working directory (a block may write files). A block
that is deliberately not runnable is fenced as another language (```text) with its reason.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: tests/jaxnorm/ is two below
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
  """``(line, source)`` of each ```python block of ``path``, in order (line: the fence's)."""
  text = path.read_text()
  return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_blocks_are_found():
  """The extraction sees the README's blocks (a changed fence style would hide them all)."""
  assert len(python_blocks(ROOT / "README.md")) >= 4


@pytest.mark.parametrize("path", [p for p in FILES if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  namespace = {"__name__": f"docs_{path.stem}"}
  for line, source in python_blocks(path):
    code = compile(source, f"{path.relative_to(ROOT)}:{line}", "exec")
    try:
      exec(code, namespace)
    except Exception as exc:
      raise AssertionError(f"the python block at {path.relative_to(ROOT)}:{line} raised "
                           f"{type(exc).__name__}: {exc}") from exc
