r"""Experiment 2: warm-up and learning-rate sensitivity (Xiong et al. 2020, Sec. 3-4).

Post-LN and Pre-LN models trained with Adam(0.9, 0.98) and the inverse-square-root schedule at
the peak learning rates of the preset, each without and with a linear warm-up; RMSNorm variants
and GPT-2's small initialization at the largest learning rate without warm-up (the case the
paper says fails). Reported: validation-loss curves, the final validation loss or the step of
divergence, and the step at which Pre-LN reaches Post-LN's final validation loss.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments import claims as claims_lib
from experiments.context import run_label, train_run

TITLE = "Warm-up and learning-rate sensitivity (Xiong et al. 2020, Sec. 3-4)"
RAW_DATA = ('runs.json', 'final.csv')  # files the report links under the claims

MARGIN = 0.05      # nats: a smaller difference of final validation losses counts as "the same"
FASTER = 0.9       # Pre-LN is "faster" if it needs <= this fraction of Post-LN's steps


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the warm-up experiment.

  Attributes:
    n_layers: depth of every model.
    steps: optimizer updates per run.
    lrs: peak learning rates.
    warmup: linear warm-up steps of the "with warm-up" runs.
    norm_types: ``"layer_norm"`` gets the full grid; ``"rms_norm"`` runs Post/Pre at the largest
      learning rate without warm-up.
    small_init: also run GPT-2's small init (LayerNorm, largest lr, no warm-up).
    seed: the training seed.
  """

  n_layers: int = 6
  steps: int = 300
  lrs: tuple = (5e-4, 1e-3)
  warmup: int = 60
  norm_types: tuple = ("layer_norm", "rms_norm")
  small_init: bool = True
  seed: int = 0


def run_specs(cfg: Config) -> list[dict]:
  """The runs of the warm-up experiment, as specs for :func:`~experiments.context.train_run`.

  LayerNorm with Xavier init: Post-LN and Pre-LN at every learning rate, each with warm-up 0 and
  ``cfg.warmup``; at the largest learning rate without warm-up, Post-LN and Pre-LN also with
  RMSNorm (if ``"rms_norm"`` is in ``cfg.norm_types``) and with small init (if ``cfg.small_init``).

  Returns:
    Dicts with ``norm_position``, ``norm_type``, ``init``, ``lr`` and ``warmup``.
  """
  specs = []
  for lr in cfg.lrs:
    for pos in ("post", "pre"):
      for w in (0, cfg.warmup):
        specs.append({"norm_position": pos, "norm_type": "layer_norm", "init": "xavier", "lr": lr, "warmup": w})
  top = max(cfg.lrs)
  if "rms_norm" in cfg.norm_types:
    for pos in ("post", "pre"):
      specs.append({"norm_position": pos, "norm_type": "rms_norm", "init": "xavier", "lr": top, "warmup": 0})
  if cfg.small_init:
    for pos in ("post", "pre"):
      specs.append({"norm_position": pos, "norm_type": "layer_norm", "init": "small", "lr": top, "warmup": 0})
  return specs


def steps_to_reach(val_steps, val, target):
  """First evaluation step at which ``val <= target`` (None if never)."""
  for s, v in zip(val_steps, val):
    if np.isfinite(v) and v <= target:
      return int(s)
  return None


def _final(r):
  v = r["final_val_loss"]
  return float("nan") if v is None else float(v)


