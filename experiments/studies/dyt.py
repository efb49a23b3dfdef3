r"""Experiment 9 (issue 36): when does removing the norm help? DyT and Derf against LayerNorm and RMSNorm
across tokens per parameter.

**Question.** Zhu et al. 2025 (DyT) and Chen et al. 2025 (Derf) report that a point-wise bounded
function (:math:`\gamma\tanh(\alpha x) + \beta`, :math:`\gamma\,\mathrm{erf}(\alpha x + s) + \beta`) can
replace LayerNorm/RMSNorm with no loss (DyT) or a gain (Derf, attributed to generalization). Verma 2026
finds the sign of DyT's effect depends on the data per parameter: in compute-limited GPT-2 runs it lowers
the validation loss when the unique data are scarce (-27.3% at 64M parameters / 1M tokens) and raises it
with more (+18.8% at 118M tokens), through saturation (49% of DyT activations saturated at 1M vs 23% at
118M), i.e. it acts as a regularizer. All of Verma's runs have tokens per parameter below 1.84; this
suite's models (10^5 parameters, 10^5-10^6 bytes) sit in the same range.

**Design.** One Pre-LN model (width 64, ``n_layers`` = 2 in ``cpu-extra``: 133,125 parameters without
the position table), four norms in every norm position (:mod:`experiments.studies.dyt_recipe`), a fixed
number of steps of 16 x 32 bytes, and the number of **unique** training bytes :math:`U` set from the
tokens per parameter :math:`T/P = U / P` (0.0157, 0.157, 1.84: Verma's 1M, 10M and 118M cells at 64M),
drawn as nested random chunks of the training split (:func:`experiments.harness.data.train_subset`; Verma
takes the first N tokens of WikiText-103, but the stdlib corpus is sorted by package, so a prefix would be
one package). The bytes processed are the same in every cell, so the small cells are seen many times
(Verma: 5000 steps of 64 x 512 tokens whatever the subset). Validation: the held-out files (every tenth
file of the corpus), two disjoint sets of windows (the second is the measured evaluation noise). Each run
also scores its final model on fixed windows of its own training bytes (the training loss of the gap
plot) and, for DyT/Derf, the fraction of saturated activations (:math:`|\alpha x + s| > 2`) at every norm
input on those windows (Verma's measure, on training data of the final model).

Learning rates: one per norm, chosen by the pilots on seeds 100-101 at the largest T/P (the lowest
validation loss of the rates c / 64, c = 0.0632, 0.2, 0.632, 2.0); the report's seeds are 0-2.
:math:`\alpha_0`: DyT 1.0/1.0 (attention/other; Zhu et al.'s LLM table at its narrowest width, 1024),
Derf 0.5 and :math:`s_0 = 0` (Chen et al., Sec. 5). Recipes side by side are in the report section.

The rules, their testability conditions and what was read of each paper are in
:mod:`experiments.studies.dyt_rules`; the pilots in ``experiments/results/pilots/dyt/``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.studies import dyt_recipe as recipe
from experiments.studies import dyt_rules as rules
from experiments.suite.registry import from_json_float
from experiments.suite.study import Unit
from experiments.studies.extra_answer import dyt_answer as answer  # noqa: F401 (the study protocol's answer)
from experiments.studies.summary_lines import dyt_noise_line as noise_line  # noqa: F401 (the protocol's)

TITLE = "When does removing the norm help? DyT and Derf across tokens per parameter"
RAW_DATA = ("cells.json", "cells.csv")
HEADLINE = ("dyt_loss.png",)

NAMES = recipe.NORM_NAMES


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the study (the preset's ``dyt`` entry).

  Attributes:
    n_layers: model depth (one model for every cell).
    steps: optimizer updates per run (the same in every cell).
    batch_size, seq_len: the batches (the preset's width and FFN).
    tokens_per_param: the T/P values (unique training bytes over parameters).
    seeds: training seeds (the report's; the pilots use 100-102).
    lrs: ``((norm, peak lr), ...)`` for the norms of :data:`experiments.studies.dyt_recipe.NORMS`.
    eval_every: validation every this many steps (the curve: its best point is compared where a final
      checkpoint overfit, :func:`experiments.studies.dyt_rules.paired`; else the final value).
  """

  n_layers: int = 2
  steps: int = 240
  batch_size: int = 16
  seq_len: int = 32
  tokens_per_param: tuple = (0.0157, 0.157, 1.84)
  seeds: tuple = (0, 1, 2)
  lrs: tuple = (("layer_norm", 0.009875), ("rms_norm", 0.009875), ("dyt", 0.009875), ("derf", 0.009875))
  eval_every: int = 40


