r"""Experiment 7: QK-norm and attention-logit growth (Wortsman et al. 2023, arXiv:2309.14322).

The same small model trained over a grid of peak learning rates spanning at least two decades,
with and without QK-norm (LayerNorm over each head's queries and keys, one scale and bias per
head), in the Pre-LN layout the paper studies and in Post-LN beside it. Each run logs, inside its
jitted step, the largest attention logit :math:`\max z_{ij}`, :math:`z_{ij} = q_i\cdot k_j/\sqrt{d_h}`,
and the mean attention entropy of every layer (:mod:`experiments.harness.train`). From them:

* the final validation loss against the learning rate;
* the largest attention logit over training, and its growth factor (peak / step 1);
* Wortsman et al.'s LR sensitivity,
  :math:`\mathbb E_{\eta}[\min(\ell(\eta), \ell_0) - \min_\eta \ell(\eta)]`.

The verdict and testability rules are in :mod:`experiments.studies.qk_norm_rules` (fixed before
the first run; the sources read and not read are listed there).

The recipe, theirs (Sec. 2.1) beside ours:

=====================  ==========================================  ===========================================
                       Wortsman et al.                              here
=====================  ==========================================  ===========================================
optimizer              AdamW, b1 0.9, b2 0.95, eps 1e-8             optax AdamW, b1 0.9, b2 0.95, eps 1e-8
clipping               global norm 1                                global norm 1
warm-up                linear, 5e3 of 1e5 steps (5%)                linear, ``warmup_frac`` (5%) of the steps
schedule               cosine decay to a minimum lr of 1e-5         cosine decay to 0.1 x peak (the harness's)
weight decay           independent, 1e-4                            1e-4 x the schedule's shape, not x the
                                                                    peak rate (optax's decay is lr x wd: wd =
                                                                    1e-4 / peak), on weight matrices and
                                                                    embeddings only (issue 32: never on norm
                                                                    scales or biases)
z-loss                 1e-4                                         ``z_loss`` (1e-4), the logged and
                                                                    evaluated loss the cross-entropy alone
model                  Pre-LN with qk-layernorm, many sizes         byte-level LM of the preset's width, Pre-
                                                                    and Post-LN, ``n_layers`` layers
=====================  ==========================================  ===========================================
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from experiments.studies import qk_norm_rules as rules
from experiments.studies.seeds import SPIKE_NATS, largest_rise
from experiments.suite.study import Unit
from experiments.studies.extra_answer import qk_answer as answer  # noqa: F401 (the study protocol's answer)
from experiments.studies.summary_lines import qk_norm_instabilities as instabilities  # noqa: F401 (the protocol's)

TITLE = "QK-norm and attention-logit growth (Wortsman et al. 2023)"
RAW_DATA = ("runs.json", "lr_sweep.csv")  # files the report links under the claims
HEADLINE = ("qk_norm.png",)               # figures of the report's first screen


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the QK-norm study.

  Attributes:
    n_layers: model depth.
    steps: optimizer updates per run.
    lrs: the peak learning rates, ascending, spanning at least two decades.
    seeds: training seeds.
    positions: norm layouts (``"pre"`` is judged; ``"post"`` is an observation beside it).
    qk_norm: the QK norm of the "with" runs (``"layer_norm"``: the paper's qk-layernorm).
    qk_norm_scale: ``"per_head"`` or ``"shared"``.
    warmup_frac: linear warm-up, as a fraction of ``steps`` (the paper: 5%).
    b2: AdamW's second-moment decay (the paper: 0.95).
    clip_norm: global-norm clipping (the paper: 1).
    independent_weight_decay: the per-step decay at the peak of the schedule, not multiplied by
      the learning rate (the paper: 1e-4); weight matrices and embeddings only, never norm
      scales or biases (:func:`experiments.harness.train_config.decay_mask`).
    z_loss: the auxiliary z-loss weight (the paper: 1e-4).
  """

  n_layers: int = 2
  steps: int = 80
  lrs: tuple = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
  seeds: tuple = (0,)
  positions: tuple = ("pre", "post")
  qk_norm: str = "layer_norm"
  qk_norm_scale: str = "per_head"
  warmup_frac: float = 0.05
  b2: float = 0.95
  clip_norm: float = 1.0
  independent_weight_decay: float = 1e-4
  z_loss: float = 1e-4

  def __post_init__(self):
    lrs = [float(v) for v in self.lrs]
    if len(lrs) < 2 or lrs != sorted(lrs) or lrs[0] <= 0:
      raise ValueError(f"lrs must be at least two ascending positive rates, got {self.lrs!r}.")
    if lrs[-1] / lrs[0] < 100 * (1 - 1e-9):
      raise ValueError(f"lrs must span at least two decades (max / min >= 100), got {lrs[-1] / lrs[0]:z.3g} "
                       f"for {self.lrs!r}.")
    if "pre" not in self.positions:
      raise ValueError(f"positions must include 'pre' (the judged layout), got {self.positions!r}.")
    if not 0 <= self.warmup_frac < 1:
      raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac!r}.")


