"""The "What to use" sentences of the second command's studies (issues 44, 50): DyT/Derf and QK-norm.

:func:`dyt_answer` reads the ``dyt`` summary's ``table`` (per T/P and norm: seed mean, min, max of the
final and best-of-curve validation loss), ``epochs`` and ``params``; :func:`qk_answer` reads the
``qk_norm`` summary's ``table`` (per layout, QK-norm and seed: the final loss and the peak attention
logit at each rate of ``config["lrs"]``). Numbers only, no verdict. Summaries without these fields
give no sentence.

Tokens per parameter (issue 50): the dyt study's "T/P" is *unique* training tokens per parameter (the
data available); the tokens *trained* per parameter are the passes times T/P (0.92 at T/P 1.84 in
``cpu-extra``: half a pass), the figure comparable with the papers' and the other studies' regimes. The
sentence gives both, named.
"""

from __future__ import annotations

import math

from experiments.studies.seeds import span

__all__ = ["dyt_answer", "qk_answer"]


def _pct(a: float, b: float) -> float:
  return 100.0 * (a - b) / b


def _fin(x) -> bool:
  return x is not None and math.isfinite(float(x))


def dyt_answer(summary: dict) -> list[str]:
  """Sentences from the ``dyt`` study's summary (see the module docstring)."""
  rows = {(r["tpp"], r["norm"]): r for r in summary.get("table") or []}
  if not rows:
    return []
  tpp = max(t for t, _ in rows)
  ln = rows.get((tpp, "layer_norm"))
  if ln is None or "best" not in ln:
    return []
  parts = []
  for norm, name in (("rms_norm", "RMSNorm"), ("dyt", "DyT"), ("derf", "Derf")):
    r = rows.get((tpp, norm))
    # ``best`` is the (seed mean, min, max) of the seeds' best validation losses (dyt.py's ``_stat``).
    if r is not None and _fin(r["best"][0]) and _fin(ln["best"][0]):
      parts.append(f"{name} {_pct(r['best'][0], ln['best'][0]):+z.1f}%")
  if not parts:
    return []
  passes = next((float(v) for k, v in (summary.get("epochs") or {}).items() if float(k) == float(tpp)), None)
  trained = f", {passes * tpp:z.2f} trained" if passes is not None else ""
  params = f", {summary['params']:,} parameters" if summary.get("params") else ""
  cfg = summary.get("config") or {}
  lay = (f"{cfg['n_layers']} layers, {cfg['batch_size']} x {cfg['seq_len']}, {cfg['steps']} steps; "
         if all(cfg.get(k) for k in ("n_layers", "batch_size", "seq_len", "steps")) else "")
  return [f"Norm-free layers ({lay}at the most data per parameter here, T/P {tpp:g} unique tokens per parameter"
          f"{trained}{params}): best validation loss against LayerNorm (seed means): "
          + ", ".join(parts) + "; below the papers' 2.9-29 trained tokens per parameter."]


def _diffs(pairs: dict, i: int) -> list[float]:
  """QK-norm minus no QK-norm at rate index ``i``, per seed where both runs finished."""
  return [q[i] - n[i] for n, q in pairs.values() if _fin(n[i]) and _fin(q[i])]


def _loss_effect(table: list, lrs: list, position: str) -> str:
  """The final-loss effect of QK-norm in one layout: at each seed's best rate (best with minus best
  without), and at each rate above the highest best rate without QK-norm (per-seed range over the seeds
  where both finished (each end by :func:`experiments.studies.seeds.signed`, so a difference that rounds to
  zero keeps its sign), how many seeds lower, how many runs diverged without and with QK-norm)."""
  pairs = {}
  for r in table:
    if r.get("position") == position and r.get("finals"):
      pairs.setdefault(r["seed"], [None, None])[bool(r["qk_norm"])] = [float(v) if _fin(v) else None
                                                                      for v in r["finals"]]
  pairs = {s: p for s, p in pairs.items() if p[0] and p[1]}
  if not pairs:
    return ""
  best = [min(v for v in q if v is not None) - min(v for v in n if v is not None) for n, q in pairs.values()]
  top = max(min(range(len(lrs)), key=lambda i, n=n: n[i] if n[i] is not None else math.inf) for n, _ in pairs.values())
  out = [f"at each seed's best rate {min(best):+z.3f} to {max(best):+z.3f} nats"]
  for i in range(top + 1, len(lrs)):
    d = _diffs(pairs, i)
    without = sum(n[i] is None for n, _ in pairs.values())
    with_qk = sum(q[i] is None for _, q in pairs.values())
    if d:
      gone = [f"{k} run{'s' if k > 1 else ''} {side} diverged" for k, side in
              ((without, "without it"), (with_qk, "with it")) if k]
      out.append(f"at {lrs[i]:g} {span(d)} ({sum(x < 0 for x in d)}/{len(d)} finishing pairs lower"
                 + "".join(f"; {g}" for g in gone) + ")")
  return ", ".join(out)


