"""Seed statistics of training runs, shared by the warm-up grid and the depth study.

A run *fails* if it diverges or ends stalled within :data:`STALL_NATS` of the unigram baseline
(:func:`failed`); :func:`point` summarises the seeds of one configuration, :func:`subset` and
:func:`seed_point` restrict it to some seeds or one (the per-seed and leave-one-out verdicts),
:func:`left_plateau_by` says whether every seed
left the plateau early enough for a failure to be told from a slow start, and
:func:`format_finals` shows each seed's own result.
"""

from __future__ import annotations

import numpy as np

from experiments.suite.spikes import SPIKE_NATS, largest_rise  # noqa: F401 (re-exported: the suite's spike rule)

# ``unigram`` below is the plateau of the runs' own validation batches (the byte-frequency model's
# loss on them: :meth:`experiments.suite.runs.RunsMixin.unigram`; issue 31), not the corpus entropy.
STALL_NATS = 0.1   # a final val loss within this of the unigram baseline counts as stalled


SHARED_RISE_NATS = 0.3   # a step where most runs on the same batches rise this much is a hard batch


def _jumps(train_curve) -> dict[int, float]:
  """Per step, the training loss minus the loss of the step before it (finite losses only)."""
  out, prev = {}, None
  for step, loss in train_curve or []:
    loss = float(loss)
    if not np.isfinite(loss):
      continue
    if prev is not None:
      out[int(step)] = loss - prev
    prev = loss
  return out


def shared_rise_steps(curves: list) -> set[int]:
  """The steps at which more than half of ``curves`` (runs on the same batches: the same data seed,
  batch size and sequence length) jump at least :data:`SHARED_RISE_NATS` above the step before:
  hard batches every run shares. Shown beside the rises, never taken out of them (issue 44: measured
  against the running minimum, as before, most steps of a noisy run qualified -- 127-201 of 300 per
  seed -- and an 8.22-nat spike was hidden from the tables)."""
  per = [_jumps(c) for c in curves if c]
  if len(per) < 2:
    return set()
  steps = set().union(*per)
  return {t for t in steps if sum(r.get(t, 0.0) >= SHARED_RISE_NATS for r in per) > len(per) / 2}


def set_rises(runs: dict, shared: dict | None = None) -> dict:
  """Sets each run's ``rise``: its largest training-loss rise over every step (the same number the
  report's instability list reads, issue 44), and drops its ``train_curve``; returns the steps where
  most runs of a seed jump together (:func:`~experiments.studies.seeds.shared_rise_steps`), which the
  report shows beside the rises.

  Args:
    runs: ``{key: [run per seed]}`` as the warm-up grid and the depth study build them (each with
      ``seed`` and ``train_curve``).
    shared: ``{seed: steps}`` to use (default: computed from ``runs``).

  Returns:
    The ``{seed: sorted shared steps}`` used.
  """
  if shared is None:
    by_seed: dict = {}
    for rs in runs.values():
      for r in rs:
        by_seed.setdefault(r["seed"], []).append(r.get("train_curve"))
    shared = {seed: sorted(shared_rise_steps(curves)) for seed, curves in by_seed.items()}
  for rs in runs.values():
    for r in rs:
      r["rise"] = largest_rise(r.pop("train_curve", None))
  return shared


def failed(run: dict, unigram: float) -> str | None:
  """``"diverged"``, ``"stalled"`` (final val loss > unigram - :data:`STALL_NATS`) or ``None``."""
  if run["diverged"] or run["final_val_loss"] is None:
    return "diverged"
  if float(run["final_val_loss"]) > unigram - STALL_NATS:
    return "stalled"
  return None


def left_plateau_at(run: dict, unigram: float) -> int | None:
  """First evaluation step at which the val loss is below ``unigram - STALL_NATS`` (None if never)."""
  for s, v in run.get("val_curve") or []:
    if np.isfinite(float(v)) and float(v) < unigram - STALL_NATS:
      return int(s)
  return None


