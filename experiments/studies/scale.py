r"""Experiment 2b (issues 50 and 55): does Pre-LN's lead over Post-LN last as training goes on, and does
the sequence length change who is ahead?

**Question.** The warm-up grid (experiment 2) compares Pre-LN without warm-up with Post-LN with warm-up
after 200 steps, about 0.3 tokens per parameter, where the curves still fall; the committed gpu report
(width 256, sequences of 256 bytes, 0.9 tokens per parameter) finds the opposite sign. Xiong et al. say
Pre-LN *converges faster*; a final loss read early measures speed. This study reads the same paired
difference at a ladder of training lengths, and (preset ``cpu-scale``) at several sequence lengths at
equal tokens per step.

**Design.** 6-layer width-64 LayerNorm models, AdamW(0.9, 0.98), the inverse-square-root schedule on
``tau`` = ``decay_timescale`` after a linear warm-up (none for Pre-LN, ``warmup`` steps for Post-LN): the
schedule does not depend on the run's length and each batch depends only on (seed, step), so one long run
holds every shorter run of the ladder, exactly (:mod:`experiments.harness.data`). Each layout of
``layouts`` is ``(batch, seq_len)``; all have the same tokens per step, so "sequence length" also means
fewer windows per step (16 x 32 against 2 x 256). Every run scores its model on ``eval_bytes`` bytes of
held-out windows (the same number for every layout) every ``eval_every`` steps, and on a second set of
windows at each ladder point (the measured noise of a paired difference). Each sequence length has its own
unigram plateau. Tokens per parameter count every parameter, the position table included.

Rates: ``rates`` gives the measured peak rates per (position, sequence length), chosen by pilots on seeds
100-102 (:mod:`experiments.studies.scale_pilots`); the rules pick each layout's best among them at each
ladder point (:mod:`experiments.studies.scale_rules`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.studies import scale_rules as rules
from experiments.studies.scale_answer import answer, fresh_answer  # noqa: F401 (the study protocol's answers)
from experiments.studies.summary_lines import scale_noise_line as noise_line  # noqa: F401 (the protocol's)
from experiments.suite.runs import param_count
from experiments.suite.study import Unit

TITLE = "Pre-LN vs Post-LN across training length and sequence length"
RAW_DATA = ("runs.json", "ladder.csv")
HEADLINE = ("ladder.png",)


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the study (the preset's ``scale`` entry).

  Attributes:
    n_layers: model depth.
    layouts: ``((batch, seq_len), ...)``, every one with the same tokens per step.
    max_len: the model's position table (every layout the same model); ``None``: the preset's.
    steps: each run's length (the longest ladder point).
    ladder: the steps at which the paired difference is read (second windows there too), increasing.
    warmup: Post-LN's linear warm-up (Pre-LN runs without).
    decay_timescale: ``tau`` of the inverse-sqrt decay, the same for every run.
    rates: ``((position, seq_len, lr, ...), ...)``: the measured rates of each layout per sequence length.
    seeds: training seeds (the report's; the pilots use 100-102).
    eval_bytes: bytes of validation windows per evaluation (each set), the same for every layout.
    eval_every: evaluations of the main windows every this many steps.
  """

  n_layers: int = 6
  layouts: tuple = ((16, 32),)
  max_len: int | None = None
  steps: int = 1200
  ladder: tuple = (200, 400, 600, 1200)
  warmup: int = 40
  decay_timescale: int = 40
  rates: tuple = (("pre", 32, 0.003125), ("post", 32, 0.001756))
  seeds: tuple = (20, 21, 22)
  eval_bytes: int = 16_384
  eval_every: int = 200

  def __post_init__(self):
    tokens = {b * t for b, t in self.layouts}
    if len(tokens) != 1:
      raise ValueError(f"layouts must all have the same tokens per step, got {self.layouts!r}.")
    lad = tuple(self.ladder)
    if not lad or any(a >= b for a, b in zip(lad, lad[1:])) or lad[-1] != self.steps:
      raise ValueError(f"ladder must be increasing and end at steps={self.steps}, got {self.ladder!r}.")
    for b, t in self.layouts:
      if self.eval_bytes % (b * t):
        raise ValueError(f"eval_bytes={self.eval_bytes} must be a multiple of every layout's tokens per batch, "
                         f"got layout {b} x {t}.")
      for pos in ("pre", "post"):
        if not self.lrs(pos, t):
          raise ValueError(f"rates must give at least one rate for ({pos!r}, {t}), got {self.rates!r}.")

  def lrs(self, position: str, seq_len: int) -> tuple:
    """The measured rates of ``position`` at ``seq_len``."""
    return tuple(float(x) for p, s, *lrs in self.rates if p == position and int(s) == seq_len for x in lrs)


