"""The "What to use" sentences and the report section of the ``scale`` study (issues 50 and 55).

:func:`answer` states the regime first (parameters, tokens, tokens per parameter, steps, whether the loss
still falls), then the ladder's paired difference per sequence length, then the committed gpu report's
numbers (read from its ``done.json`` by :func:`experiments.studies.scale.gpu_reference` when the summary was
made, never typed in) and what stays confounded between the two. A bold line only where every seed agrees at
every ladder point at each layout's best measured rate, with at least two measured rates per layout; it judges
nothing (the verdicts are :mod:`experiments.studies.scale_rules`').
"""

from __future__ import annotations

import numpy as np

__all__ = ["CONFOUNDED", "answer", "section"]

# What differs between the cpu presets and the committed gpu report besides training length and sequence length
CONFOUNDED = "width, head size, batch, warm-up and decay, rate grid, corpus version"


def _span(xs) -> str:
  lo, hi = min(xs), max(xs)
  return f"{lo:+z.2f}" if abs(hi - lo) < 5e-3 else f"{lo:+z.2f} to {hi:+z.2f}"


def _who(side: str) -> str:
  return {"pre": "Pre-LN ahead", "post": "Post-LN ahead", "neither": "neither beyond 0.05"}[side]


def _tuned(table: list[dict]) -> bool:
  return all(min(r["n_rates"].values()) >= 2 for r in table)


def _ladder_line(summary: dict, seq: str) -> str:
  table, tpp, extra = summary["tables"][seq], summary["tpp"][seq], summary["per_seq"][seq]
  pts = "; ".join(f"{_span(r['diff'])} at T/P {tpp[str(r['step'])]:z.2f}" for r in table)
  cross = [c for c in extra["crossing"] if c is not None]
  n = len(extra["crossing"])
  if cross:
    move = (f"Post-LN overtakes in {len(cross)}/{n} seeds, at T/P "
            + ", ".join(f"{c * summary['tokens_per_step'] / summary['params']:z.2f}" for c in cross))
  else:
    move = f"no sign change ({extra['slope_per_doubling']:+z.3f} nats per doubling)"
  sides = {r["ahead"] for r in table}
  lead = ""
  if _tuned(table) and sides == {"pre"}:
    lead = f"**Pre-LN** leads at every length to T/P {tpp[str(table[-1]['step'])]:z.2f}: "
  elif _tuned(table) and table[-1]["ahead"] == "post" and all(r["ahead"] == "post" for r in table[1:]):
    lead = f"**Post-LN with warm-up** leads from T/P {tpp[str(table[1]['step'])]:z.2f}: "
  tuned = "" if _tuned(table) else ", pilot-tuned"
  return f"{lead}Sequence {seq}, Pre-LN minus Post-LN per seed (best rates{tuned}): {pts}; {move}."


def _regime_line(summary: dict) -> str:
  seq = str(min(int(s) for s in summary["tables"]))
  table = summary["tables"][seq]
  steps = table[-1]["step"]
  tokens = steps * summary["tokens_per_step"]
  fall = summary["per_seq"][seq]["still_falling"]
  falls = ("loss still falling (last fifth: " + ", ".join(
      f"{'Pre' if p == 'pre' else 'Post'}-LN -{v:z.2f}" for p, v in fall.items() if v is not None)
           + " nats)" if all(v is not None and v > 0.01 for v in fall.values())
           else "loss flat at the end (< 0.01 nats over the last fifth)")
  return (f"Regime: {summary['params']:,} parameters, {summary['tokens_per_step']} tokens a step, {steps} steps = "
          f"{tokens:,} tokens = {tokens / summary['params']:z.2f} tokens per parameter; {falls}.")


def _gpu_line(summary: dict) -> str | None:
  g = summary.get("gpu")
  if not g:
    return None
  near = {}
  for seq, table in summary["tables"].items():
    tpp = summary["tpp"][seq]
    r = min(table, key=lambda r: abs(np.log(tpp[str(r["step"])] / g["tpp"])))
    near[seq] = (r["ahead"], tpp[str(r["step"])])
  gpu_side = "post" if all(x > 0.05 for x in g["diff_best"]) else ("pre" if all(x < -0.05 for x in g["diff_best"])
                                                                  else "neither")
  same = [s for s, (side, _) in near.items() if side == gpu_side]
  if not same:
    which = "nothing here reproduces its sign near its T/P"
  elif len(near) == 1:
    which = f"the ladder reproduces its sign at T/P {near[same[0]][1]:z.2f}"
  elif len(same) == len(near):
    which = "the ladder reproduces its sign at every sequence length"
  else:
    which = "near its T/P only sequence " + ", ".join(same) + " has its sign"
  return (f"The gpu report ({g['device']}, width {g['model']['d_model']}, {g['batch']} x {g['seq_len']}, "
          f"T/P {g['tpp']:z.2f}): {_who(gpu_side)}, {_span(g['diff_best'])} at the best rates; {which}. "
          f"Confounded: {CONFOUNDED}.")