def label(pos: str, qk: bool, lr: float, seed: int, n_layers: int) -> str:
  """Run label, e.g. ``"qk-pre-qkln-L2-lr0.1-s0"``."""
  return f"qk-{pos}-{'qkln' if qk else 'noqk'}-L{n_layers}-lr{lr:g}-s{seed}"


def grid(cfg: Config) -> list[tuple]:
  """Every run of the study as ``(position, qk, lr, seed)``, in the order :func:`run` trains them."""
  return [(pos, qk, lr, seed) for pos in cfg.positions for qk in (False, True) for lr in cfg.lrs
          for seed in cfg.seeds]


def units(cfg: Config) -> list[Unit]:
  """The training runs of :func:`run` (one per :func:`grid` point), in its order (for the planner).

  Runs that differ only in the rate or the seed share a compiled step; QK-norm changes the program.
  """
  return [Unit("qk_norm", label(pos, qk, lr, seed, cfg.n_layers), cfg.n_layers, cfg.steps,
               ("train", cfg.n_layers, pos, "layer_norm", "jaxnorm", "qk" if qk else ""))
          for pos, qk, lr, seed in grid(cfg)]


def _train(ctx, cfg: Config, pos: str, qk: bool, lr: float, seed: int):
  mc = ctx.model_config(n_layers=cfg.n_layers, norm_position=pos, norm_type="layer_norm", init="xavier",
                        qk_norm=cfg.qk_norm if qk else "none", qk_norm_scale=cfg.qk_norm_scale)
  tc = ctx.train_config(mc, steps=cfg.steps, lr=lr, warmup=max(1, round(cfg.warmup_frac * cfg.steps)),
                        schedule="cosine", b2=cfg.b2, clip_norm=cfg.clip_norm,
                        weight_decay=cfg.independent_weight_decay / lr, seed=seed, log_attention=True,
                        z_loss=cfg.z_loss)
  return ctx.train(tc, label(pos, qk, lr, seed, cfg.n_layers))


def summarize_run(run) -> dict:
  """What the study keeps of one :class:`~experiments.suite.runs.RunResult`."""
  s = run.summary
  rows = [m for m in run.metrics if "attn_max_logit" in m and "loss" in m]
  curve = [(int(m["step"]), [float(v) for v in m["attn_max_logit"]]) for m in rows]
  ent = [float(np.mean([float(v) for v in m["attn_entropy"]])) for m in rows]
  val = s.get("val_curve") or []
  init = float(val[0][1]) if val and int(val[0][0]) == 0 else float("nan")
  final = s.get("final_val_loss")
  rise = largest_rise(s.get("train_curve"))
  return {"final": None if final is None else float(final), "diverged": bool(s.get("diverged")),
          "diverged_at": s.get("diverged_at"), "init_loss": init, "growth": rules.logit_growth(curve),
          "shape": rules.level_off([c[0] for c in curve], [max(c[1]) for c in curve]), "rise": rise,
          "unstable": bool(s.get("diverged")) or (rise is not None and rise["rise"] > SPIKE_NATS),
          "logit_steps": [c[0] for c in curve], "logit_max": [max(c[1]) for c in curve],
          "entropy_min": min(ent) if ent else float("nan"), "entropy_final": ent[-1] if ent else float("nan"),
          "run": run.path.name}


