"""The "What to use" sentences and the report section of the ``scale`` study (issues 50, 55 and 63).

:func:`answer` states the regime first (parameters, layouts, tokens, tokens per parameter, steps, and how much
the loss still falls, per sequence length, over a window named by its steps), then per sequence length the
ladder's paired difference, each line opening with its layout, steps and tokens per parameter and saying in
the same line where the committed gpu run disagrees, with its numbers; then what else differs between the two
runs; then (the main job) the committed sequence-length arm. The gpu run's numbers are read from its files
when the report is rendered (:mod:`experiments.studies.gpu_reference`), never typed in; so are the arm's
(``experiments/results/cpu-scale``). A bold line only where every seed agrees at every ladder point at each
layout's best measured rate, with at least two measured rates per layout; it judges nothing (the verdicts are
:mod:`experiments.studies.scale_rules`').
"""

from __future__ import annotations

import numpy as np

from experiments.studies import gpu_reference, scale_spikes
from experiments.studies.seeds import signed
from experiments.studies.seeds import span as _span

__all__ = ["answer", "confounders", "section"]


def _who(side: str) -> str:
  return {"pre": "Pre-LN ahead", "post": "Post-LN ahead", "neither": "neither beyond 0.05"}[side]


def _tuned(table: list[dict]) -> bool:
  return all(min(r["n_rates"].values()) >= 2 for r in table)


def _rates_text(table: list[dict]) -> str:
  """How the rates of a ladder line were chosen: ``"best rates"`` where every layout has two or more measured
  rates; else which layout ran one rate, the pilots' choice for their longest runs and not re-chosen at the
  shorter points (issue 63's third referee: "best rates, pilot-tuned" overstated it at 200 and 400 steps)."""
  if _tuned(table):
    return "best rates"
  def name(p):
    return f"{p.capitalize()}-LN"
  single = sorted({p for r in table for p, n in r["n_rates"].items() if n < 2}, reverse=True)
  multi = sorted({p for r in table for p, n in r["n_rates"].items() if n >= 2} - set(single), reverse=True)
  return ((f"{' and '.join(map(name, multi))} at its best rate; " if multi else "")
          + f"{' and '.join(map(name, single))}: one rate, the pilots' choice for their longest runs")


def _ref(summary: dict) -> dict | None:
  """The committed gpu run (None where there is none, or where this summary is its own)."""
  ref = gpu_reference.load()
  return None if ref is None or gpu_reference.is_self(ref, summary) else ref


def _layout(summary: dict, seq: str) -> str:
  """``"16 x 32"``: the layout of sequence length ``seq`` (``"sequence 32"`` for a summary without its config)."""
  lays = (summary.get("config") or {}).get("layouts") or []
  return next((f"{b} x {t}" for b, t in lays if str(t) == seq), f"sequence {seq}")


def _gpu_side(ref: dict) -> str:
  d = ref["diff_best"]
  return "post" if all(x > 0.05 for x in d) else ("pre" if all(x < -0.05 for x in d) else "neither")


def _gpu_clause(summary: dict, seq: str, ref: dict | None) -> str:
  """Where the gpu run stands beside this sequence length's ladder: its side at its best rates against ours at
  the ladder point nearest its tokens per parameter, with its numbers."""
  if ref is None:
    return ""
  tpp = summary["tpp"][seq]
  r = min(summary["tables"][seq], key=lambda r: abs(np.log(tpp[str(r["step"])] / ref["tpp"])))
  side = _gpu_side(ref)
  cross = [c * ref["tokens_per_step"] / ref["params"] for c in ref["crossing"] if c is not None]
  over = (f" (on its curves Pre-LN is ahead until T/P {min(cross):z.2f}-{max(cross):z.2f}, then Post-LN)"
          if cross else "")
  verb = "agrees" if side == r["ahead"] else "disagrees"
  return f"; the {gpu_reference.short(ref)} {verb}: {_who(side)} by {_span(ref['diff_best'])} at its best rates{over}"


def _gpu_vs(diffs, ref: dict | None) -> str:
  """``"; the gpu run disagrees: Post-LN ahead by +0.21 to +0.35"`` (at its best rates; the ladder line before it
  names the run in full): the gpu run beside per-seed Pre - Post ``diffs`` of a line that has no ladder of its
  own (the arm's and the schedule's lines); empty without a gpu run."""
  if ref is None:
    return ""
  side = _gpu_side(ref)
  ours = "post" if all(x > 0.05 for x in diffs) else ("pre" if all(x < -0.05 for x in diffs) else "neither")
  verb = "agrees" if side == ours else "disagrees"
  return f"; the gpu run {verb}: {_who(side)} by {_span(ref['diff_best'])}"


