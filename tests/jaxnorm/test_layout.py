"""Size limits of the library (issue 45): no module of ``jaxnorm/`` over 400 lines, no function
body over 60 lines (its docstring not counted). Read with ``ast``; nothing is imported.

Run as a script (``python tests/jaxnorm/test_layout.py``) it prints every violation.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "jaxnorm"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
  """Lines of a function's body from its first statement after the docstring to its end."""
  body = node.body[1:] if ast.get_docstring(node) is not None else node.body
  if not body:
    return 0
  return body[-1].end_lineno - body[0].lineno + 1


def violations(package: pathlib.Path = PACKAGE) -> list[tuple[str, str]]:
  """``(path relative to the package, what)`` for every module or function over its limit."""
  out = []
  for path in sorted(package.rglob("*.py")):
    rel = path.relative_to(package).as_posix()
    source = path.read_text()
    n = len(source.splitlines())
    if n > MAX_MODULE_LINES:
      out.append((rel, f"{n} lines (limit {MAX_MODULE_LINES})"))
    for node in ast.walk(ast.parse(source, filename=str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = _body_lines(node)
        if lines > MAX_FUNCTION_LINES:
          out.append((rel, f"{node.name} (line {node.lineno}): a body of {lines} lines "
                           f"(limit {MAX_FUNCTION_LINES})"))
  return out


def test_modules_and_functions_within_the_size_limits():
  found = [f"jaxnorm/{rel}: {what}" for rel, what in violations()]
  assert not found, "over the size limits (split the module or the function):\n" + "\n".join(found)


def test_the_checker_sees_long_modules_and_function_bodies(tmp_path):
  """A module of 401 lines and a 61-line function body are found; a long docstring is not
  counted, and a 60-line body passes."""
  doc = '  """' + "\n" * 30 + '  """\n'
  body = lambda n: "".join(f"  x{i} = {i}\n" for i in range(n))  # noqa: E731
  (tmp_path / "long.py").write_text("".join(f"x{i} = 0\n" for i in range(401)))
  (tmp_path / "f.py").write_text("def ok():\n" + doc + body(60) + "\n\ndef bad():\n" + body(61))
  found = violations(tmp_path)
  assert found == [("f.py", "bad (line 95): a body of 61 lines (limit 60)"),
                   ("long.py", "401 lines (limit 400)")]


if __name__ == "__main__":
  for rel, what in violations():
    print(f"jaxnorm/{rel}: {what}")


def _imports(path: pathlib.Path) -> set[str]:
  """The modules ``path`` imports (absolute names; ``from a import b`` gives ``a`` and ``a.b``)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      out.add(node.module)
      out.update(f"{node.module}.{alias.name}" for alias in node.names)
  return out


def test_the_ops_import_no_backend_and_the_backends_no_op():
  """Issue 51, goal 4: ``jaxnorm/ops/`` reaches the backends only through the dispatcher
  (``jaxnorm.backends.table``), never a concrete backend's package; the backends read the ops'
  declarations (``_norm_ops``, ``_norm_config``), never ``jaxnorm.ops``."""
  up, down = [], []
  for path in sorted((PACKAGE / "ops").rglob("*.py")):
    for name in _imports(path):
      if name.startswith("jaxnorm.backends.") and not name.startswith("jaxnorm.backends.table"):
        down.append((path.relative_to(PACKAGE).as_posix(), name))
  for path in sorted((PACKAGE / "backends").rglob("*.py")):
    for name in _imports(path):
      if name == "jaxnorm.ops" or name.startswith("jaxnorm.ops."):
        up.append((path.relative_to(PACKAGE).as_posix(), name))
  assert down == [] and up == []


def test_the_import_checker_sees_a_backend_import(tmp_path):
  (tmp_path / "m.py").write_text("from jaxnorm.backends.xla import formulas as _xla\n"
                                 "import jaxnorm.backends.table\n")
  assert _imports(tmp_path / "m.py") >= {"jaxnorm.backends.xla",
                                        "jaxnorm.backends.xla.formulas",
                                        "jaxnorm.backends.table"}
