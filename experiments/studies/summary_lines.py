"""The studies' lines in the report's summary block: their instabilities and their evaluation-noise line.

These are the study protocol's optional ``instabilities(summary, scanned)`` and ``noise_line(summary,
eval_bytes)`` (:mod:`experiments.suite.study`); each study module re-exports its own under those names, and
:mod:`experiments.suite.report_summary` calls them through the registry without naming a study.
"""

from __future__ import annotations

from experiments.studies.seeds import SPIKE_NATS

__all__ = ["depth_instabilities", "dyt_noise_line", "point_instabilities", "qk_norm_instabilities",
           "scale_noise_line", "warmup_instabilities", "warmup_noise_line"]


def point_instabilities(where: str, points: list[tuple[str, dict]], seeds: list, steps: int,
                        scanned: bool) -> list[str]:
  """One line per instability of the seed points ``points`` (``[(key, point)]``,
  :func:`experiments.studies.seeds.point`), each named ``where `key` seed s``: every late plateau exit
  (after 2/3 of the ``steps``-step run) and, where the suite did not scan every run (``scanned`` false),
  every training-loss spike above :data:`SPIKE_NATS` of the point's own record, point by point."""
  lines = []
  for key, p in points:
    if not scanned:
      for i, r in enumerate(p.get("rise") or []):
        if r is not None and r["rise"] > SPIKE_NATS:
          lines.append(f"{where} `{key}` seed {seeds[i] if i < len(seeds) else i}: training loss spiked by "
                       f"{r['rise']:z.2f} nats to {r['peak']:z.2f} at step {r['step']}, final val loss "
                       f"{p['values'][i]:z.3f}")
    fails = p.get("failures") or []
    for i, s in enumerate(p.get("left_plateau") or []):
      if s is not None and s > 2 * steps / 3:
        counted = (i < len(fails) and fails[i]) or not fails
        how = ("it counts as stalled (still on the plateau at 2/3 of the run)" if counted else
               "this run's verdicts, judged by an earlier rule, count it as trained (the rule of issue 44 "
               "would count it as stalled: still on the plateau at 2/3 of the run)")
        lines.append(f"{where} `{key}` seed {seeds[i] if i < len(seeds) else i}: left the plateau late, at step {s} "
                     f"of {steps}; {how}")
  return lines


def warmup_instabilities(summary: dict, scanned: bool) -> list[str]:
  """The warm-up grid's instabilities: :func:`point_instabilities` of its grid, then of its extra points."""
  steps = summary["config"]["steps"]
  points = [(k, p) for src in ("grid", "extra_points") for k, p in summary.get(src, {}).items()]
  return point_instabilities("warm-up grid", points, summary.get("seeds", []), steps, scanned)


def depth_instabilities(summary: dict, scanned: bool) -> list[str]:
  """The depth study's instabilities: :func:`point_instabilities` of its points."""
  steps = summary["config"]["steps"]
  return point_instabilities("depth", list(summary.get("points", {}).items()), summary.get("seeds", []), steps,
                             scanned)


def qk_norm_instabilities(summary: dict, scanned: bool) -> list[str]:
  """The QK-norm sweep's divergences as its summary records them; none where the suite scanned every run
  (the scan lists them)."""
  if scanned:
    return []
  lines = []
  for r in summary.get("diverged", []):
    layout = f"{'Pre' if r['position'] == 'pre' else 'Post'}-LN {'+ QK-norm' if r['qk_norm'] else 'no QK-norm'}"
    lines.append(f"QK-norm sweep `{layout}, lr {r['lr']:g}` seed {r['seed']}: diverged (training loss above the "
                 f"harness's threshold) at step {r['step']}; it counts as the initial loss in the LR sensitivity")
  return lines


def warmup_noise_line(summary: dict, eval_bytes: int) -> str | None:
  """The warm-up grid's limitation line on evaluation noise as it measured it (its ``eval_noise``: the same
  final model on a second set of validation windows, per run and for the paired differences the rules
  read), at its own evaluation size ``eval_bytes``; None where it did not."""
  noise = summary.get("eval_noise")
  if not (noise and noise.get("single")):
    return None
  s, p = noise["single"], noise.get("paired")
  t = noise.get("pre_post_trained")
  return (f"- Evaluation noise of warmup ({eval_bytes:,} bytes per point), measured (the same final model on a second "
          f"set of validation windows): median {s['median']:z.3f}, at most {s['max']:z.3f} nats over {s['n']} runs"
          + (f" (the second set reads {abs(s['offset']):z.3f} {'higher' if s['offset'] > 0 else 'lower'} on average: "
             "mostly a fixed offset, which a paired difference cancels)" if s.get("offset") is not None else "")
          + (f"; a paired warm-up gain moves by median {p['median']:z.3f}, at most {p['max']:z.3f}" if p else "")
          + (f"; a paired Pre-LN minus Post-LN difference by median {q['median']:z.3f}, at most {q['max']:z.3f}"
             if (q := noise.get("pre_post")) else "")
          + (f" ({t['median']:z.3f} and {t['max']:z.3f} over the {t['n']} pairs where both runs trained)" if t else "")
          + "; the rules' paired margin is 0.05 nats.")


def scale_noise_line(summary: dict, eval_bytes: int) -> str | None:
  """The scale study's limitation line on evaluation noise (issue 63): per sequence length, the noise of a
  paired Pre-LN minus Post-LN difference it measured (the same models on a second set of windows at each
  ladder point, ``per_seq[seq]["noise"]``), at its own evaluation size ``eval_bytes``; None where it did not."""
  per = summary.get("per_seq") or {}
  parts = [f"sequence {seq}: median {nz['median']:z.3f}, at most {nz['max']:z.3f} nats over {nz['n']} (seed, point) "
           "pairs" for seq in sorted(per, key=int) if (nz := per[seq].get("noise"))]
  if not parts:
    return None
  return (f"- Evaluation noise of scale ({eval_bytes:,} bytes per point at every layout), measured (the same models "
          f"on a second set of windows at each ladder point), of a paired Pre-LN minus Post-LN difference: "
          + "; ".join(parts) + "; the rules' paired margin is 0.05 nats.")


def dyt_noise_line(summary: dict, eval_bytes: int) -> str | None:
  """The dyt study's limitation line on evaluation noise as it measured it (its ``eval_noise``: per run,
  |val - val_alt|, the same final model on two disjoint sets of validation windows; only per-run
  differences, never a summary's seed mean, min and max paired across window sets), at its own evaluation size
  ``eval_bytes``; None where it did not."""
  d = (summary.get("eval_noise") or {}).get("single")
  if not d:
    return None
  return (f"- Evaluation noise of dyt ({eval_bytes:,} bytes per point), measured (the same final model on a second, "
          f"disjoint set of held-out windows): |difference| median {d['median']:z.3f}, at most {d['max']:z.3f} nats "
          f"over {d['n']} runs (it includes what differs between the two window sets).")