def grid(cfg: Config) -> list[tuple]:
  """Every run as ``(batch, seq_len, position, lr, seed)``, in the order :func:`run` trains them (one program
  per layout and position)."""
  return [(b, t, p, lr, s) for b, t in cfg.layouts for p in ("pre", "post") for lr in cfg.lrs(p, t)
          for s in cfg.seeds]


def label(b: int, t: int, pos: str, lr: float, seed: int, cfg: Config) -> str:
  """Run label, e.g. ``"scale-pre-L6-16x32-lr0.003125-s20"``."""
  return f"scale-{pos}-L{cfg.n_layers}-{b}x{t}-lr{lr:g}-s{seed}"


def units(cfg: Config) -> list[Unit]:
  """The training runs of :func:`run`, in its order (for the planner). At the suite's usual layout (16 x 32,
  the preset's position table) a run compiles the warm-up grid's program (JAX's persistent cache finds it), so
  it shares the grid's compile key."""
  def key(b, t, p):
    base = ("train", cfg.n_layers, p, "layer_norm", "jaxnorm")
    return base if (b, t) == (16, 32) and cfg.max_len is None else base + ("layout", b, t, cfg.max_len)
  return [Unit("scale", label(b, t, p, lr, s, cfg), cfg.n_layers, cfg.steps, key(b, t, p), seq_len=t, batch_size=b)
          for b, t, p, lr, s in grid(cfg)]


def _model(ctx, cfg: Config, pos: str):
  over = {} if cfg.max_len is None else {"max_len": cfg.max_len}
  return ctx.model_config(n_layers=cfg.n_layers, norm_position=pos, norm_type="layer_norm", **over)


def _train_config(ctx, cfg: Config, b: int, t: int, pos: str, lr: float, seed: int):
  return ctx.train_config(_model(ctx, cfg, pos), batch_size=b, seq_len=t, steps=cfg.steps, lr=lr,
                          warmup=cfg.warmup if pos == "post" else 0, decay_timescale=cfg.decay_timescale,
                          seed=seed, eval_every=cfg.eval_every, eval_batches=cfg.eval_bytes // (b * t),
                          alt_eval_steps=tuple(cfg.ladder))


def run(ctx, cfg: Config) -> dict:
  """Trains every run of :func:`grid`; returns the summary (claims, tables, figures)."""
  from experiments.harness.train import eval_unigram_nats
  rows, unigram = [], {}
  for b, t, pos, lr, seed in ctx.iterate(grid(cfg), desc="runs"):
    tc = _train_config(ctx, cfg, b, t, pos, lr, seed)
    if t not in unigram:
      unigram[t] = eval_unigram_nats(tc, ctx.corpus())
    s = ctx.train(tc, label(b, t, pos, lr, seed, cfg)).summary
    rows.append({"batch": b, "seq_len": t, "position": pos, "lr": lr, "seed": seed,
                 "diverged_at": s.get("diverged_at"), "final_val_loss": s.get("final_val_loss"),
                 "val_curve": s.get("val_curve"), "val_curve_alt": s.get("val_curve_alt")})
  ctx.save_json("runs.json", rows)
  params = param_count(_model(ctx, cfg, "pre"))
  return analyse(ctx, cfg, rows, unigram={str(k): v for k, v in unigram.items()}, params=params)


def reanalyse(ctx, cfg: Config, summary: dict) -> dict:
  """:func:`analyse` again from the folder's ``runs.json`` (new rules or tables on the same runs)."""
  from experiments.suite.registry import read_json
  return analyse(ctx, cfg, read_json(ctx.exp_dir / "runs.json"), unigram=summary["unigram"],
                 params=int(summary["params"]))


