"""The tables of the ``bench`` command's report (:mod:`experiments.bench.cli`): from its result rows, the
LayerNorm/RMSNorm time ratios, the ratios to Flax (also one column per mode), the fused-against-unfused
ratios and the like-for-like per-round ratios; printed after the run (:func:`print_ratios`) and written
as ``bench.md`` (:func:`markdown`).
"""

from __future__ import annotations

import statistics

from experiments.bench.impls import FUSED_OPS, LIKE_FOR_LIKE
from experiments.bench.timing import ALL_MODES

__all__ = ["fused_table", "like_for_like", "markdown", "print_ratios", "ratio_tables"]


def _quantile(values, q: float) -> float:
  """The ``q`` quantile of ``values`` (linear interpolation, as ``numpy.quantile``)."""
  v = sorted(values)
  pos = q * (len(v) - 1)
  lo = int(pos)
  hi = min(lo + 1, len(v) - 1)
  return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def like_for_like(results: list[dict]) -> list[dict]:
  """Per-round time ratios of each :data:`LIKE_FOR_LIKE` pair: their median and 90% quantile.

  Sample ``r`` of two implementations of one (op, shape, dtype, mode) was taken in the same
  interleaved round, so their ratio pairs timings that saw the same load.
  """
  t = {(r["op"], r["impl"], r["shape"], r["dtype"], r["mode"]): r["times_s"]
       for r in results if r["status"] == "ok" and "times_s" in r}
  rows = []
  for (op, impl, shape, dtype, mode), times in t.items():
    for ours, base in LIKE_FOR_LIKE:
      if impl != ours or (op, base, shape, dtype, mode) not in t:
        continue
      ratios = [a / b for a, b in zip(times, t[(op, base, shape, dtype, mode)])]
      rows.append({"op": op, "impl": impl, "baseline": base, "shape": shape, "dtype": dtype,
                   "mode": mode, "rounds": len(ratios), "median": statistics.median(ratios),
                   "q90": _quantile(ratios, 0.9)})
  return rows


def ratio_tables(results: list[dict]) -> tuple[list[dict], list[dict]]:
  """RMS/LN ratios and ratios against Flax from the ok results."""
  t = {(r["op"], r["impl"], r["shape"], r["dtype"], r["mode"]): r["median_s"]
       for r in results if r["status"] == "ok"}
  rms_ln, vs_flax = [], []
  for (op, impl, shape, dtype, mode), sec in t.items():
    if op in FUSED_OPS:
      continue  # see fused_table
    if op == "layer_norm" and ("rms_norm", impl, shape, dtype, mode) in t:
      rms = t[("rms_norm", impl, shape, dtype, mode)]
      rms_ln.append({"impl": impl, "shape": shape, "dtype": dtype, "mode": mode,
                     "ln_over_rms": sec / rms})
    if impl != "flax-linen" and (op, "flax-linen", shape, dtype, mode) in t:
      vs_flax.append({"op": op, "impl": impl, "shape": shape, "dtype": dtype, "mode": mode,
                      "time_over_flax": sec / t[(op, "flax-linen", shape, dtype, mode)]})
  return rms_ln, vs_flax


def fused_table(results: list[dict]) -> list[dict]:
  """Fused op vs add + plain op (same impl) and vs add + Flax, per (op, shape, dtype, mode)."""
  t = {(r["op"], r["impl"], r["shape"], r["dtype"], r["mode"]): r["median_s"]
       for r in results if r["status"] == "ok" and r["op"] in FUSED_OPS}
  rows = []
  for (op, impl, shape, dtype, mode), sec in t.items():
    if impl not in ("jaxnorm-xla", "jaxnorm-pallas"):
      continue
    unfused = t.get((op, "unfused-" + impl[len("jaxnorm-"):], shape, dtype, mode))
    flax = t.get((op, "flax-linen", shape, dtype, mode))
    rows.append({"op": op, "impl": impl, "shape": shape, "dtype": dtype, "mode": mode,
                 "fused_s": sec,
                 "fused_over_unfused": None if unfused is None else sec / unfused,
                 "fused_over_flax": None if flax is None else sec / flax})
  return rows