def answer(summary: dict) -> list[str]:
  """The study's "What to use" sentences (see the module docstring)."""
  if not summary.get("tables"):
    return []
  out = [_regime_line(summary)]
  out += [_ladder_line(summary, seq) for seq in sorted(summary["tables"], key=int)]
  gpu = _gpu_line(summary)
  if gpu:
    out.append(gpu)
  arm = summary.get("arm")
  if arm:
    out.append(arm)
  return out


def _table_lines(summary: dict, seq: str) -> list[str]:
  tpp = summary["tpp"][seq]
  lines = ["| step | T/P | best rate Pre / Post | Pre-LN per seed | Post-LN per seed | Pre - Post per seed | "
           "on the 2nd windows | ahead |", "|---|---|---|---|---|---|---|---|"]
  for r in summary["tables"][seq]:
    def fmt(xs, fails=None):
      return ", ".join(f"{x:z.3f}" + (f" ({fails[i]})" if fails and fails[i] else "") for i, x in enumerate(xs))
    alt = "-" if not r.get("diff_alt") else ", ".join(f"{x:+z.3f}" for x in r["diff_alt"])
    lines.append(f"| {r['step']} | {tpp[str(r['step'])]:z.2f} | {r['lr']['pre']:g} / {r['lr']['post']:g} | "
                 f"{fmt(r['values']['pre'], r['failures']['pre'])} | {fmt(r['values']['post'], r['failures']['post'])}"
                 f" | {', '.join(f'{x:+z.3f}' for x in r['diff'])} | {alt} | {r['ahead']} |")
  return lines


def section(summary: dict, rel: str) -> str:
  """Markdown: the setup, the figure, per sequence length the ladder table with noise and sign change, and the
  committed gpu report's numbers beside them."""
  cfg = summary["config"]
  rates = "; ".join(f"{p}-LN at {s}: " + ", ".join(f"{x:g}" for x in lrs) for p, s, *lrs in cfg["rates"])
  lines = [
      f"Setup: {cfg['n_layers']}-layer width-{summary['model']['d_model']} LayerNorm models "
      f"({summary['params']:,} parameters, position table of {summary['model']['max_len']} included), "
      f"AdamW(0.9, 0.98), inverse-sqrt decay (tau {cfg['decay_timescale']}); Pre-LN without warm-up, Post-LN with "
      f"warm-up {cfg['warmup']}; layouts (batch x sequence) "
      + ", ".join(f"{b} x {t}" for b, t in cfg["layouts"])
      + f" ({summary['tokens_per_step']} tokens a step in each: fewer, longer windows at the longer sequence); one "
      f"run of {cfg['steps']} steps per (layout, rate, seed) holds every shorter length of the ladder "
      f"{list(cfg['ladder'])} (the schedule does not depend on the run's length); seeds {cfg['seeds']}; "
      f"measured rates {rates} (chosen by "
      "pilots on seeds 100-102, `experiments/results/pilots/scale/`). Validation: "
      f"{cfg['eval_bytes']:,} bytes of held-out windows per evaluation, a second set at each ladder point. Absolute "
      "losses at different sequence lengths are not comparable (other windows, longer contexts); only the paired "
      "differences are compared across them.", "",
      f"![paired difference against tokens per parameter]({rel}/ladder.png)", ""]
  for seq in sorted(summary["tables"], key=int):
    ex = summary["per_seq"][seq]
    nz = ex.get("noise")
    lines += [f"Sequence length {seq} (unigram plateau {float(summary['unigram'][seq]):z.3f} nats):", ""]
    lines += _table_lines(summary, seq)
    lines += ["", "Noise of a paired difference (the same models on the second windows): "
              + (f"median {nz['median']:z.3f}, at most {nz['max']:z.3f} nats over {nz['n']} (seed, point) pairs."
                 if nz else "not measured.")
              + " Sign change per seed (first evaluation where Post-LN is ahead after Pre-LN was): "
              + ", ".join("none" if c is None else f"step {c}" for c in ex["crossing"])
              + f"; slope of the seed-mean difference: {ex['slope_per_doubling']:+z.3f} nats per doubling of length.",
              ""]
  g = summary.get("gpu")
  if g:
    lines += [f"The committed gpu report (`{g['source']}`, git {g['git'][:10]}, {g['device']}): width "
              f"{g['model']['d_model']}, {g['batch']} x {g['seq_len']} bytes a step, {g['steps']} steps, warm-up "
              f"{g['warmup']}, tau {g['tau']}, {g['params']:,} parameters, T/P {g['tpp']:z.2f}; best rates Pre-LN "
              f"{g['best']['pre']:g}, Post-LN {g['best']['post']:g}: Pre - Post "
              + ", ".join(f"{x:+z.3f}" for x in g["diff_best"])
              + f" per seed (over every rate where both train: {_span(g['diff_all'])}); on its own curves at those "
              "rates Post-LN overtakes at step " + ", ".join("never" if c is None else str(c) for c in g["crossing"])
              + " (T/P " + ", ".join("-" if c is None else f"{c * g['batch'] * g['seq_len'] / g['params']:z.2f}"
                                       for c in g["crossing"]) + f"). Confounded with length there: {CONFOUNDED}"
              + ("." if len(summary["tables"]) > 1 else ", and sequence length (the `cpu-scale` preset's arm)."), ""]
  return "\n".join(lines)