def point(runs_by_seed: list[dict], unigram: float) -> dict:
  """Seed statistics of one configuration (a grid point, a layout at a depth).

  ``values``: each seed's own final val loss (a stalled run keeps its own loss; a diverged run,
  which has none, counts at the unigram baseline); ``mean`` and ``spread`` (max - min) of them;
  ``finals`` (``None`` where diverged) and ``diverged_at`` per seed, for display; ``failures``;
  ``trains`` (no seed failed), ``fails`` (every seed failed); ``left_plateau`` (per seed, the
  first evaluation below ``unigram - STALL_NATS``, or None); ``rise`` (per seed, the run's
  :func:`largest_rise`, taken from its ``rise`` or its ``train_curve``; None where neither is kept);
  ``curves`` (per seed, the validation curve ``[(step, loss)]``).
  """
  fails = [failed(r, unigram) for r in runs_by_seed]
  vals = np.array([unigram if f == "diverged" else float(r["final_val_loss"]) for r, f in zip(runs_by_seed, fails)])
  finals = [None if r["final_val_loss"] is None else float(r["final_val_loss"]) for r in runs_by_seed]
  return {"mean": float(vals.mean()), "spread": float(vals.max() - vals.min()), "values": vals.tolist(),
          "finals": finals, "diverged_at": [r.get("diverged_at") for r in runs_by_seed], "failures": fails,
          "trains": not any(fails), "fails": all(fails),
          "left_plateau": [left_plateau_at(r, unigram) for r in runs_by_seed],
          "rise": [r["rise"] if "rise" in r else largest_rise(r.get("train_curve")) for r in runs_by_seed],
          "curves": [[(int(s), float(v)) for s, v in (r.get("val_curve") or [])] for r in runs_by_seed]}


LATE_FRACTION = 2 / 3   # a run still on the plateau at this fraction of its length counts as stalled (issue 44)


def late_counts_as_stalled(p: dict, steps: int) -> dict:
  r"""The :func:`point` ``p`` with a run that was still on the plateau at :data:`LATE_FRACTION` of the run
  counted as *stalled*, whatever its final loss (issue 44).

  A seed fails if it diverged, or if it left the plateau (:func:`left_plateau_at`) only after
  :math:`\tfrac{2}{3} T` or never, or if its final loss is back on the plateau. A run that sat on the
  plateau for most of the run is the effect a warm-up claim is about, not noise, and the verdict no longer
  depends on whether the exit fell just before or just after the last evaluation. ``late`` (per seed)
  marks the runs that left the plateau late but ended below it: they are listed, not hidden.
  """
  lp = p.get("left_plateau")
  if lp is None:
    return p
  late = [s is not None and s > LATE_FRACTION * steps for s in lp]
  fails = [f if f else ("stalled" if s is None or lt else None) for f, s, lt in zip(p["failures"], lp, late)]
  return {**p, "failures": fails, "trains": not any(fails), "fails": all(fails),
          "late": [lt and f != "diverged" for lt, f in zip(late, p["failures"])]}


def subset(p: dict, keep: list[int]) -> dict:
  """The :func:`point` ``p`` restricted to the seeds at positions ``keep`` (statistics recomputed)."""
  vals = [p["values"][i] for i in keep]
  fails = [p["failures"][i] for i in keep]
  out = {"mean": float(np.mean(vals)) if vals else float("nan"),
         "spread": float(max(vals) - min(vals)) if vals else 0.0, "values": vals,
         "finals": [p["finals"][i] for i in keep],
         "diverged_at": [p.get("diverged_at", [None] * len(p["values"]))[i] for i in keep],
         "failures": fails, "trains": not any(fails), "fails": bool(fails) and all(fails)}
  for key in ("left_plateau", "rise", "curves", "late"):
    if key in p:
      out[key] = [p[key][i] for i in keep]
  return out


def seed_point(p: dict, i: int) -> dict:
  """The :func:`point` ``p`` restricted to its ``i``-th seed (what that seed alone would give)."""
  return subset(p, [i])


def seed_points(points: dict, i: int) -> dict:
  """Every :func:`point` of ``points`` (any keys) restricted to its ``i``-th seed."""
  return {k: seed_point(p, i) for k, p in points.items()}


def left_plateau_by(p: dict, step: int) -> bool:
  """Whether every seed of the :func:`point` ``p`` left the plateau at or before ``step``.

  A point without ``left_plateau`` (older summaries) counts as having left it.
  """
  return all(s is not None and s <= step for s in p.get("left_plateau", [0]))


def _seed_text(p: dict, i: int) -> str:
  f = p["failures"][i]
  if f == "diverged":
    at = p.get("diverged_at", [None] * len(p["values"]))[i]
    return "diverged" + (f" at step {at}" if at is not None else "")
  return f"{p['values'][i]:z.3f}" + (" stalled" if f else "")


def format_finals(p: dict) -> str:
  """Each seed's own result of a :func:`point`: its final val loss (marked stalled), or the step
  where it diverged."""
  return ", ".join(_seed_text(p, i) for i in range(len(p["values"])))