def _by_mode(vs_flax: list[dict], modes) -> tuple[list[str], list[tuple[tuple, dict]]]:
  """The ratios to Flax as one row per (op, impl, shape, dtype) and one column per mode.

  Returns ``(modes, rows)``: the modes that have a ratio, in ``modes`` order, and
  ``[((op, impl, shape, dtype), {mode: ratio})]`` in measuring order.
  """
  rows: dict[tuple, dict] = {}
  for r in vs_flax:
    rows.setdefault((r["op"], r["impl"], r["shape"], r["dtype"]), {})[r["mode"]] = r["time_over_flax"]
  present = [m for m in modes if any(m in v for v in rows.values())]
  return present, list(rows.items())


def _row(cells) -> str:
  """One line of a markdown table; an empty cell is written ``| |``."""
  return "|" + "".join(f" {c} |" if c != "" else " |" for c in cells)


def _table(title: str, columns, rows, intro: tuple[str, ...] = ()) -> list[str]:
  """A section of ``bench.md``: the heading ``title``, the paragraphs ``intro``, then a table with
  the header ``columns`` and one line per row of cell strings."""
  return (["", title, ""] + [line for par in intro for line in (par, "")]
          + [_row(columns), "|" + "---|" * len(columns)] + [_row(r) for r in rows])


_KEY = ("op", "impl", "shape", "dtype", "mode")  # the fields that name a result row


def _cells(r: dict, names) -> list[str]:
  return [str(r[n]) for n in names]


def _timing_cells(r: dict) -> list[str]:
  """Time, GB/s, % of copy and note of a timing row; the status and its reason where not ok."""
  if r["status"] == "ok":
    return [f"{r['median_s'] * 1e6:.1f}", f"{r['gbps']:.1f}", f"{r['pct_copy']:.0f}", ""]
  return [r["status"], "", "", r.get("reason", "")]


def _ratio(v) -> str:
  return "n/a" if v is None else f"{v:.2f}"


def _mib(v) -> str:
  return "n/a" if v is None else f"{v / 2**20:.1f}"


