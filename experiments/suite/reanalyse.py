"""Re-judges finished experiments from their raw data, without training: ``python -m
experiments.suite.reanalyse DIR NAME [NAME ...]``.

For each named experiment of the results folder ``DIR`` whose study module defines
``reanalyse(ctx, cfg, summary) -> dict`` (the dyt, qk_norm, grad_init and invariance studies), the study
recomputes its claims, tables and figures from the raw data files in its folder (the ones the
committed reports export: ``cells.json``, ``runs.json``, ``data.json``) with the rules of the
current commit; ``done.json`` is rewritten (its ``config`` and ``wall_s`` kept), the invocation
is appended to ``suite.json``'s ``invocations`` with ``rejudged`` (the names; the report's provenance
lists it as re-judged, with its commit and whether the tree was dirty) and
``report.md`` is re-rendered. A study without the hook is left as it is (an error names it).

This is how a rule change is seen on data already committed (the training runs are not exported,
so ``--force NAME`` would train again); it never replaces a run on fresh seeds.

With ``--figures`` (issue 63) a study's optional ``redraw(ctx, cfg, summary) -> dict`` recomputes from the raw
data what its summary holds beyond its verdicts (the warm-up grid: the figures its run did not write, the
measured noise) and returns the fields to replace (``files`` are added to the summary's); ``done.json`` keeps its
claims, the invocation is recorded with ``redrawn`` (the names) and ``what`` (the fields; the report's
provenance: "... recomputed from the raw data, verdicts kept").
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from experiments.suite import presets as presets_lib
from experiments.suite import report, study
from experiments.suite.context import Context
from experiments.suite.provenance import provenance
from experiments.suite.registry import EXPERIMENTS, read_json, write_json

__all__ = ["main", "reanalyse"]

# a summary field recomputed by --figures, as the provenance names it
_WHAT = {"eval_noise": "measured noise", "claims": "the claims' seeds column"}


def reanalyse(root: str | pathlib.Path, names: list[str], figures: bool = False) -> pathlib.Path:
  """Re-judges the experiments ``names`` of the results folder ``root`` (with ``figures``: only draws their
  figures again, claims kept); returns the report's path.

  Raises:
    ValueError: a name is not an experiment of the folder, or its study has no ``reanalyse`` (``redraw``).
  """
  root = pathlib.Path(root)
  state = read_json(root / "suite.json")
  preset = presets_lib.get_preset(state["preset"])
  ctx = Context(root, preset, progress=False)
  what: list[str] = []
  changed: list[str] = []
  for name in names:
    done = root / name / "done.json"
    if name not in EXPERIMENTS or not done.exists():
      raise ValueError(f"{root} has no finished experiment {name!r}.")
    module = study.load(EXPERIMENTS[name])
    hook = "redraw" if figures else "reanalyse"
    if not hasattr(module, hook):
      raise ValueError(f"study {name!r} cannot be {'redrawn' if figures else 're-judged'} from its raw data "
                       f"(no {hook}()).")
    old = read_json(done)
    ctx.exp_dir, ctx.exp_name = root / name, name
    cfg = module.Config(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                           for k, v in old["config"].items()})
    if figures:
      upd = dict(module.redraw(ctx, cfg, old))
      drawn, files = upd.pop("files", []), list(old.get("files") or [])
      new = {**old, **upd, "files": files + [f for f in drawn if f not in files]}
      what += [k for k in ["figures" if drawn else None, *(_WHAT.get(k, k) for k in upd)] if k and k not in what]
    else:
      new = dict(module.reanalyse(ctx, cfg, old))
      before = {c["id"]: c.get("holds") for c in old.get("claims", [])}
      changed += [f"{c['id']}: {before.get(c['id'])} -> {c.get('holds')}" for c in new.get("claims", [])
                  if before.get(c["id"]) != c.get("holds")]
    new["config"], new["wall_s"] = old["config"], old.get("wall_s")
    write_json(done, new)
  prov = provenance(preset, None)
  inv = {k: prov[k] for k in ("created", "git", "device", "versions")}
  inv["command"] = f"python -m experiments.suite.reanalyse {'--figures ' if figures else ''}{root} {' '.join(names)}"
  inv["redrawn" if figures else "rejudged"] = names
  if figures:
    inv["what"] = what
  else:
    inv["verdicts_changed"] = changed
  state.setdefault("invocations", []).append(inv)
  write_json(root / "suite.json", state)
  return report.render(root)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.suite.reanalyse", description=__doc__.split("\n\n")[0])
  parser.add_argument("out", help="the results folder")
  parser.add_argument("names", nargs="+", help="experiments to re-judge")
  parser.add_argument("--figures", action="store_true", help="only draw the figures again (claims kept)")
  args = parser.parse_args(argv)
  try:
    print(reanalyse(args.out, args.names, figures=args.figures))
  except ValueError as e:
    parser.error(str(e))
  return 0


if __name__ == "__main__":
  sys.exit(main())
