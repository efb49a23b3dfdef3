"""The rules of ``experiments/`` (issue 51): the library's size limits (no module over 400 lines, no
function body over 60: the checker of ``tests/jaxnorm/test_layout.py``), no import back up the layers
below, and a report that names no study. Read with ``ast``; nothing of ``experiments/`` is imported but
its registry of studies.

Run as a script (``python tests/experiments/test_experiments_layout.py``) it prints every violation.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "experiments"

# The layers of experiments/, bottom first: a module may import from its own layer and the ones below,
# never from one above. A module belongs to the first layer one of whose prefixes names it or a package
# above it; every module has a layer. The suite loads the studies by the module names of its registry
# (experiments.suite.registry.EXPERIMENTS, through experiments.suite.study.load), not by an import.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("experiments.argtypes",),   # the argparse types every command line shares
    ("experiments.harness",),    # trains and measures one model
    ("experiments.suite",),      # the study protocol, claims, runner and report: runs the studies it is given
    ("experiments.bench",),      # op-level timing and its commands (their provenance is the suite's)
    ("experiments.studies",),    # one module per question: use the suite, the harness and the bench's timing
    ("experiments", "experiments.__main__", "experiments.demo", "experiments.kit_survey",
     "experiments.kit_survey_functions", "experiments.kit_survey_cost"),   # entry point, tour, kit survey
)
# the report: it names no study
REPORT_MODULES = ("suite/report.py", "suite/report_summary.py", "suite/report_provenance.py")


def _size_checker():
  """``violations(package)`` of ``tests/jaxnorm/test_layout.py``: the one home of the size limits."""
  spec = importlib.util.spec_from_file_location("_jaxnorm_layout", REPO / "tests" / "jaxnorm" / "test_layout.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.violations


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers=LAYERS) -> int | None:
  """The index in ``layers`` of the module ``module`` (the first layer naming it or a package above it)."""
  for i, prefixes in enumerate(layers):
    if any(module == p or module.startswith(p + ".") for p in prefixes if p != "experiments"):
      return i
  for i, prefixes in enumerate(layers):
    if module in prefixes:
      return i
  return None


def _imported(node: ast.AST, root: pathlib.Path) -> list[str]:
  """The modules of ``root``'s package an import statement names (``from pkg import mod``: ``pkg.mod``)."""
  top = root.name
  if isinstance(node, ast.Import):
    return [a.name for a in node.names if a.name == top or a.name.startswith(top + ".")]
  if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
    return []
  if not (node.module == top or node.module.startswith(top + ".")):
    return []
  folder = root.parent.joinpath(*node.module.split("."))
  out = [f"{node.module}.{a.name}" for a in node.names
         if (folder / f"{a.name}.py").exists() or (folder / a.name / "__init__.py").exists()]
  return out or [node.module]


def upward_imports(root: pathlib.Path = PACKAGE, layers=LAYERS) -> list[str]:
  """``"a imports b (layer i -> j)"`` for every import, at any depth of a module, of a higher layer;
  also every module without a layer and every relative import (the package imports absolutely)."""
  out = []
  for path in sorted(root.rglob("*.py")):
    if "results" in path.relative_to(root).parts:
      continue
    name = _module_name(root, path)
    here = layer_of(name, layers)
    if here is None:
      out.append(f"{name}: in no layer")
      continue
    nodes = [n for n in ast.walk(ast.parse(path.read_text(), filename=str(path))) if isinstance(n, ast.stmt)]
    for node in sorted(nodes, key=lambda n: n.lineno):
      if isinstance(node, ast.ImportFrom) and node.level:
        out.append(f"{name}: a relative import (line {node.lineno})")
      for target in _imported(node, root):
        there = layer_of(target, layers)
        if there is None or there > here:
          out.append(f"{name} imports {target} (line {node.lineno}): layer {here} -> {there}")
  return out


def study_names_in_report(root: pathlib.Path = PACKAGE, names=None) -> list[str]:
  """Every string constant (docstrings aside) of the report's modules that is a registered study's name."""
  if names is None:
    from experiments.suite.registry import EXPERIMENTS
    names = set(EXPERIMENTS)
  out = []
  for rel in REPORT_MODULES:
    tree = ast.parse((root / rel).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(n) is not None}
    found = [n for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in docs]
    out += [f"{rel}:{n.lineno}: {n.value!r}" for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]
  return out


def test_modules_and_functions_within_the_size_limits():
  found = [f"experiments/{rel}: {what}" for rel, what in _size_checker()(PACKAGE)]
  assert not found, "over the size limits (split the module or the function):\n" + "\n".join(found)


def test_no_import_runs_back_up():
  found = upward_imports()
  assert not found, "imports against the layers (move the rule down, or read it through the registry):\n" + \
      "\n".join(found)


def test_the_report_names_no_study():
  found = study_names_in_report()
  assert not found, "the report names a study (give the study an optional protocol name instead):\n" + \
      "\n".join(found)


def test_the_checkers_see_an_import_back_up_and_a_named_study(tmp_path):
  """A module-level and a function-local import of a higher layer are found, and so is ``from pkg import
  mod``; an import down or within a layer is not; a study's name in the report's code is found, in its
  docstring it is not."""
  pkg = tmp_path / "experiments"
  for rel, text in {
      "suite/__init__.py": "", "studies/__init__.py": "", "studies/a.py": "import experiments.suite.report\n",
      "suite/report.py": '"""warmup"""\nfrom experiments.studies import a\n\ndef f():\n  import experiments.studies.a\n'
                         '  return "warmup"\n',
      "suite/report_summary.py": "from experiments.suite import report\n", "suite/report_provenance.py": ""}.items():
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text(text)
  layers = (("experiments.suite",), ("experiments.studies",), ("experiments",))
  assert upward_imports(pkg, layers) == [
      "experiments.suite.report imports experiments.studies.a (line 2): layer 0 -> 1",
      "experiments.suite.report imports experiments.studies.a (line 5): layer 0 -> 1"]
  assert study_names_in_report(pkg, {"warmup"}) == ["suite/report.py:6: 'warmup'"]
  (pkg / "bench.py").write_text("")
  assert upward_imports(pkg, (("experiments.suite", "experiments.studies"),)) == ["experiments.bench: in no layer"]


if __name__ == "__main__":
  for rel, what in _size_checker()(PACKAGE):
    print(f"experiments/{rel}: {what}")
  print(*upward_imports(), *study_names_in_report(), sep="\n")