def judge(runs: dict, cfg: Config) -> tuple[list[dict], dict]:
  """The claims and the per-(position, qk, seed) LR sensitivity, from :func:`summarize_run` results.

  ``runs`` is keyed ``(position, qk, lr, seed)``.
  """
  top = cfg.lrs[-1]
  sens, init, best = {}, {}, {}
  for pos in cfg.positions:
    for qk in (False, True):
      for seed in cfg.seeds:
        rs = [runs[(pos, qk, lr, seed)] for lr in cfg.lrs]
        init[(pos, qk, seed)] = rules.init_loss(r["init_loss"] for r in rs)   # one l0 per grid (issue 50)
        sens[(pos, qk, seed)] = rules.lr_sensitivity([r["final"] for r in rs], init[(pos, qk, seed)])
        best[(pos, qk, seed)] = min((float(r["final"]) for r in rs if r["final"] is not None), default=float("nan"))
  per = {seed: {"noqk": runs[("pre", False, top, seed)]["growth"], "qk": runs[("pre", True, top, seed)]["growth"],
                "qk_diverged_at": runs[("pre", True, top, seed)]["diverged_at"],
                "noqk_shape": runs[("pre", False, top, seed)]["shape"]} for seed in cfg.seeds}
  per_sens = {}
  for seed in cfg.seeds:
    no, qk = ([runs[("pre", q, lr, seed)] for lr in cfg.lrs] for q in (False, True))
    per_sens[seed] = {"finals_noqk": [r["final"] for r in no], "finals_qk": [r["final"] for r in qk],
                      "init_noqk": init[("pre", False, seed)], "init_qk": init[("pre", True, seed)],
                      "noqk_top": runs[("pre", False, top, seed)]["growth"], "lrs": list(cfg.lrs)}
  claims = [rules.claim_logit_growth(per), rules.claim_lr_sensitivity(per_sens)]
  if "post" in cfg.positions:
    claims.append(rules.claim_post_ln({seed: {"best_noqk": best[("post", False, seed)],
                                              "best_qk": best[("post", True, seed)],
                                              "lrs_noqk": sens[("post", False, seed)],
                                              "lrs_qk": sens[("post", True, seed)],
                                              "noqk_top": runs[("post", False, top, seed)]["growth"],
                                              "qk_top": runs[("post", True, top, seed)]["growth"]}
                                       for seed in cfg.seeds}))
  return claims, sens


def run(ctx, cfg: Config) -> dict:
  """Runs the QK-norm study; returns its summary (claims, files, seeds, table, sensitivity).

  Every (position, QK-norm or not, rate, seed) is one cached training run (:func:`grid`,
  :func:`units`); the claims are judged by :mod:`experiments.studies.qk_norm_rules`.
  """
  runs = {}
  for key in ctx.iterate(grid(cfg), desc="runs"):
    runs[key] = summarize_run(_train(ctx, cfg, *key))
  claims, sens = judge(runs, cfg)
  flat = [{"position": p, "qk_norm": qk, "lr": lr, "seed": s, **r} for (p, qk, lr, s), r in runs.items()]
  ctx.save_json("runs.json", flat)
  ctx.save_csv("lr_sweep.csv", ["position", "qk_norm", "lr", "seed", "final_val_loss", "diverged", "init_loss",
                                "peak_logit", "logit_growth", "entropy_min", "entropy_final"],
               ([r["position"], r["qk_norm"], r["lr"], r["seed"], r["final"], r["diverged"], r["init_loss"],
                 r["growth"]["peak"], r["growth"]["growth"], r["entropy_min"], r["entropy_final"]] for r in flat))
  table = [{"position": p, "qk_norm": qk, "seed": s, "lr_sensitivity": v,
            "finals": [runs[(p, qk, lr, s)]["final"] for lr in cfg.lrs],
            "peak_logits": [runs[(p, qk, lr, s)]["growth"]["peak"] for lr in cfg.lrs]}
           for (p, qk, s), v in sens.items()]
  files = plot(ctx, runs, cfg)
  # Every run that crossed the harness's divergence threshold, for the report's instability list.
  diverged = [{"position": p, "qk_norm": qk, "lr": lr, "seed": s, "step": r["diverged_at"]}
              for (p, qk, lr, s), r in runs.items() if r["diverged"]]
  return {"claims": claims, "files": files, "seeds": list(cfg.seeds), "table": table,
          "diverged": diverged, "model": dict(ctx.preset["model"])}