def _fall(summary: dict, seq: str) -> str:
  fall = summary["per_seq"][seq]["still_falling"]
  w = fall.get("window")
  where = f"steps {w[0]}->{w[1]}" if w else "its last evaluations"
  vals = {p: fall.get(p) for p in ("pre", "post")}
  if all(v is not None and v > 0.01 for v in vals.values()):
    return (f"still falling over {where} (Pre-LN -{vals['pre']:z.2f}, Post-LN -{vals['post']:z.2f} nats, seed "
            "means)")
  return f"flat over {where} (< 0.01 nats)"


def _ladder_line(summary: dict, seq: str, ref: dict | None) -> str:
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
  regime = (f"{_layout(summary, seq)}, {table[0]['step']}-{table[-1]['step']} steps (T/P "
            f"{tpp[str(table[0]['step'])]:z.2f}-{tpp[str(table[-1]['step'])]:z.2f})")
  return (f"{regime}: {lead}Pre-LN minus Post-LN per seed ({_rates_text(table)}): {pts}"
          f"{scale_spikes.extreme_spikes(summary, seq)}; "
          f"{move}{_gpu_clause(summary, seq, ref)}.")


def _regime_line(summary: dict) -> str:
  seqs = sorted(summary["tables"], key=int)
  steps = summary["tables"][seqs[0]][-1]["step"]
  tokens = steps * summary["tokens_per_step"]
  lay = " and ".join(_layout(summary, s) for s in seqs)
  falls = ("loss " + _fall(summary, seqs[0]) if len(seqs) == 1 else
           "loss " + "; ".join(f"at sequence {s} {_fall(summary, s)}" for s in seqs))
  return (f"Regime: {summary['params']:,} parameters, {lay} = {summary['tokens_per_step']} tokens a step, {steps} "
          f"steps = {tokens:,} tokens = {tokens / summary['params']:z.2f} tokens per parameter; {falls}.")


def confounders(summary: dict, ref: dict) -> list[str]:
  """What differs between this study's runs and the committed gpu run besides training length (and sequence
  length where the study varies it), each with both sides' values (:func:`gpu_reference.confounders`)."""
  return gpu_reference.confounders(ref, **_design(summary))


def _design(summary: dict) -> dict:
  """This study's side of the gpu comparison, as :func:`gpu_reference.confounders` takes it."""
  cfg, model, prov = summary["config"], summary["model"], summary.get("provenance") or {}
  b, t = cfg["layouts"][0]
  width = int(model["d_model"])
  lrs = sorted({float(x) for _, _, *xs in cfg["rates"] for x in xs})
  return dict(
      width=width, heads=int(model["n_heads"]), batch=int(b), seq_len=int(t),
      eval_bytes=f"{cfg['eval_bytes']:,}", corpus=(prov.get("corpus") or {}).get("name"),
      jax_version=(prov.get("versions") or {}).get("jax"), warmup=cfg["warmup"], tau=cfg["decay_timescale"],
      lrs_c=[lr * width for lr in lrs], eval_every=cfg.get("eval_every", "?"), max_len=model.get("max_len", "?"))


def _seq_varied_or_same(summary: dict, ref: dict) -> bool:
  """Whether sequence length is no confounder with the gpu run: the study varies it, or runs the gpu's."""
  return len(summary["tables"]) > 1 or any(int(s) == ref["seq_len"] for s in summary["tables"])


def _confounder_line(summary: dict, ref: dict | None) -> str | None:
  if ref is None or not summary.get("config") or not summary.get("model"):
    return None
  also = "" if _seq_varied_or_same(summary, ref) else " and sequence length"
  short = gpu_reference.confounder_names(ref, **_design(summary))
  return (f"The {gpu_reference.regime(ref)} differs from these runs besides length{also} in: " + ", ".join(short)
          + " (values in the study's section).")