def label(norm: str, tpp: float, seed: int, cfg: Config) -> str:
  """Run label, e.g. ``"dyt-dyt-L2-tpp0.0157-s0"``."""
  return f"dyt-{norm}-L{cfg.n_layers}-tpp{tpp:g}-s{seed}"


def grid(cfg: Config) -> list[tuple]:
  """Every run as ``(norm, tpp, seed)``, in the order :func:`run` trains them (norm outermost, so
  each norm's program compiles once)."""
  return [(n, t, s) for n in recipe.NORMS for t in cfg.tokens_per_param for s in cfg.seeds]


def units(cfg: Config) -> list[Unit]:
  """The training runs of :func:`run`, in its order (for the planner); one program per norm."""
  return [Unit("dyt", label(n, t, s, cfg), cfg.n_layers, cfg.steps,
               ("train", cfg.n_layers, "pre", n, "jaxnorm", "dyt", cfg.seq_len), seq_len=cfg.seq_len)
          for n, t, s in grid(cfg)]


def _configs(ctx, cfg: Config, norm: str, tpp: float, seed: int):
  """The run's TrainConfig, P and U. P is the LayerNorm model's count for every norm, so every norm of a
  cell trains on the same unique bytes (the norms' own counts differ by at most 0.25%: RMSNorm has no
  bias, DyT/Derf add one or two scalars per norm)."""
  mc = ctx.model_config(**recipe.model_fields(norm, cfg.n_layers))
  params = recipe.param_count(ctx.model_config(**recipe.model_fields("layer_norm", cfg.n_layers)))
  unique = recipe.unique_bytes(tpp, params)
  tc = ctx.train_config(mc, batch_size=cfg.batch_size, seq_len=cfg.seq_len, eval_every=cfg.eval_every,
                        **recipe.train_fields(dict(cfg.lrs)[norm], cfg.steps, seed, unique))
  return tc, params, unique


def run(ctx, cfg: Config) -> dict:
  """Trains every (norm, T/P, seed); returns the summary (claims, files, cells, recipe)."""
  from experiments.harness.train import eval_unigram_nats
  missing = set(recipe.NORMS) - set(dict(cfg.lrs))
  if missing:
    raise ValueError(f"Config.lrs must give a rate for every norm {recipe.NORMS}; missing {sorted(missing)}.")
  cells, rows = {}, []
  tc0 = None
  for norm, tpp, seed in ctx.iterate(grid(cfg), desc="runs"):
    tc, params, unique = _configs(ctx, cfg, norm, tpp, seed)
    tc0 = tc0 or tc
    r = ctx.train(tc, label(norm, tpp, seed, cfg))
    s = r.summary
    unique = int(s.get("train_bytes") or unique)
    cell = {"val": s.get("final_val_loss"), "val_alt": s.get("final_val_loss_alt"),
            "train": s.get("final_train_loss"), "saturation": s.get("final_saturation"),
            "diverged": bool(s.get("diverged")), "val_curve": s.get("val_curve"), "params": params,
            "unique_bytes": unique, "epochs": cfg.steps * cfg.batch_size * cfg.seq_len / unique,
            "lr": dict(cfg.lrs)[norm], "run": r.path.name}
    cells[(norm, tpp, seed)] = cell
    rows.append({"norm": norm, "tpp": tpp, "seed": seed, **cell})
  unigram = eval_unigram_nats(tc0, ctx.corpus())
  epochs = {t: cells[(recipe.NORMS[0], t, cfg.seeds[0])]["epochs"] for t in cfg.tokens_per_param}
  ctx.save_json("cells.json", rows)
  return analyse(ctx, cfg, rows, unigram=unigram, epochs=epochs)


def eval_noise(rows: list[dict]) -> dict | None:
  """The measured evaluation noise: per run, |val - val_alt| (the same final model on the two disjoint
  sets of validation windows): ``{"single": {"median", "max", "n"}}``, None if no run has both."""
  d = [abs(float(r["val"]) - float(r["val_alt"])) for r in rows
       if r.get("val") is not None and r.get("val_alt") is not None
       and np.isfinite(float(r["val"])) and np.isfinite(float(r["val_alt"]))]
  return {"single": {"median": float(np.median(d)), "max": float(max(d)), "n": len(d)}} if d else None