def _style(pos: str, qk: bool) -> dict:
  return {"color": "C0" if pos == "pre" else "C3", "ls": "-" if qk else "--",
          "label": f"{'Pre' if pos == 'pre' else 'Post'}-LN {'+ QK-norm' if qk else 'no QK-norm'}"}


def plot(ctx, runs: dict, cfg: Config) -> list[str]:
  """Draws ``qk_norm.png``: final loss vs rate, peak logit vs rate, the logit curves at the top rate.

  Seed means with the seed range; a diverged run is drawn at its initial loss with an ``x``.
  """
  fig, axes = ctx.subplots(1, 3, figsize=(15, 4))
  top = cfg.lrs[-1]
  for pos in cfg.positions:
    for qk in (False, True):
      st = _style(pos, qk)
      finals = np.array([[r["final"] if r["final"] is not None else r["init_loss"]
                          for r in (runs[(pos, qk, lr, s)] for s in cfg.seeds)] for lr in cfg.lrs], float)
      axes[0].plot(cfg.lrs, finals.mean(1), marker="o", ms=3, **st)
      if len(cfg.seeds) > 1:
        axes[0].fill_between(cfg.lrs, finals.min(1), finals.max(1), color=st["color"], alpha=0.15)
      for i, lr in enumerate(cfg.lrs):
        if any(runs[(pos, qk, lr, s)]["diverged"] for s in cfg.seeds):
          axes[0].plot([lr], [finals[i].mean()], "x", color=st["color"], ms=8)
      peaks = np.array([[runs[(pos, qk, lr, s)]["growth"]["peak"] for s in cfg.seeds] for lr in cfg.lrs], float)
      axes[1].plot(cfg.lrs, np.nanmean(peaks, 1), marker="o", ms=3, **st)
      r = runs[(pos, qk, top, cfg.seeds[0])]
      if r["logit_steps"]:
        axes[2].plot(r["logit_steps"], np.maximum(r["logit_max"], 1e-3), lw=0.9, **st)
        if r["diverged"]:   # the curve is truncated there: mark it (issue 32)
          axes[2].plot([r["logit_steps"][-1]], [max(r["logit_max"][-1], 1e-3)], "X", color=st["color"], ms=9)
          end = (r["logit_steps"][-1], max(r["logit_max"][-1], 1e-3))
          axes[2].annotate(f"diverged at step {r['diverged_at']}", end, fontsize=7, color=st["color"],
                           xytext=(4, -10), textcoords="offset points")
  axes[0].set_xscale("log")
  axes[0].set_xlabel("peak learning rate")
  axes[0].set_ylabel("final validation loss (nats)")
  axes[0].set_title("final loss vs learning rate (x: diverged, drawn at the initial loss)", fontsize=9)
  axes[1].set_xscale("log")
  axes[1].set_yscale("log")
  axes[1].set_xlabel("peak learning rate")
  axes[1].set_ylabel("largest attention logit over training")
  axes[1].set_title("peak attention logit (any layer)", fontsize=9)
  axes[2].set_yscale("log")
  axes[2].set_xlabel("step")
  axes[2].set_ylabel("largest attention logit (any layer)")
  axes[2].set_title(f"attention logits over training at lr {top:g} (seed {cfg.seeds[0]}; X: diverged, curve ends)",
                    fontsize=9)
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  return [ctx.save_figure(fig, "qk_norm.png")]