def _arm_line(summary: dict) -> str | None:
  """The committed ``cpu-scale`` run (the sequence-length arm), read from its files when the report is rendered,
  for the main job's answer (one sequence length there): per sequence length, the paired difference at the
  ladder point nearest 0.9 tokens per parameter."""
  from experiments.suite.registry import read_json
  if len(summary["tables"]) > 1:
    return None
  root = gpu_reference.RESULTS / "cpu-scale"
  done = root / "scale" / "done.json"
  if not done.exists():
    return None
  s = read_json(done)
  suite = read_json(root / "suite.json") if (root / "suite.json").exists() else {}
  git = str((suite.get("git") or {}).get("commit", "?"))[:7]
  ref = _ref(summary)
  parts, at, steps = [], set(), set()
  for seq in sorted(s["tables"], key=int):
    tpp = s["tpp"][seq]
    r = min(s["tables"][seq], key=lambda r: abs(np.log(tpp[str(r["step"])] / 0.9)))
    at.add(f"{tpp[str(r['step'])]:z.2f}")
    steps.add(r["step"])
    parts.append(f"sequence {seq} {_span(r['diff'])}"
                 + (f" ({_gpu_vs(r['diff'], ref)[2:]})" if ref and int(seq) == ref["seq_len"] else ""))
  lay = " and ".join(f"{b} x {t}" for b, t in s["config"]["layouts"])
  return (f"{lay}, {', '.join(map(str, sorted(steps)))} steps (T/P {', '.join(sorted(at))}; the sequence-length arm, "
          f"`--preset cpu-scale`, git {git}): Pre - Post per seed " + "; ".join(parts) + "."
          + _schedule_moves(summary, s))


def _schedule_moves(summary: dict, arm: dict) -> str:
  """Where this study runs a sequence length of the arm at another schedule on the same seeds and ladder (issue
  63: ``cpu-scale-schedule``), how much the schedule moves each seed's Pre - Post at the longest point, beside
  the larger of the two runs' paired noise there; empty otherwise."""
  cfg, acfg = summary.get("config") or {}, arm.get("config") or {}
  sched, asched = (cfg.get("warmup"), cfg.get("decay_timescale")), (acfg.get("warmup"), acfg.get("decay_timescale"))
  seq = next(iter(summary["tables"]))
  if sched == asched or seq not in arm["tables"] or cfg.get("seeds") != acfg.get("seeds"):
    return ""
  ours, theirs = summary["tables"][seq][-1], arm["tables"][seq][-1]
  if ours["step"] != theirs["step"]:
    return ""
  moves = [a - b for a, b in zip(ours["diff"], theirs["diff"])]
  noise = max((x.get("noise") or {}).get("max", 0.0) for x in (summary["per_seq"][seq], arm["per_seq"][seq]))
  big = int(np.argmax(moves))
  seeds = cfg.get("seeds") or []
  lone = ""
  if len(seeds) == len(moves):
    lone = scale_spikes.lone_spike(arm, scale_spikes.scan_of(gpu_reference.RESULTS / "cpu-scale"), summary,
                                   (summary.get("provenance") or {}).get("runs_scan") or [], seq, seeds[big])
  margin = sum(x < -0.05 for x in ours["diff"])
  return (f" At sequence {seq}, step {ours['step']}, this schedule (tau {sched[1]} for both layouts, Post-LN warm-up "
          f"{sched[0]}; Pre-LN's rate not re-bracketed at it: a better one could only widen its lead) against the "
          f"arm's (warm-up {asched[0]}, tau {asched[1]}) moves Pre - Post by "
          + ", ".join(signed(x) for x in moves) + f" per seed (each run's paired noise at most {noise:z.3f}"
          + (f"; seed {seeds[big]}'s {signed(moves[big])}: its {lone}" if lone else "")
          + f"), leaving {margin} of {len(moves)} seeds beyond the 0.05 margin (" + ", ".join(
              signed(x) for x in ours["diff"]) + ").")


