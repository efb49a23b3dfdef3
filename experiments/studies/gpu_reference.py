"""The committed gpu report's numbers, read from its files when a report is rendered (issues 50 and 63).

The cpu reports put the committed gpu run beside their own answers: where it agrees, where it disagrees and
what differs between the two runs besides what a comparison varies. Every number comes from the committed
gpu folder (``experiments/results/gpu``: ``suite.json``, ``warmup/done.json``, ``depth/done.json``), never
typed by hand, and it is read when the report is rendered, so a new committed gpu run is cited without
re-running anything here (issue 63, goal 6).

:func:`load` returns a plain dict (None without a committed gpu report); :func:`regime` and
:func:`confounders` turn it into the words the answers and sections print; :func:`is_self` tells a report
that the reference is its own study (the gpu report then compares with nothing).
"""

from __future__ import annotations

import copy
import functools
import pathlib

__all__ = ["DESIGN_SOURCE", "RULE_NOTE", "RESULTS", "confounder_names", "confounders", "crossing", "is_self", "load",
           "regime", "rel", "short"]

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"


# Where the gpu run's design came from (its Setup says so; issue 63's referee): the flagship-44 pilots were
# committed after it ran, and their design is not its own.
DESIGN_SOURCE = (
    "The design was not piloted at this size: only c = lr x width carries over from the issue-31 CPU pilots (width "
    "64, 16 x 32, 300 steps, warm-up 60, tau 40; experiments/results/pilots/README.md); the length, warm-up 100, "
    "tau 160, width and batch were set without pilots (the flagship-44 pilots came after this run, and their "
    "design is the cpu preset's)")
# The verdicts stored with the gpu run were judged by the rules of its commit (20ad8f4), before issue 44.
RULE_NOTE = (
    "This run's verdicts were judged by the rules of its commit, before issue 44: a comparison that read a run "
    "which left the plateau after 2/3 of the run was not judged, as the appendix's criterion column says (issue "
    "44's rule, which the cpu reports use and this section's text and the appendix's testable-when column "
    "describe, counts such a run as stalled)")


def rel(path: pathlib.Path) -> str:
  """``path`` relative to the repository's root."""
  return str(pathlib.Path(path).relative_to(RESULTS.parents[1]))


def _best_rate(grid: dict, lrs, key) -> float | None:
  """The rate of lowest seed-mean final loss among those where the layout trains in every seed."""
  ok = [(sum(grid[key(lr)]["values"]) / len(grid[key(lr)]["values"]), lr) for lr in lrs
        if key(lr) in grid and not any(grid[key(lr)]["failures"])]
  return min(ok)[1] if ok else None


def crossing(pre_curves, post_curves) -> list[int | None]:
  """Per seed, the first evaluation step (> 0) where Pre-LN minus Post-LN turns positive after it was
  negative on the two runs' validation curves (None: never)."""
  out = []
  for ca, cb in zip(pre_curves, post_curves):
    a, b = dict(map(tuple, ca)), dict(map(tuple, cb))
    neg, found = False, None
    for k in sorted(k for k in a if k in b and k > 0):
      if a[k] - b[k] < 0:
        neg = True
      elif neg and a[k] - b[k] > 0:
        found = int(k)
        break
    out.append(found)
  return out


def _highest(grid: dict, lrs, key, n: int) -> list[float | None]:
  """Per seed, the highest rate at which the layout trained (None: at none)."""
  return [max([lr for lr in lrs if key(lr) in grid and not grid[key(lr)]["failures"][i]], default=None)
          for i in range(n)]