def markdown(report: dict) -> str:
  """The text of ``bench.md`` of the report ``report`` (what ``bench.json`` holds)."""
  lines = [f"# jaxnorm benchmark — {report['device']} ({report['backend']})", "",
           f"date {report['date']}, versions {report['versions']}", ""]
  if "machine" in report:
    m = report["machine"]
    lines += [f"machine: {m['cpu_model']} {m.get('cpu_ids', '')}, {m['cpu_count']} CPUs; vector extensions "
              f"{' '.join(m['vector_extensions'])}; XLA_FLAGS `{m['xla_flags']}`; load average "
              f"(1, 5, 15 min) {m['loadavg']} at the start, {m.get('loadavg_end')} at the end", ""]
  lines.append(f"command: `python -m experiments bench {' '.join(report['argv'])}`; clock "
               f"{report.get('clock', 'wall')} ({report['repeats']} interleaved rounds)")
  lines += _table("## Copy bandwidth (x * 2)", ["shape", "dtype", "GB/s"],
                  [[c["shape"], c["dtype"], f"{c['gbps']:.1f}"] for c in report["copy"]])
  lines += _table("## Timings", ["op", "impl", "shape", "dtype", "mode", "time (us)", "GB/s", "% of copy", "note"],
                  [_cells(r, _KEY) + _timing_cells(r) for r in report["results"]])
  lines += _table("## LayerNorm / RMSNorm time ratio", ["impl", "shape", "dtype", "mode", "LN/RMS"],
                  [_cells(r, _KEY[1:]) + [f"{r['ln_over_rms']:.2f}"] for r in report["ln_over_rms"]])
  modes, by_mode = _by_mode(report["vs_flax"], ALL_MODES)
  lines += _table("## Time relative to flax-linen, side by side (< 1 is faster)",
                  ["op", "impl", "shape", "dtype", *modes],
                  [[*key, *("n/a" if m not in ratios else f"{ratios[m]:.2f}" for m in modes)]
                   for key, ratios in by_mode],
                  intro=("Each ratio is jaxnorm's median over Flax's, both sampled interleaved in this run.",))
  if report.get("like_for_like"):
    lines += _table("## Like for like: per-round time ratios (< 1 is faster)",
                    ["op", "impl", "baseline", "shape", "dtype", "mode", "median", "q90", "rounds"],
                    [_cells(r, ("op", "impl", "baseline", *_KEY[2:]))
                     + [f"{r['median']:.2f}", f"{r['q90']:.2f}", str(r["rounds"])] for r in report["like_for_like"]],
                    intro=("jaxnorm's default (accurate) variance against Flax's `use_fast_variance=False`, "
                           "its `use_fast_variance=True` against Flax's default; the median and the 90% "
                           "quantile of the ratios of samples taken in the same interleaved round.",))
  lines += _table("## Time relative to flax-linen (< 1 is faster)",
                  ["op", "impl", "shape", "dtype", "mode", "time / flax"],
                  [_cells(r, _KEY) + [f"{r['time_over_flax']:.2f}"] for r in report["vs_flax"]])
  lines += _table("## Fused residual add + norm: time relative to add + plain op (< 1: fusion is faster)",
                  ["op", "impl", "shape", "dtype", "mode", "fused (us)", "fused / unfused", "fused / flax"],
                  [_cells(r, _KEY) + [f"{r['fused_s'] * 1e6:.1f}", _ratio(r["fused_over_unfused"]),
                                      _ratio(r["fused_over_flax"])] for r in report.get("fused", [])])
  lines += _table("## Memory of the jitted fwd+bwd (memory_analysis)",
                  ["op", "impl", "shape", "dtype", "temp (MiB)", "peak (MiB)"],
                  [_cells(m, _KEY[:4]) + [_mib((m["memory"] or {}).get(k))
                                          for k in ("temp_size_in_bytes", "peak_memory_in_bytes")]
                   for m in report["memory"]])
  return "\n".join(lines) + "\n"


def print_ratios(rms_ln: list[dict], vs_flax: list[dict], fused_rows: list[dict]) -> None:
  """Prints the LN/RMS, time/Flax and fused/unfused ratio tables after the run."""
  print("\n# LayerNorm / RMSNorm time ratio (> 1: RMSNorm is faster)")
  for r in rms_ln:
    print(f"  {r['impl']:14s} {r['shape']:11s} {r['dtype']:9s} {r['mode']:8s} "
          f"{r['ln_over_rms']:.2f}")
  modes, by_mode = _by_mode(vs_flax, ALL_MODES)
  print("\n# time / flax-linen (< 1: faster than Flax)")
  print(f"  {'op':10s} {'impl':14s} {'shape':11s} {'dtype':9s} " + " ".join(f"{m:>8s}" for m in modes))
  for (op, impl, shape, dtype), ratios in by_mode:
    print(f"  {op:10s} {impl:14s} {shape:11s} {dtype:9s} " +
          " ".join(f"{ratios[m]:8.2f}" if m in ratios else f"{'n/a':>8s}" for m in modes))
  if fused_rows:
    print("\n# fused add+norm: time / (add + plain op), time / (add + Flax) (< 1: fused is faster)")
    f2 = lambda v: "  n/a" if v is None else f"{v:5.2f}"  # noqa: E731
    for r in fused_rows:
      print(f"  {r['op']:14s} {r['impl']:14s} {r['shape']:11s} {r['dtype']:9s} {r['mode']:8s} "
            f"{f2(r['fused_over_unfused'])} {f2(r['fused_over_flax'])}")