def analyse(ctx, cfg: Config, rows: list[dict], *, unigram: dict, params: int) -> dict:
  """The summary from the per-run rows: ladder tables per sequence length, claims, noise, the sign
  change, figure and CSV; no training."""
  runs = {(int(r["seq_len"]), r["position"], float(r["lr"]), int(r["seed"])): r for r in rows}
  tokens_per_step = cfg.layouts[0][0] * cfg.layouts[0][1]
  tpp = {t: {st: st * tokens_per_step / params for st in cfg.ladder} for _, t in cfg.layouts}
  tables, extra = {}, {}
  for _, t in cfg.layouts:
    u = float(unigram[str(t)])
    table = rules.ladder_table(runs, t, cfg.ladder, cfg.seeds, u)
    tables[t] = table
    extra[str(t)] = {"noise": rules.noise(table), "crossing": rules.crossing(runs, t, table, cfg.seeds, u),
                     "slope_per_doubling": rules.slope_per_doubling(table, tpp[t]),
                     "still_falling": _still_falling(runs, t, table[-1], cfg)}
  claims = rules.claims(tables, tpp, len(cfg.seeds))
  ctx.save_csv("ladder.csv", ["seq_len", "step", "tokens_per_param", "seed", "lr_pre", "lr_post", "pre", "post",
                              "diff", "diff_alt", "failure_pre", "failure_post"],
               ([t, r["step"], tpp[t][r["step"]], s, r["lr"]["pre"], r["lr"]["post"], r["values"]["pre"][i],
                 r["values"]["post"][i], r["diff"][i], (r["diff_alt"] or [None] * len(cfg.seeds))[i],
                 r["failures"]["pre"][i] or "", r["failures"]["post"][i] or ""]
                for t, table in tables.items() for r in table for i, s in enumerate(cfg.seeds)))
  return {"claims": claims, "files": plot(ctx, runs, tables, tpp, cfg, unigram), "seeds": list(cfg.seeds),
          "params": params, "tokens_per_step": tokens_per_step, "unigram": unigram,
          "tables": {str(t): v for t, v in tables.items()}, "per_seq": extra,
          "tpp": {str(t): {str(k): v for k, v in d.items()} for t, d in tpp.items()},
          "model": dict(ctx.preset["model"], **({"max_len": cfg.max_len} if cfg.max_len else {}))}


def _still_falling(runs: dict, seq: int, last: dict, cfg: Config) -> dict:
  """How much each best-rate layout's seed-mean loss fell over the end of the run (nats; > 0: still falling),
  from the last evaluation at or before 4/5 of the run to the last step; the window is named by its steps
  (``window``: ``[from, to]``; issue 63: with evaluations every ``eval_every`` steps it is longer than a fifth)."""
  out, window = {}, None
  for pos in ("pre", "post"):
    drops = []
    for s in cfg.seeds:
      c = {int(k): float(v) for k, v in runs[(seq, pos, last["lr"][pos], s)].get("val_curve") or []
           if v is not None and np.isfinite(float(v))}
      early = max((k for k in c if k <= cfg.steps * 4 // 5), default=None)
      if early is not None and cfg.steps in c:
        drops.append(c[early] - c[cfg.steps])
        window = [early, cfg.steps]
    out[pos] = float(np.mean(drops)) if drops else None
  out["window"] = window
  return out


def plot(ctx, runs: dict, tables: dict, tpp: dict, cfg: Config, unigram: dict) -> list[str]:
  """``ladder.png``: the paired difference Pre - Post against tokens per parameter, one colour per
  sequence length, every seed drawn (thin: on the whole validation curves at the longest point's best
  rates; markers: the ladder points at each point's own best rates), the margin band shaded. The legend names
  the rates of each (issue 63: where a point's best rates differ from the longest point's, its markers are
  not on the curves' runs, and the caption of :func:`experiments.studies.scale_answer.section` says so)."""
  fig, ax = ctx.subplots(1, 1, figsize=(7, 4.2))
  for i, (t, table) in enumerate(tables.items()):
    last = table[-1]["lr"]
    for j, s in enumerate(cfg.seeds):
      a = dict(map(tuple, runs[(t, "pre", last["pre"], s)].get("val_curve") or []))
      b = dict(map(tuple, runs[(t, "post", last["post"], s)].get("val_curve") or []))
      ks = sorted(k for k in a if k in b and k > 0)
      ax.plot([tpp[t][cfg.ladder[0]] * k / cfg.ladder[0] for k in ks], [float(a[k]) - float(b[k]) for k in ks],
              "-", lw=0.8, alpha=0.6, color=f"C{i}",
              label=f"seq {t}: curves at Pre {last['pre']:g} / Post {last['post']:g}" if j == 0 else None)
    rates = sorted({(r["lr"]["pre"], r["lr"]["post"]) for r in table})
    for r in table:
      ax.plot([tpp[t][r["step"]]] * len(r["diff"]), r["diff"], "o", ms=4, color=f"C{i}",
              label=(f"seq {t}: ladder points at each point's best rates ("
                     + ", ".join(f"{a:g} / {b:g}" for a, b in rates) + ")") if r is table[0] else None)
  ax.axhline(0.0, color="k", lw=0.8)
  ax.axhspan(-rules.MARGIN, rules.MARGIN, color="0.85", alpha=0.5, lw=0)
  ax.set_xscale("log")
  ax.set_xlabel("tokens (bytes) per parameter, every parameter counted")
  ax.set_ylabel("Pre-LN (no warm-up) - Post-LN (warm-up), nats/byte")
  ax.set_title("below 0: Pre-LN ahead; shaded: the rules' margin", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return [ctx.save_figure(fig, "ladder.png")]


def report_section(summary: dict, rel: str) -> str:
  """Markdown: setup, the figure, the ladder table per sequence length, noise, sign change, the GPU."""
  from experiments.studies.scale_answer import section
  return section(summary, rel)