def _f(v) -> str:
  if v is None:
    return "div."
  v = float(v)
  return f"{v:z.3f}" if math.isfinite(v) else str(v)


def report_section(summary: dict, rel: str) -> str:
  """Markdown section: the recipe beside the paper's, the plot, the per-layout table.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.suite.report`.
  """
  cfg = summary["config"]
  lrs = cfg["lrs"]
  warm = max(1, round(cfg["warmup_frac"] * cfg["steps"]))
  lines = [
      f"Setup: {cfg['n_layers']}-layer byte-level LMs (LayerNorm, Xavier init), {cfg['steps']} steps, peak rates "
      f"{', '.join(f'{v:g}' for v in lrs)} ({lrs[-1] / lrs[0]:z.0f}x), seeds {', '.join(map(str, cfg['seeds']))}; "
      f"with and without QK-norm ({cfg['qk_norm']}, {cfg['qk_norm_scale'].replace('_', '-')} scale).", "",
      "| recipe | Wortsman et al. (Sec. 2.1; C4, batch 256 x 512 tokens, 1e5 steps) | here |", "|---|---|---|",
      f"| optimizer | AdamW b1 0.9, b2 0.95, eps 1e-8 | AdamW b1 0.9, b2 {cfg['b2']:g}, eps 1e-8 |",
      f"| clipping | global norm 1 | global norm {cfg['clip_norm']:g} |",
      f"| warm-up | linear, 5e3 of 1e5 steps | linear, {warm} of {cfg['steps']} steps |",
      "| schedule | cosine to a minimum of 1e-5 | cosine to 0.1 x peak |",
      f"| weight decay | independent 1e-4 | independent {cfg['independent_weight_decay']:g} (optax wd = that / peak "
      "lr), on weight matrices and embeddings only (not on norm scales or biases) |",
      f"| z-loss | 1e-4 | {cfg.get('z_loss', 0.0):g} (the reported losses are the cross-entropy alone) |", "",
      "A diverged run is reported as 'diverged at step k', never judged as if it had finished; in the LR "
      "sensitivity it counts as its model's initial loss (each grid capped at its own). A seed's LR sensitivity "
      "is judged where the run without QK-norm grows its logits at the top rate.", "",
      f"![qk norm]({rel}/qk_norm.png)", "",
      "| layout | seed | LR sensitivity | " + " | ".join(f"final @ {v:g}" for v in lrs) + " | peak logit @ "
      f"{lrs[-1]:g} |", "|---|---|---|" + "---|" * len(lrs) + "---|"]
  for r in summary["table"]:
    name = f"{'Pre' if r['position'] == 'pre' else 'Post'}-LN {'+ QK-norm' if r['qk_norm'] else 'no QK-norm'}"
    lines.append(f"| {name} | {r['seed']} | {r['lr_sensitivity']:z.3f} | " + " | ".join(_f(v) for v in r["finals"])
                 + f" | {float(r['peak_logits'][-1]):z.3g} |")
  lines.append("")
  return "\n".join(lines)


def reanalyse(ctx, cfg: Config, summary: dict) -> dict:
  """The summary with its claims judged again from the folder's ``runs.json`` (no training; the
  tables and figures are kept: they do not depend on the rules; :mod:`experiments.suite.reanalyse`)."""
  from experiments.suite.registry import read_json
  runs = {(r["position"], bool(r["qk_norm"]), float(r["lr"]), int(r["seed"])): r
          for r in read_json(ctx.exp_dir / "runs.json")}
  claims, _ = judge(runs, cfg)
  return {**summary, "claims": claims}