def _schedule_line(summary: dict) -> str | None:
  """The committed ``cpu-scale-schedule`` run (issue 63: the arm's 2 x 256 leg at the gpu preset's
  schedule), read from its files when the report is rendered, for the reports that do not run it: its regime,
  its per-seed Pre - Post at its longest point, how many seeds lie beyond the rules' margin and its verdict,
  how much the schedule moves each seed's difference against the same sequence length on the same seeds at
  this study's schedule (this run, else the committed ``cpu-scale`` arm) beside the larger paired noise, and
  the gpu run beside it. None where it is not committed or this is that run."""
  from experiments.suite.registry import read_json
  root = gpu_reference.RESULTS / "cpu-scale-schedule"
  done = root / "scale" / "done.json"
  if not done.exists():
    return None
  sch = read_json(done)
  scfg, cfg = sch.get("config") or {}, summary.get("config") or {}
  if (scfg.get("warmup"), scfg.get("decay_timescale")) == (cfg.get("warmup"), cfg.get("decay_timescale")):
    return None
  suite = read_json(root / "suite.json") if (root / "suite.json").exists() else {}
  git = str((suite.get("git") or {}).get("commit", "?"))[:7]
  seq = next(iter(sch["tables"]))
  last = sch["tables"][seq][-1]
  tpp = sch["tpp"][seq][str(last["step"])]
  beyond = sum(x < -0.05 for x in last["diff"])
  verdict = next((c["holds"] for c in sch.get("claims", []) if c["id"] == "scale_preln_lead_lasts"), None)
  line = (f"{_layout(sch, seq)}, {last['step']} steps (T/P {tpp:z.2f}) at the gpu preset's schedule (tau "
          f"{scfg.get('decay_timescale')}, both layouts; Post-LN warm-up {scfg.get('warmup')}; Pre-LN's rate not "
          f"re-bracketed; `--preset cpu-scale-schedule`, git {git}): Pre - Post per seed {_span(last['diff'])}, "
          f"{beyond} of {len(last['diff'])} seeds beyond the 0.05 margin"
          + (f" (its verdict: {verdict})" if verdict else ""))
  base, where, scan = None, "", []
  mine = (summary.get("tables") or {}).get(seq)
  if mine and cfg.get("seeds") == scfg.get("seeds"):
    base, where = summary, (f"this run's schedule (tau {cfg.get('decay_timescale')}, warm-up {cfg.get('warmup')}; "
                            "same seeds)")
    scan = (summary.get("provenance") or {}).get("runs_scan") or []
  else:
    arm_root = gpu_reference.RESULTS / "cpu-scale"
    arm = read_json(arm_root / "scale" / "done.json") if (arm_root / "scale" / "done.json").exists() else None
    if arm and seq in arm["tables"] and (arm.get("config") or {}).get("seeds") == scfg.get("seeds"):
      acfg = arm["config"]
      base, where = arm, (f"the arm's (tau {acfg.get('decay_timescale')}, warm-up {acfg.get('warmup')}; the same "
                          f"seeds {', '.join(map(str, scfg.get('seeds') or []))})")
      scan = scale_spikes.scan_of(arm_root)
  if base is not None and base["tables"][seq][-1]["step"] == last["step"]:
    moves = [a - b for a, b in zip(last["diff"], base["tables"][seq][-1]["diff"])]
    noise = max((x.get("noise") or {}).get("max", 0.0) for x in (base["per_seq"][seq], sch["per_seq"][seq]))
    seeds = scfg.get("seeds") or []
    big = int(np.argmax(moves))
    sch_scan = scale_spikes.scan_of(root)
    lone = scale_spikes.lone_spike(base, scan, sch, sch_scan, seq, seeds[big]) if len(seeds) == len(moves) else ""
    line += (f"; against {where} the schedule moves each seed's difference by "
             + ", ".join(signed(x) for x in moves) + f" (each run's paired noise at most {noise:z.3f}"
             + (f"; seed {seeds[big]}'s {signed(moves[big])}: its {lone}" if lone else "") + ")")
  return line + _gpu_vs(last["diff"], _ref(summary)) + "."


def fresh_answer(summary: dict) -> list[str]:
  """The line a report prints for this study's fresh-seed run beside its own answer (``confirmation_results``):
  per sequence length, Pre - Post per seed at the longest point, the sign and slope, how near the margin."""
  if not summary.get("tables"):
    return []
  parts = []
  for seq in sorted(summary["tables"], key=int):
    table, tpp = summary["tables"][seq], summary["tpp"][seq]
    extra = summary["per_seq"][seq]
    cross = [c for c in extra.get("crossing") or [] if c is not None]
    sign = (f"Post-LN overtakes in {len(cross)}/{len(extra['crossing'])} seeds" if cross else
            f"no sign change, {extra['slope_per_doubling']:+z.3f} nats per doubling")
    d, near = table[-1]["diff"], min(abs(abs(x) - 0.05) for x in table[-1]["diff"])
    edge = f", the closest {near:z.3f} from the 0.05 margin" if near < 0.02 else ""
    parts.append(f"{_layout(summary, seq)} " + ", ".join(f"{x:+z.3f}" for x in d)
                 + f" at T/P {tpp[str(table[-1]['step'])]:z.2f} ({sign}{edge})")
  seeds = ", ".join(str(x) for x in summary.get("seeds") or [])
  return [f"Pre-LN minus Post-LN on seeds {seeds}: " + "; ".join(parts) + "."]