def verdicts(runs: dict, cfg: Config) -> tuple[list[dict], dict]:
  """The claims of the warm-up experiment (LayerNorm, Xavier runs).

  Run a is *worse* than run b if a diverges and b does not, or neither diverges and a's final val
  loss exceeds b's by more than ``MARGIN`` (0.05 nats). W is ``cfg.warmup``.

  * ``xiong_postln_needs_warmup``: Post-LN without warm-up is worse than with W steps: yes at
    every learning rate, partly at some, no at none.
  * ``xiong_postln_lr_sensitive``: with warm-up, Post-LN at the largest learning rate is worse
    than at the smallest: yes or no; n/a with one learning rate.
  * ``xiong_preln_no_warmup``: Pre-LN without warm-up is not worse than with: yes / partly / no
    as above.
  * ``xiong_preln_faster``: per learning rate at which Post-LN with warm-up did not diverge, the
    first eval step at which Pre-LN without warm-up reaches Post-LN's final val loss, over the
    step at which Post-LN first reaches it; passes if ``<= FASTER`` (0.9), fails if Pre-LN never
    reaches it. yes if some learning rate was judged and all passed, partly if some passed, no
    otherwise. Its note keeps an ``{eval_every}`` placeholder that :func:`run` fills in.

  Args:
    runs: per-run results keyed by :func:`~experiments.context.run_label` (``final_val_loss``, ``diverged``,
      ``diverged_at``, ``val_curve``).
    cfg: the experiment's config.

  Returns:
    ``(claims, extra)``: claim dicts with ``id``, ``ours``, ``holds`` and, for most, ``note``;
    ``extra["preln_speed"]`` maps ``str(lr)`` to ``target``, ``pre_steps``, ``post_steps`` and
    ``fraction``.
  """
  def get(pos, lr, w, norm="layer_norm", init="xavier"):
    return runs[run_label({"norm_position": pos, "norm_type": norm, "init": init, "lr": lr, "warmup": w}, cfg.n_layers)]

  def worse(a, b):  # run a is worse than run b
    if a["diverged"] and not b["diverged"]:
      return True
    return (not a["diverged"]) and (not b["diverged"]) and _final(a) > _final(b) + MARGIN

  def desc(r):
    return f"diverged at {r['diverged_at']}" if r["diverged"] else f"{_final(r):.3f}"

  claims, extra = [], {}
  W = cfg.warmup
  # Post-LN needs warm-up.
  parts, oks = [], []
  for lr in cfg.lrs:
    a, b = get("post", lr, 0), get("post", lr, W)
    parts.append(f"lr {lr:g}: {desc(a)} without vs {desc(b)} with warm-up")
    oks.append(worse(a, b))
  claims.append({"id": "xiong_postln_needs_warmup", "ours": "Post-LN final val loss, " + "; ".join(parts),
                 "holds": claims_lib.verdict(oks),
                 "note": f"holds where no-warm-up is worse by > {MARGIN} nats or diverges"})
  # LR sensitivity with warm-up.
  if len(cfg.lrs) >= 2:
    lo, hi = min(cfg.lrs), max(cfg.lrs)
    a, b = get("post", hi, W), get("post", lo, W)
    pa, pb = get("pre", hi, W), get("pre", lo, W)
    claims.append({"id": "xiong_postln_lr_sensitive",
                   "ours": f"with {W}-step warm-up, Post-LN: {desc(b)} at lr {lo:g} vs {desc(a)} at lr {hi:g} "
                           f"(Pre-LN: {desc(pb)} vs {desc(pa)})",
                   "holds": "yes" if worse(a, b) else "no",
                   "note": f"holds if the larger lr is worse by > {MARGIN} nats or diverges"})
  else:
    claims.append({"id": "xiong_postln_lr_sensitive", "ours": "one learning rate only", "holds": "n/a"})
  # Pre-LN without warm-up.
  parts, oks = [], []
  for lr in cfg.lrs:
    a, b = get("pre", lr, 0), get("pre", lr, W)
    parts.append(f"lr {lr:g}: {desc(a)} without vs {desc(b)} with")
    oks.append(not worse(a, b))
  claims.append({"id": "xiong_preln_no_warmup", "ours": "Pre-LN final val loss, " + "; ".join(parts),
                 "holds": claims_lib.verdict(oks),
                 "note": f"holds where no-warm-up is not worse by > {MARGIN} nats"})
  # Pre-LN faster: steps of Pre-LN (no warm-up) to reach Post-LN's (with warm-up) final val loss.
  parts, oks, speed = [], [], {}
  for lr in cfg.lrs:
    post, pre = get("post", lr, W), get("pre", lr, 0)
    if post["diverged"]:
      parts.append(f"lr {lr:g}: Post-LN diverged")
      continue
    target = _final(post)
    ps, pv = zip(*post["val_curve"])
    s_post = steps_to_reach(ps, [float(v) for v in pv], target + 1e-9)
    qs, qv = zip(*pre["val_curve"]) if pre["val_curve"] else ((), ())
    s_pre = steps_to_reach(qs, [float(v) for v in qv], target)
    if s_pre is None:
      parts.append(f"lr {lr:g}: Pre-LN never reaches {target:.3f}")
      oks.append(False)
      continue
    frac = s_pre / s_post
    speed[str(lr)] = {"target": target, "pre_steps": s_pre, "post_steps": s_post, "fraction": frac}
    parts.append(f"lr {lr:g}: {s_pre} vs {s_post} steps ({100 * (1 - frac):.0f}% sooner)")
    oks.append(frac <= FASTER)
  extra["preln_speed"] = speed
  claims.append({"id": "xiong_preln_faster",
                 "ours": "Pre-LN (no warm-up) reaches Post-LN's (warm-up) final val loss: " + "; ".join(parts),
                 "holds": (claims_lib.verdict(oks) if oks else "no"),
                 "note": f"eval every {{eval_every}} steps; 'sooner' = <= {FASTER:.0%} of the steps"})
  return claims, extra