def load(root: pathlib.Path | None = None) -> dict | None:
  """The committed gpu report's regime and numbers (see the module docstring), or None where ``root``
  (default ``experiments/results/gpu``) has no ``suite.json`` and ``warmup/done.json``. Read once per state of
  those two files (their paths and modification times; a report asks for it once per line), each caller
  getting its own copy."""
  root = pathlib.Path(root or RESULTS / "gpu")
  done, suite = root / "warmup" / "done.json", root / "suite.json"
  if not (done.exists() and suite.exists()):
    return None
  return copy.deepcopy(_read(root, done.stat().st_mtime_ns, suite.stat().st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _read(root: pathlib.Path, done_mtime: int, suite_mtime: int) -> dict:
  """:func:`load`'s reading of ``root`` (the modification times are the cache key, not read)."""
  from experiments.suite.registry import read_json
  from experiments.suite.runs import param_count
  from jaxnorm.models import TransformerConfig
  done, suite = root / "warmup" / "done.json", root / "suite.json"
  from experiments.studies.seeds import late_counts_as_stalled
  d, st = read_json(done), read_json(suite)
  # The cpu reports' rule (issue 44): a run still on the plateau at 2/3 of its length counts as stalled. The gpu
  # run's summary was judged before it (20ad8f4), so its grid is re-read under it here.
  pc, grid, lrs = st["preset_config"], {k: late_counts_as_stalled(p, d["config"]["steps"]) for k, p in
                                        d["grid"].items()}, d["lrs"]
  train, long_ = pc["train"], max(d["config"]["warmups"])
  model, steps, seeds = d["model"], d["config"]["steps"], d["seeds"]
  width = int(model["d_model"])
  key = {"pre": lambda lr: f"pre|{lr}|0", "post0": lambda lr: f"post|{lr}|0",
         "post": lambda lr: f"post|{lr}|{long_}"}
  best = {k: _best_rate(grid, lrs, f) for k, f in key.items()}
  pre, post = grid[key["pre"](best["pre"])], grid[key["post"](best["post"])]
  params = param_count(TransformerConfig(**model, n_layers=d["config"]["n_layers"]))
  tokens_step = int(train["batch_size"]) * int(train["seq_len"])
  git = st.get("git") or {}
  ref = {
      "source": rel(done), "root": rel(root), "git": (git.get("commit") or "?") if isinstance(git, dict) else str(git),
      "created": st.get("created"), "device": _device(st), "versions": st.get("versions") or {},
      "corpus": (st.get("corpus") or {}).get("name"), "model": model, "width": width,
      "head_size": width // int(model["n_heads"]), "batch": int(train["batch_size"]),
      "seq_len": int(train["seq_len"]), "tokens_per_step": tokens_step,
      "eval_bytes": int(train.get("eval_batches") or 0) * tokens_step, "eval_every": train.get("eval_every"),
      "steps": steps, "warmup": long_, "tau": d["config"]["decay_timescale"], "params": params,
      "tpp": steps * tokens_step / params, "lrs": lrs, "c": [lr * width for lr in lrs], "seeds": seeds,
      "best": best, "diff_best": [a - b for a, b in zip(pre["values"], post["values"])],
      "diff_all": [a - b for lr in lrs if grid[key["pre"](lr)]["trains"] and grid[key["post"](lr)]["trains"]
                   for a, b in zip(grid[key["pre"](lr)]["values"], grid[key["post"](lr)]["values"])],
      "crossing": crossing(pre["curves"], post["curves"]),
      "highest": {k: _highest(grid, lrs, f, len(seeds)) for k, f in key.items()},
      "warmup_gain": None, "depth": None, "summaries": [{"config": d["config"], "seeds": seeds}],
      "best_c_post": (best["post"] or float("nan")) * width, "post_best_at_top": best["post"] == max(lrs)}
  if best["post0"] is not None and best["post"] is not None:
    ref["warmup_gain"] = [a - b for a, b in zip(grid[key["post0"](best["post0"])]["values"],
                                                grid[key["post"](best["post"])]["values"])]
  depth = root / "depth" / "done.json"
  if depth.exists():
    dd = read_json(depth)
    deep = max(int(k.split("/L")[1]) for k in dd["points"] if k.startswith("post/L"))
    p, q = dd["points"][f"post/L{deep}"], dd["points"].get(f"pre/L{deep}")
    dparams = param_count(TransformerConfig(**dd["model"], n_layers=deep))
    ref["depth"] = {"layers": deep, "lr": dd["lr"], "c": dd["lr"] * width, "steps": dd["config"]["steps"],
                    "warmup": dd["config"].get("warmup"), "tpp": dd["config"]["steps"] * tokens_step / dparams,
                    "post_fails": sum(1 for f in p["failures"] if f), "n": len(p["failures"]),
                    "post": p["values"], "pre": q["values"] if q else None}
    ref["summaries"].append({"config": dd["config"], "seeds": dd["seeds"]})
  return ref


def _device(suite: dict) -> str:
  dev = suite.get("device")
  return str(dev.get("device_kind") or dev.get("backend") or "?") if isinstance(dev, dict) else str(dev or "?")


def is_self(ref: dict | None, summary: dict) -> bool:
  """Whether ``summary`` is one of the reference's own studies (same config and seeds): the gpu report
  compares with nothing."""
  return bool(ref) and any(s["config"] == summary.get("config") and s["seeds"] == summary.get("seeds")
                           for s in ref["summaries"])


def regime(ref: dict) -> str:
  """``"gpu run (git 20ad8f4, older code and design; NVIDIA H200, width 256, 32 x 256, 500 steps, T/P 0.83)"``."""
  return (f"gpu run (git {ref['git'][:7]}, older code and design; {ref['device']}, width {ref['width']}, "
          f"{ref['batch']} x {ref['seq_len']}, {ref['steps']} steps, T/P {ref['tpp']:z.2f})")


def short(ref: dict) -> str:
  """``"gpu run (git 20ad8f4, older code and design; H200, T/P 0.83)"``: the reference in a line of a report that
  names it in full elsewhere (:func:`regime`)."""
  return f"gpu run ({ref['git'][:7]}: older code and design; T/P {ref['tpp']:z.2f})"


def confounders(ref: dict, **design) -> list[str]:
  """What differs between a cpu design and the committed gpu run besides what the comparison varies (training
  length, and sequence length where a report varies it): every item with both sides' values, each read from the
  files (issue 63's complete list). ``design``: the cpu side, the keyword arguments of
  :func:`_confounder_items` (width, heads, batch, seq_len, eval_bytes, corpus, jax_version, warmup, tau, lrs_c,
  eval_every, max_len). :func:`confounder_names` is the same list in short form."""
  return [long for _, long in _confounder_items(ref, **design)]


def confounder_names(ref: dict, **design) -> list[str]:
  """The short form of :func:`confounders` (the same arguments, items and conditions), for a one-line list:
  names, with a pair of numbers where one says more than the name; the items the long form splits in two (rate
  grid and selection, evaluation size and cadence) are one name here."""
  return [short for short, _ in _confounder_items(ref, **design) if short]


def _confounder_items(ref: dict, *, width, heads, batch, seq_len, eval_bytes, corpus, jax_version, warmup, tau,
                      lrs_c, eval_every="?", max_len="?") -> list[tuple[str | None, str]]:
  """``(short, long)`` per confounder, in report order; ``short`` None where the next item's short form covers it."""
  heads_gpu = ref["width"] // ref["head_size"]
  sched = (ref["warmup"], ref["tau"]) != (warmup, tau)
  table = ref["model"].get("max_len") != max_len
  return [
      ("code and jax version", f"code: git {ref['git'][:7]} with jax {ref['versions'].get('jax', '?')} there, this "
       f"commit with jax {jax_version or '?'} here"),
      ("width", f"width {ref['width']} vs {width}"),
      ("head size", f"head size {ref['head_size']} ({heads_gpu} heads) vs {width // heads} ({heads})"),
      (f"tokens per step ({ref['tokens_per_step']:,} vs {batch * seq_len:,})",
       f"tokens per step {ref['tokens_per_step']:,} vs {batch * seq_len:,} "
       f"({ref['tokens_per_step'] / (batch * seq_len):z.3g}x)"),
      ("windows per step", f"windows per step {ref['batch']} x {ref['seq_len']} vs {batch} x {seq_len}"),
      *([("warm-up and decay", f"Post-LN's warm-up {ref['warmup']} and decay tau {ref['tau']} vs {warmup} and "
          f"{tau}")] if sched else []),
      (None, "rate grid c = lr x width " + ", ".join(f"{c:z.3g}" for c in ref["c"]) + " vs "
       + ", ".join(f"{c:z.3g}" for c in lrs_c)),
      (f"rate grid and selection (its best of {len(ref['c'])}, after the run"
       + ("; Post-LN with warm-up's at the top" if ref.get("post_best_at_top") else "") + ")",
       f"rate selection: best of its {len(ref['c'])}-point grid on its own seeds after the run (Post-LN with "
       f"warm-up's best, c {ref['best_c_post']:z.3g}, "
       + ("the grid's top: not bracketed" if ref["post_best_at_top"] else "inside the grid")
       + ") vs rates chosen on pilot seeds before the runs"),
      (None, f"evaluation {ref['eval_bytes']:,} bytes per point vs {eval_bytes}, in other windows"),
      (f"evaluation ({ref['eval_bytes']:,} vs {eval_bytes} bytes; every {ref['eval_every']} vs {eval_every} steps)",
       f"evaluation every {ref['eval_every']} steps vs every {eval_every}"),
      *([("position table", f"position table {ref['model'].get('max_len', '?')} vs {max_len} (part of the "
          "parameter count)")] if table else []),
      ("verdict rules", f"verdict rules of git {ref['git'][:7]} for the gpu report's own verdicts (this report "
       "re-reads its runs with its own stalled-run rule)"),
      ("corpus", f"corpus {ref['corpus']} vs {corpus}"),
      ("seeds", f"seeds {ref['seeds']}"),
      ("GPU matmul precision (unrecorded)", "the GPU's matrix-multiply precision (TF32 or not: not recorded)")]
