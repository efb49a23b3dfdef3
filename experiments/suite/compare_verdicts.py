"""Compare the verdict tables of several result folders of the same preset (issue 44, goal 4).

``python -m experiments.suite.compare_verdicts NAME=DIR [NAME=DIR ...] [--out FILE.md] [--differs-by
rounding|seeds]`` reads each
folder's ``<study>/done.json`` (the studies' claims as the suite wrote them), prints one markdown
table (claim x folder, the verdict in each) and exits with status 1 if any claim's verdict differs
between the folders, 0 if every verdict is the same everywhere (a claim some folder lacks is not compared).
The folders are runs of one design under different float trajectories (for example the default XLA:CPU
program, ``XLA_FLAGS=--xla_cpu_max_isa=AVX2``, another emitter), where a verdict that differs hinges on
rounding; or, with ``--differs-by seeds``, the same design and rules on fresh seeds (issue 63's
``cpu-extra-confirm``), where a verdict that differs rests on the seeds it was judged on.
Observations (``holds == "obs"``) are left out: they carry no verdict.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

__all__ = ["loss_differences", "main", "verdict_table", "verdicts_of"]


def verdicts_of(folder: str | pathlib.Path) -> dict[str, str]:
  """``{"study/claim_id": verdict}`` of every finished study in ``folder`` (its ``*/done.json``).

  Raises:
    ValueError: ``folder`` holds no finished study.
  """
  folder = pathlib.Path(folder)
  out = {}
  for done in sorted(folder.glob("*/done.json")):
    for c in json.loads(done.read_text()).get("claims", []):
      if c.get("holds") != "obs":
        out[f"{done.parent.name}/{c['id']}"] = c["holds"]
  if not out:
    raise ValueError(f"folder must hold finished studies (<study>/done.json with claims), got none in {folder}")
  return out


def verdict_table(runs: dict[str, dict[str, str]]) -> tuple[str, bool]:
  """The markdown table of ``runs`` (``{name: verdicts_of(...)}``) and whether every verdict agrees. A claim
  that some folder lacks (a study it did not run) shows ``-`` there and "not compared"; it neither agrees nor
  differs, and a line under the table counts such claims."""
  names = list(runs)
  claims = sorted({c for v in runs.values() for c in v})
  lines = ["| claim | " + " | ".join(names) + " | same |", "|---" * (len(names) + 2) + "|"]
  same_all, missing = True, 0
  for c in claims:
    vals = [runs[n].get(c, "-") for n in names]
    if "-" in vals:
      missing += 1
      lines.append(f"| `{c}` | " + " | ".join(vals) + " | not compared |")
      continue
    same = len(set(vals)) == 1
    same_all &= same
    lines.append(f"| `{c}` | " + " | ".join(vals) + f" | {'yes' if same else '**no**'} |")
  compared = len(claims) - missing
  n_same = sum(1 for c in claims if len({runs[n].get(c, "-") for n in names}) == 1)
  lines += ["", f"{n_same} of {compared} claims judged in every folder have the same verdict in each"
            + (f"; {missing} claims are not in every folder (not compared)." if missing else ".")]
  return "\n".join(lines), same_all


def loss_differences(folders: dict[str, str | pathlib.Path]) -> list[str]:
  """Lines comparing each folder's training runs with the first folder's, run by run (the same
  ``runs/<label-hash>/run.json``): how many runs, the median and largest |difference| in final validation
  loss, and how many differ by more than 0.01 nats: evidence that the trajectories differ at all."""
  names = list(folders)
  def finals(folder):
    out = {}
    for f in pathlib.Path(folder).glob("runs/*/run.json"):
      v = json.loads(f.read_text()).get("summary", {}).get("final_val_loss")
      if v is not None:
        out[f.parent.name] = float(v)
    return out
  base = finals(folders[names[0]])
  lines = []
  for n in names[1:]:
    other = finals(folders[n])
    d = sorted(abs(other[k] - base[k]) for k in base.keys() & other.keys())
    if not d:
      bare = [x for x in (names[0], n) if not (pathlib.Path(folders[x]) / "runs").is_dir()]
      lines.append(f"- {n} vs {names[0]}: losses not compared, " + (
          f"{' and '.join(bare)} keep no run cache (a committed folder leaves its runs out; the studies' raw data "
          "hold their losses)" if bare else "no run in common (the runs' labels differ)"))
      continue
    lines.append(f"- {n} vs {names[0]}: {len(d)} runs in common, |final loss difference| median {d[len(d) // 2]:z.2g}, "
                 f"largest {d[-1]:z.3f} nats; {sum(x > 0.01 for x in d)} differ by more than 0.01, "
                 f"{sum(x == 0 for x in d)} are identical")
  return lines


_DIFFERS = {"rounding": "Some verdicts differ: the design or a rule hinges on rounding.",
            "seeds": "Some verdicts differ: they depend on the seeds, so each such verdict rests on the seeds it was "
                     "judged on."}


def main(argv: list[str] | None = None) -> int:
  """Command line (see the module docstring)."""
  ap = argparse.ArgumentParser(prog="python -m experiments.suite.compare_verdicts", description=__doc__.split("\n")[0])
  ap.add_argument("runs", nargs="+", metavar="NAME=DIR", help="a label and a results folder")
  ap.add_argument("--out", default=None, help="also write the table to this markdown file")
  ap.add_argument("--differs-by", choices=tuple(_DIFFERS), default="rounding",
                  help="what differs between the folders, for the closing sentence: rounding (float trajectories of "
                       "one design, the default) or seeds (the same design and rules on other seeds)")
  args = ap.parse_args(argv)
  runs = {}
  for item in args.runs:
    name, sep, folder = item.partition("=")
    if not sep or not name or not folder:
      ap.error(f"each run must be NAME=DIR, got {item!r}")
    try:
      runs[name] = verdicts_of(folder)
    except ValueError as e:
      ap.error(str(e))
  table, same = verdict_table(runs)
  folders = {item.partition("=")[0]: item.partition("=")[2] for item in args.runs}
  text = (table + "\n\n" + ("Every verdict is the same in every folder." if same else
                             _DIFFERS[args.differs_by]) + "\n\n"
          + "\n".join(loss_differences(folders)) + "\n")
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text)
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