def _smooth(y, k=10):
  y = np.asarray(y, np.float64)
  if len(y) < k:
    return y
  kernel = np.ones(k) / k
  return np.convolve(np.pad(y, (k - 1, 0), mode="edge"), kernel, mode="valid")


def plot(ctx, runs: dict, cfg: Config) -> list[str]:
  """Draws the figures of the warm-up experiment into its folder.

  ``warmup_lr_curves.png``: per learning rate, Post-LN and Pre-LN (LayerNorm, Xavier) with and
  without warm-up: validation loss, training loss (10-step moving average) and divergence steps;
  ``no_warmup_variants.png`` (if RMSNorm or small-init runs exist): validation loss without
  warm-up at the largest learning rate, LayerNorm beside those variants.

  Args:
    ctx: the suite context (saves the figures).
    runs: per-run results of :func:`run`, keyed by :func:`~experiments.context.run_label`.
    cfg: the experiment's config.

  Returns:
    The PNG file names.
  """
  files = []
  fig, axes = ctx.subplots(1, len(cfg.lrs), figsize=(5.5 * len(cfg.lrs), 3.8), squeeze=False)
  for i, lr in enumerate(cfg.lrs):
    ax = axes[0, i]
    for pos, color in (("post", "C3"), ("pre", "C0")):
      for w, ls in ((0, "-"), (cfg.warmup, "--")):
        r = runs[run_label({"norm_position": pos, "norm_type": "layer_norm", "init": "xavier", "lr": lr, "warmup": w},
                       cfg.n_layers)]
        name = f"{'Post' if pos == 'post' else 'Pre'}-LN, {'no warm-up' if w == 0 else f'warm-up {w}'}"
        ts, tl = zip(*r["train_curve"]) if r["train_curve"] else ((), ())
        ax.plot(ts, _smooth([float(v) for v in tl]), ls, color=color, lw=0.8, alpha=0.5)
        if r["val_curve"]:
          vs, vl = zip(*r["val_curve"])
          ax.plot(vs, [float(v) for v in vl], ls, color=color, marker="o", ms=3, label=name)
        if r["diverged"]:
          ax.axvline(r["diverged_at"], color=color, ls=":", lw=1)
    ax.set_title(f"peak lr {lr:g} (LayerNorm, Xavier, L={cfg.n_layers})", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte): val = markers, train = thin")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Warm-up and learning rate: validation loss", fontsize=10)
  files.append(ctx.save_figure(fig, "warmup_lr_curves.png"))

  others = [k for k, r in runs.items() if r["spec"]["norm_type"] == "rms_norm" or r["spec"]["init"] == "small"]
  if others:
    top = max(cfg.lrs)
    fig, ax = ctx.subplots(figsize=(6.5, 4))
    base = [run_label({"norm_position": p, "norm_type": "layer_norm", "init": "xavier", "lr": top, "warmup": 0},
                  cfg.n_layers) for p in ("post", "pre")]
    for i, k in enumerate(base + others):
      r = runs[k]
      if r["val_curve"]:
        vs, vl = zip(*r["val_curve"])
        ax.plot(vs, [float(v) for v in vl], "-" if r["spec"]["norm_position"] == "post" else "--",
                color=f"C{i}", marker="o", ms=3, label=k)
    ax.set_title(f"No warm-up at lr {top:g}: LayerNorm vs RMSNorm vs small init", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    files.append(ctx.save_figure(fig, "no_warmup_variants.png"))
  return files


def run(ctx, cfg: Config) -> dict:
  """Runs the warm-up experiment; returns its summary.

  Trains (or loads from the cache) every spec of :func:`run_specs` with seed ``cfg.seed``,
  judges the claims (:func:`verdicts`), and writes ``runs.json``, ``final.csv`` and the plots.

  Args:
    ctx: the suite's :class:`~experiments.suite.Context`.
    cfg: the experiment's :class:`Config`.

  Returns:
    ``claims``, ``files``, ``seeds``, ``table`` (final val loss and divergence step per run),
    ``preln_speed`` (from :func:`verdicts`), ``unigram_nats`` (the corpus's unigram entropy, a
    baseline) and ``model``.
  """
  runs = {}
  for spec in ctx.iterate(run_specs(cfg), desc="runs"):
    r = train_run(ctx, spec, cfg.n_layers, cfg.steps, seed=cfg.seed)
    runs[run_label(spec, cfg.n_layers)] = {"spec": spec, **{k: r.summary.get(k) for k in (
        "final_val_loss", "diverged", "diverged_at", "tokens_per_s", "steps_done", "val_curve")},
        "train_curve": r.summary.get("train_curve"), "run": r.path.name}
  claims, extra = verdicts(runs, cfg)
  for c in claims:
    c["note"] = c.get("note", "").replace("{eval_every}", str(ctx.preset["train"]["eval_every"]))
  ctx.save_json("runs.json", runs)
  ctx.save_csv("final.csv", ["run", "final_val_loss", "diverged_at", "tokens_per_s"],
               ([k, r["final_val_loss"], r["diverged_at"], r["tokens_per_s"]] for k, r in runs.items()))
  files = plot(ctx, runs, cfg)
  table = [{"run": k, "final": r["final_val_loss"], "diverged_at": r["diverged_at"]} for k, r in runs.items()]
  from experiments import data as data_lib
  return {"claims": claims, "files": files, "seeds": [cfg.seed], "table": table, **extra,
          "unigram_nats": data_lib.unigram_entropy_nats(ctx.corpus()), "model": dict(ctx.preset["model"])}


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the warm-up experiment: the setup (with the unigram baseline), the plots,
  the per-run table.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.report`.
  """
  cfg = summary["config"]
  lines = [
      f"Setup: {cfg['n_layers']}-layer byte-level LMs (width {summary['model']['d_model']}), AdamW(0.9, 0.98), "
      f"inverse-sqrt schedule, {cfg['steps']} steps, peak lr {cfg['lrs']}, warm-up 0 or {cfg['warmup']} steps, "
      f"seed {cfg['seed']}. The unigram baseline is {summary['unigram_nats']:.3f} nats/byte. "
      "The paper trains for tens of thousands of steps with 4000 warm-up steps; this is the early "
      "phase of training at a much smaller scale.", "",
      f"![warm-up curves]({rel}/warmup_lr_curves.png)", "",
  ]
  if "no_warmup_variants.png" in summary["files"]:
    lines += [f"![variants]({rel}/no_warmup_variants.png)", ""]
  lines += ["| run | final val loss | diverged at |", "|---|---|---|"]
  for r in summary["table"]:
    f = "-" if r["final"] is None else f"{float(r['final']):.4f}"
    lines.append(f"| {r['run']} | {f} | {r['diverged_at'] or '-'} |")
  lines.append("")
  return "\n".join(lines)