def signed(x: float) -> str:
  """``x`` with its sign to two decimals, the sign kept where it rounds to zero: ``-0.004`` reads ``"-0.004"``
  (never ``"+0.00"``, which would say a loss went up; issue 63); below 0.0005 in size (a zero up to the float
  trajectory, issue 44) ``"0.00"``, whatever its sign."""
  x = float(x)
  if abs(x) < 5e-4:
    return "0.00"
  return f"{x:+z.3f}" if round(abs(x), 2) == 0 else f"{x:+z.2f}"


def span(xs) -> str:
  """The range of per-seed numbers, ``"-0.52 to -0.42"`` (one number where they agree to 0.005), each end
  by :func:`signed`."""
  lo, hi = min(xs), max(xs)
  return signed(lo) if abs(hi - lo) < 5e-3 else f"{signed(lo)} to {signed(hi)}"


def format_rises(p: dict) -> str:
  """Each seed's largest training-loss rise of a :func:`point` with the loss it peaked at and its step
  (``"+0.12 to 3.05 at step 37"``; ``"**spike** ..."`` beyond :data:`SPIKE_NATS`); ``"-"`` where
  not kept."""
  out = []
  for r in p.get("rise") or []:
    if r is None:
      out.append("-")
    elif r["step"] is None:
      out.append("+0.00 (never rises)")
    elif r["rise"] > SPIKE_NATS:
      out.append(f"**spike** +{r['rise']:z.2f} to {r['peak']:z.2f} at step {r['step']}")
    else:
      out.append(f"+{r['rise']:z.2f} to {r['peak']:z.2f} at step {r['step']}")
  return ", ".join(out) or "-"


def eval_noise(runs: dict, lrs: list[float], long_w: int, grid: dict | None = None) -> dict:
  r"""The evaluation noise of a warm-up grid, measured: each finished run's final model evaluated on a second set
  of validation windows (``final_val_loss_alt``); ``runs`` maps ``(position, lr, warm-up)`` to the seeds' runs.

  ``single``: :math:`|L_1 - L_2|` per run, with ``offset``, the mean of :math:`L_2 - L_1` (issue 63: a second set
  uniformly harder makes ``single`` mostly a fixed offset, which a paired difference cancels); ``paired``: per
  (rate, seed), how much the warm-up gain :math:`\Delta = L_\text{Post, 0} - L_\text{Post, long}` moves between
  the two sets, :math:`|\Delta_1 - \Delta_2|` (what the rules' paired margin must exceed); ``pre_post``: the same
  for Pre-LN without minus Post-LN with the long warm-up (issue 50), and ``pre_post_trained`` over the pairs where
  both runs trained (``grid``'s points, :func:`point`, have no failure in that seed; issue 63: a stalled run's
  loss moves more between window sets). Each as ``{"n", "median", "max"}`` (None without data).
  """
  def stats(v):
    return {"n": len(v), "median": float(np.median(v)), "max": float(np.max(v))} if v else None
  done = [r for rs in runs.values() for r in rs
          if r.get("final_val_loss") is not None and r.get("final_val_loss_alt") is not None]
  single = stats([abs(r["final_val_loss"] - r["final_val_loss_alt"]) for r in done])
  if single:
    single["offset"] = float(np.mean([r["final_val_loss_alt"] - r["final_val_loss"] for r in done]))
  def trained(key, i):
    return grid is None or (key in grid and not grid[key]["failures"][i])
  def pairs(ka, kb, both_trained=False):
    out = []
    for lr in lrs:
      a_key, b_key = (ka[0], lr, ka[1]), (kb[0], lr, kb[1])
      for i, (a, b) in enumerate(zip(runs.get(a_key, []), runs.get(b_key, []))):
        if both_trained and not (trained(a_key, i) and trained(b_key, i)):
          continue
        if None not in (a.get("final_val_loss"), a.get("final_val_loss_alt"), b.get("final_val_loss"),
                        b.get("final_val_loss_alt")):
          out.append(abs((a["final_val_loss"] - b["final_val_loss"])
                         - (a["final_val_loss_alt"] - b["final_val_loss_alt"])))
    return out
  out = {"single": single, "paired": stats(pairs(("post", 0), ("post", long_w))),
         "pre_post": stats(pairs(("pre", 0), ("post", long_w)))}
  if grid is not None:
    out["pre_post_trained"] = stats(pairs(("pre", 0), ("post", long_w), both_trained=True))
  return out