def answer(summary: dict) -> list[str]:
  """The study's "What to use" sentences (see the module docstring)."""
  if not summary.get("tables"):
    return []
  ref = _ref(summary)
  out = [_regime_line(summary)]
  out += [_ladder_line(summary, seq, ref) for seq in sorted(summary["tables"], key=int)]
  for line in (_confounder_line(summary, ref), _arm_line(summary), _schedule_line(summary)):
    if line:
      out.append(line)
  return out


def _table_lines(summary: dict, seq: str) -> list[str]:
  tpp = summary["tpp"][seq]
  lines = ["| step | T/P | rate Pre / Post (best measured; one rate: the pilots') | Pre-LN per seed | "
           "Post-LN per seed | Pre - Post per seed | "
           "on the 2nd windows | ahead |", "|---|---|---|---|---|---|---|---|"]
  for r in summary["tables"][seq]:
    def fmt(xs, fails=None):
      return ", ".join(f"{x:z.3f}" + (f" ({fails[i]})" if fails and fails[i] else "") for i, x in enumerate(xs))
    alt = "-" if not r.get("diff_alt") else ", ".join(f"{x:+z.3f}" for x in r["diff_alt"])
    lines.append(f"| {r['step']} | {tpp[str(r['step'])]:z.2f} | {r['lr']['pre']:g} / {r['lr']['post']:g} | "
                 f"{fmt(r['values']['pre'], r['failures']['pre'])} | {fmt(r['values']['post'], r['failures']['post'])}"
                 f" | {', '.join(f'{x:+z.3f}' for x in r['diff'])} | {alt} | {r['ahead']} |")
  return lines


def _caption(summary: dict) -> str:
  """The figure's caption, tied to the rates it plots: the thin curves at the longest point's best rates, the
  dots at each point's own; where they differ, a dot is not on its seed's curve (issue 63)."""
  parts = []
  for seq in sorted(summary["tables"], key=int):
    table = summary["tables"][seq]
    last = table[-1]["lr"]
    off = [r["step"] for r in table if r["lr"] != last]
    parts.append(f"sequence {seq}: curves at Pre-LN {last['pre']:g} / Post-LN {last['post']:g}"
                 + ("" if not off else "; the dots at step " + ", ".join(map(str, off)) + " at "
                    + ", ".join(sorted({f"{r['lr']['pre']:g} / {r['lr']['post']:g}" for r in table
                                        if r["step"] in off}))
                    + ", so they need not lie on the curves"))
  return ("*Pre-LN minus Post-LN per seed against tokens per parameter. Thin lines: the paired difference along "
          "the validation curves of the runs at the longest ladder point's rates; dots: each ladder point at its "
          "own best measured rates (a layout with one measured rate runs the pilots' choice at every point; "
          + "; ".join(parts) + "). Shaded: the rules' 0.05-nat margin.*")


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
      f"![paired difference against tokens per parameter]({rel}/ladder.png)", "", _caption(summary), ""]
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
  g = _ref(summary)
  if g:
    lines += [f"The committed gpu report (`{g['source']}`; git {g['git'][:10]}, about the code of that commit and the "
              f"design before issue 50: 500-step grid of three rates, seeds 0-2; {g['device']}): width "
              f"{g['width']}, {g['batch']} x {g['seq_len']} bytes a step, {g['steps']} steps, warm-up "
              f"{g['warmup']}, tau {g['tau']}, {g['params']:,} parameters, T/P {g['tpp']:z.2f}; best rates Pre-LN "
              f"{g['best']['pre']:g}, Post-LN {g['best']['post']:g}: Pre - Post "
              + ", ".join(f"{x:+z.3f}" for x in g["diff_best"])
              + f" per seed (over every rate where both train: {_span(g['diff_all'])}); on its own curves at those "
              "rates Post-LN overtakes at step " + ", ".join("never" if c is None else str(c) for c in g["crossing"])
              + " (T/P " + ", ".join("-" if c is None else f"{c * g['tokens_per_step'] / g['params']:z.2f}"
                                       for c in g["crossing"]) + ").", "",
              "What differs between the gpu run and these runs besides training length"
              + ("" if _seq_varied_or_same(summary, g) else " and sequence length (the `cpu-scale` preset's arm)")
              + ", gpu against here: " + "; ".join(confounders(summary, g)) + ".", ""]
  return "\n".join(lines)