def analyse(ctx, cfg: Config, rows: list[dict], *, unigram: float, epochs: dict) -> dict:
  """The summary from the per-run rows of ``cells.json`` (claims, figures, table, noise); no training."""
  cells = {(r["norm"], float(r["tpp"]), int(r["seed"])): r for r in rows}
  epochs = {float(t): float(v) for t, v in epochs.items()}
  claims = rules.claims(cells, epochs=epochs, unigram=unigram)
  ctx.save_csv("cells.csv", ["norm", "tpp", "seed", "lr", "params", "unique_bytes", "epochs", "val", "val_alt",
                             "best_val", "train", "gap", "saturation_mean"],
               ([r["norm"], r["tpp"], r["seed"], r["lr"], r["params"], r["unique_bytes"], r["epochs"], r["val"],
                 r["val_alt"], rules.best_val(r), r["train"], rules.gap(r), rules.mean_saturation(r["saturation"])]
                for r in rows))
  return {"claims": claims, "files": plot(ctx, cells, cfg), "unigram": unigram, "epochs": epochs,
          "table": _table(cells, cfg), "model": dict(ctx.preset["model"]), "seeds": list(cfg.seeds),
          "params": rows[0]["params"] if rows else None, "eval_noise": eval_noise(rows)}


def reanalyse(ctx, cfg: Config, summary: dict) -> dict:
  """:func:`analyse` again from the folder's ``cells.json`` and the old summary's unigram plateau and
  epochs (new rules, tables and figures on the same runs; :mod:`experiments.suite.reanalyse`)."""
  from experiments.suite.registry import read_json
  return analyse(ctx, cfg, read_json(ctx.exp_dir / "cells.json"), unigram=float(summary["unigram"]),
                 epochs=summary["epochs"])


def _stat(xs) -> tuple[float, float, float]:
  xs = [float(x) for x in xs if x is not None and np.isfinite(float(x))]
  if not xs:
    return float("nan"), float("nan"), float("nan")
  return float(np.mean(xs)), float(min(xs)), float(max(xs))


def _table(cells: dict, cfg: Config) -> list[dict]:
  out = []
  for tpp in cfg.tokens_per_param:
    for norm in recipe.NORMS:
      cs = [cells[(norm, tpp, s)] for s in cfg.seeds]
      out.append({"tpp": tpp, "norm": norm, "val": _stat(c["val"] for c in cs),
                  "val_alt": _stat(c["val_alt"] for c in cs), "best": _stat(rules.best_val(c) for c in cs),
                  "train": _stat(c["train"] for c in cs),
                  "gap": _stat(rules.gap(c) for c in cs),
                  "saturation": _stat(rules.mean_saturation(c["saturation"]) for c in cs),
                  "epochs": cs[0]["epochs"], "unique_bytes": cs[0]["unique_bytes"]})
  return out