def _tpp(summary: dict, cfg: dict, train: dict) -> str:
  """``" (T/P 0.07)"``: trained tokens per parameter of the sweep's model (every parameter counted), or empty
  where the summary does not record the model or the layout."""
  from experiments.suite.runs import trained_tokens_per_param
  if not (summary.get("model") and train.get("batch_size") and train.get("seq_len") and cfg.get("n_layers")):
    return ""
  tpp = trained_tokens_per_param(summary["model"], cfg["n_layers"], cfg["steps"], train["batch_size"],
                                 train["seq_len"])
  return f" (T/P {tpp:z.2f})"


def _qk_regime(summary: dict, cfg: dict, lrs: list) -> str:
  """``"; 2 layers, width 64, 80 steps, rates 0.001-0.3"``: the sweep's regime, from what the summary
  records (empty where it records none)."""
  parts = []
  if cfg.get("n_layers"):
    parts.append(f"{cfg['n_layers']} layers")
  if (summary.get("model") or {}).get("d_model"):
    parts.append(f"width {summary['model']['d_model']}")
  train = (summary.get("provenance") or {}).get("train") or {}
  if train.get("batch_size") and train.get("seq_len"):
    parts.append(f"{train['batch_size']} x {train['seq_len']}")
  if cfg.get("steps"):
    parts.append(f"{cfg['steps']} steps" + _tpp(summary, cfg, train))
  if lrs:
    parts.append(f"rates {min(lrs):g}-{max(lrs):g}")
  return "; " + ", ".join(parts) if parts else ""


def qk_answer(summary: dict) -> list[str]:
  """Sentences from the ``qk_norm`` study's summary (see the module docstring)."""
  table = summary.get("table") or []
  top = {}
  for r in table:
    peaks = [p for p in r.get("peak_logits") or [] if p is not None and math.isfinite(p)]
    if r.get("position") == "pre" and peaks:
      top.setdefault(bool(r["qk_norm"]), []).append(max(peaks))
  if not top.get(True) or not top.get(False):
    return []
  cfg = summary.get("config") or {}
  lrs = [float(v) for v in cfg.get("lrs") or []]
  out = [f"QK-norm (Pre-LN{_qk_regime(summary, cfg, lrs)}): largest attention logit over the rate sweep "
         f"{min(top[True]):z.3g}-{max(top[True]):z.3g} with it, {min(top[False]):z.3g}-{max(top[False]):z.3g} "
         "without (per seed)."]
  pre, post = (_loss_effect(table, lrs, p) if lrs else "" for p in ("pre", "post"))
  if pre:
    gone = [f"{k} Post-LN run{'s' if k > 1 else ''} {side} QK-norm diverged"
            for side, qk in (("without", False), ("with", True))
            if (k := sum(1 for r in table if r.get("position") == "post" and bool(r.get("qk_norm")) == qk
                         for v in r.get("finals") or [] if not _fin(v)))]
    out[0] += (f" Final loss with minus without: {pre}" + (f"; Post-LN {post.split(', at ')[0]}" if post else "")
               + "".join(f"; {g}" for g in gone) + f" ({_diff_noise(summary)}).")
  return out


def _diff_noise(summary: dict) -> str:
  """The noise of a difference of two final losses, from the evaluation size the run recorded (the Limitations'
  estimate: a per-byte s.d. of about 2 nats, times sqrt(2) for a difference), or a pointer to the Limitations."""
  from experiments.suite.report_summary import noise_estimate
  train = (summary.get("provenance") or {}).get("train") or {}
  size = [train.get(k) for k in ("eval_batches", "batch_size", "seq_len")]
  if not all(size):
    return "evaluation noise: Limitations"
  n = noise_estimate(int(size[0]) * int(size[1]) * int(size[2])) * 2 ** 0.5
  return (f"a difference of two evaluations carries at most about {n:z.2f} nats of noise (the runs share their "
          "windows): Limitations")