def plot(ctx, cells: dict, cfg: Config) -> list[str]:
  """``dyt_loss.png`` (validation and training loss against T/P, one line per norm, seeds as bands) and
  ``dyt_gap.png`` (the gap val - train, and the saturated fraction of DyT/Derf)."""
  tpps = list(cfg.tokens_per_param)
  fig, axes = ctx.subplots(1, 2, figsize=(11, 3.8), sharey=True)
  for ax, key, title in ((axes[0], "val", "validation loss (held-out files)"),
                         (axes[1], "train", "training loss (final model on its training bytes)")):
    for i, norm in enumerate(recipe.NORMS):
      st = [_stat(cells[(norm, t, s)][key] for s in cfg.seeds) for t in tpps]
      ax.plot(tpps, [m for m, _, _ in st], "-o", ms=3, color=f"C{i}", label=NAMES[norm])
      ax.fill_between(tpps, [lo for _, lo, _ in st], [hi for _, _, hi in st], color=f"C{i}", alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("unique training tokens (bytes) per parameter")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  axes[0].set_ylabel("loss (nats per byte)")
  files = [ctx.save_figure(fig, "dyt_loss.png")]
  fig, axes = ctx.subplots(1, 2, figsize=(11, 3.8))
  for i, norm in enumerate(recipe.NORMS):
    st = [_stat(rules.gap(cells[(norm, t, s)]) for s in cfg.seeds) for t in tpps]
    axes[0].plot(tpps, [m for m, _, _ in st], "-o", ms=3, color=f"C{i}", label=NAMES[norm])
    axes[0].fill_between(tpps, [lo for _, lo, _ in st], [hi for _, _, hi in st], color=f"C{i}", alpha=0.2)
  for i, norm in enumerate(recipe.NORMS):
    if norm not in recipe.ALPHA:
      continue
    st = [_stat(rules.mean_saturation(cells[(norm, t, s)]["saturation"]) for s in cfg.seeds) for t in tpps]
    axes[1].plot(tpps, [m for m, _, _ in st], "-o", ms=3, color=f"C{i}", label=NAMES[norm])
    axes[1].fill_between(tpps, [lo for _, lo, _ in st], [hi for _, _, hi in st], color=f"C{i}", alpha=0.2)
  axes[0].set_title("gap: validation - training loss", fontsize=10)
  axes[1].set_title("saturated fraction |alpha x + s| > 2 (mean over layers, training bytes)", fontsize=10)
  for ax in axes:
    ax.set_xscale("log")
    ax.set_xlabel("unique training tokens (bytes) per parameter")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  files.append(ctx.save_figure(fig, "dyt_gap.png"))
  files.append(plot_curves(ctx, cells, cfg))
  return files


def plot_curves(ctx, cells: dict, cfg: Config) -> str:
  """``dyt_curves.png``: validation loss over the steps, one panel per T/P, one line per (norm, seed)
  (every seed drawn: a split between seeds shows), each curve's best point marked."""
  tpps = list(cfg.tokens_per_param)
  fig, axes = ctx.subplots(1, len(tpps), figsize=(4.2 * len(tpps), 3.6), squeeze=False)
  for ax, t in zip(axes[0], tpps):
    for i, norm in enumerate(recipe.NORMS):
      for j, s in enumerate(cfg.seeds):
        curve = [(int(st), float(v)) for st, v in (cells[(norm, t, s)].get("val_curve") or [])
                 if v is not None and np.isfinite(float(v))]
        if not curve:
          continue
        xs, ys = zip(*curve)
        ax.plot(xs, ys, "-", lw=1, color=f"C{i}", alpha=0.8, label=NAMES[norm] if j == 0 else None)
        k = int(np.argmin(ys))
        ax.plot([xs[k]], [ys[k]], "o", ms=3, color=f"C{i}")
    ax.set_title(f"T/P {t:g} ({cells[(recipe.NORMS[0], t, cfg.seeds[0])]['epochs']:z.2f} epochs)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylim(top=min(ax.get_ylim()[1], 4.5))
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("validation loss (nats per byte)")
  axes[0][0].legend(fontsize=7)
  return ctx.save_figure(fig, "dyt_curves.png")


RECIPES = (
    ("model", "Pre-LN GPT, width {d}, {L} layer(s), {H} heads, FFN {F}, bytes, learned positions, Xavier init "
     "({P} parameters without the position table)",
     "Pre-LN LLaMA 7B-70B and ViT/ConvNeXt/DiT/wav2vec/HyenaDNA (ViT, LLaMA)",
     "GPT-2 124M, ViT, DiT, speech, DNA", "nanoGPT GPT-2, 64M-3.78B (64M: 12 layers, width 512), GPT-2 tokens"),
    ("alpha_0", "DyT 1.0/1.0 (attention/other), Derf 0.5, s_0 = 0", "0.5 default; LLMs by width: 1.0/1.0 at 1024 "
     "... 0.2/0.05 at 8192 (Sec. 7.2, Tables 10-11)", "alpha 0.5, s 0 (Sec. 5)", "2.0 in every DyT layer"),
    ("embedding scalar", "none (Xavier init: embeddings of unit std)", "LLaMA: learnable, init sqrt(d) (Sec. 5, "
     "App. A)", "not in the notes read", "none (std 0.02 embeddings)"),
    ("optimizer", "AdamW (0.9, 0.95), wd 0.1 on matrices, clip 1.0", "the original recipes of each model",
     "the original recipes", "AdamW (0.9, 0.95), wd 0.1, clip 1.0"),
    ("learning rate", "per norm, from pilots on seeds 100-101 ({lrs})", "the norm models' (LLaMA: tuned per "
     "size)", "the norm models'", "3e-4 for every norm"),
    ("schedule", "linear warm-up 40% of the steps, then constant", "the original recipes", "the original recipes",
     "warm-up 2000 of 5000, cosine over 600000 (about constant)"),
    ("data", "stdlib bytes, nested random 512-byte chunks of the training split; held-out files",
     "LLaMA: The Pile, 200B tokens", "OpenWebText (GPT-2)", "WikiText-103: first 1M/10M/50M/118M tokens; "
     "its validation split"),
    ("tokens per parameter", "{tpps} (unique bytes / parameters), {steps} steps of {B} x {T} bytes in every cell",
     "compute-optimal or more (single epoch)", "single epoch", "0.016-1.84 unique tokens per parameter, "
     "5000 x 64 x 512 tokens in every cell"),
    ("saturation", "|alpha x + s| > 2 at every DyT/Derf input, final model, training windows", "-", "-",
     "|alpha x| > 2 at DyT inputs, final checkpoint, 50 random training windows of 512"),
)


def report_section(summary: dict, rel: str) -> str:
  """Markdown: setup, the two plots, the per-cell table and the recipes side by side."""
  cfg = summary["config"]
  lrs = ", ".join(f"{NAMES[n]} {lr:g}" for n, lr in cfg["lrs"])
  m = summary.get("model", {})
  fmt = {"d": m.get("d_model"), "H": m.get("n_heads"), "F": m.get("d_ff"), "L": cfg["n_layers"],
         "P": f"{summary.get('params') or 0:,}", "lrs": lrs, "steps": cfg["steps"],
         "B": cfg["batch_size"], "T": cfg["seq_len"], "tpps": ", ".join(f"{t:g}" for t in cfg["tokens_per_param"])}
  lines = [
      f"Setup: Pre-LN models of width {fmt['d']} and {cfg['n_layers']} layer(s) ({fmt['P']} parameters without the "
      f"position table) with LayerNorm, RMSNorm, DyT or Derf in every norm position, {cfg['steps']} steps of "
      f"{cfg['batch_size']} x {cfg['seq_len']} bytes in every cell"
      + (f" ({cfg['steps'] * cfg['batch_size'] * cfg['seq_len'] / summary['params']:z.2f} tokens trained per parameter)"
         if summary.get("params") else "")
      + f", the unique training bytes set by T/P (unique tokens per parameter) {fmt['tpps']}; seeds "
      f"{', '.join(map(str, cfg['seeds']))}; peak rates {lrs}. Validation on the held-out files (two sets of "
      f"windows; plateau {float(summary['unigram']):z.3f} nats). Lines: seed means; bands: the seeds' range.", "",
      f"![loss against tokens per parameter]({rel}/dyt_loss.png)", "",
      f"![gap and saturation]({rel}/dyt_gap.png)", ""]
  if "dyt_curves.png" in summary.get("files", []):
    lines += ["Validation loss over the steps, every seed (dots: each curve's best point; the small cells overfit "
              "after it):", "", f"![validation curves]({rel}/dyt_curves.png)", ""]
  lines += [
      "| T/P | unique bytes | epochs | norm | final val (seed mean [min, max]) | best of curve | val, 2nd windows | "
      "train | gap val - train | saturated |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in summary["table"]:
    v, a, t, g, s = ([from_json_float(x) for x in r[k]] for k in ("val", "val_alt", "train", "gap", "saturation"))
    b = [from_json_float(x) for x in r["best"]] if "best" in r else None
    sat = "-" if not np.isfinite(s[0]) else f"{s[0]:z.1%}"
    best = "-" if b is None else f"{b[0]:z.3f} [{b[1]:z.3f}, {b[2]:z.3f}]"
    lines.append(f"| {r['tpp']:g} | {r['unique_bytes']:,} | {r['epochs']:z.2f} | {NAMES[r['norm']]} | {v[0]:z.3f} "
                 f"[{v[1]:z.3f}, {v[2]:z.3f}] | {best} | {a[0]:z.3f} | {t[0]:z.3f} | {g[0]:+z.3f} | {sat} |")
  lines += ["", "Recipes, ours beside each paper's:", "",
            "| | ours | Zhu et al. 2025 (DyT) | Chen et al. 2025 (Derf) | Verma 2026 (artifact) |",
            "|---|---|---|---|---|"]
  for row in RECIPES:
    lines.append("| " + " | ".join(x.format(**fmt) for x in row) + " |")
  lines.append("")
  return "\n".join(lines)
