r"""Experiment 4: RMSNorm's invariances and where epsilon breaks them (source notes, Sec. 3).

Measured with jaxnorm's custom-VJP ops in float32 on rows ``x ~ N(0, 1)`` of width ``d``, with
a random scale :math:`\gamma = 1 + 0.1\,\mathcal N(0, 1)` (and bias for LayerNorm) and a random
cotangent ``dy``:

* forward scale invariance, :math:`e_f(a) = \max |N(a x) - N(x)|`;
* gradient invariance, :math:`e_g(a) = \max |\nabla_x \langle dy, N(a x)\rangle -
  \nabla_x \langle dy, N(x)\rangle| / \max |\nabla_x \langle dy, N(x)\rangle|` (the gradient with
  respect to the *original* ``x``, as in the notes);
* LayerNorm's shift invariance, :math:`\max |LN(x + c) - LN(x)|` (RMSNorm for contrast);

for :math:`a, |c|` from 1e-3 to 1e3, with ``epsilon`` 0, 1e-6 (the default) inside and 1e-6
outside the square root. With epsilon inside, the exact deviation is known: RMSNorm's output
is multiplied by

.. math::

   \rho(a) = \sqrt{\frac{\overline{x^2} + \epsilon}{\overline{x^2} + \epsilon / a^2}},

so the measured error is compared with this prediction, separating epsilon's effect from
float rounding. Finally the weight-gradient norms of LayerNorm vs RMSNorm layers (the notes'
``y = N(x W)``; then whole Pre-LN models at init and during training) are compared.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from experiments.studies.invariance_rules import BREAK_LEVEL, verdicts
from experiments.suite.runs import train_run
from experiments.suite.study import Unit, train_unit

TITLE = "RMSNorm invariance (source notes): scale, gradient and shift invariance; LN vs RMS gradient norms"
RAW_DATA = ('data.json', 'scale_invariance.csv')  # files the report links under the claims


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of the invariance experiment.

  Attributes:
    n_rows: rows of ``x``.
    d: feature width.
    n_points: points of the ``a`` (and ``c``) grid, log-spaced over 1e-3..1e3.
    seeds: random inputs; errors are maxima over seeds.
    train_steps: steps of the Pre-LN LayerNorm/RMSNorm training runs whose gradient norms are
      compared (lr 1e-3, no warm-up, the preset's decay timescale; not a point of the
      warm-up grid, whose rates are multiples of 1 / d_model).
    n_layers: depth of those models.
  """

  n_rows: int = 64
  d: int = 256
  n_points: int = 25
  seeds: tuple = (0, 1, 2)
  train_steps: int = 300
  n_layers: int = 6


# Variants of the op: (label, op, epsilon, placement).
VARIANTS = (
    ("RMSNorm eps=0", "rms", 0.0, "inside"),
    ("RMSNorm eps=1e-6", "rms", 1e-6, "inside"),
    ("RMSNorm eps=1e-6 outside", "rms", 1e-6, "outside"),
    ("LayerNorm eps=0", "ln", 0.0, "inside"),
    ("LayerNorm eps=1e-6", "ln", 1e-6, "inside"),
)


def _op_fn(kind, epsilon, placement):
  import jaxnorm
  if kind == "rms":
    return lambda x, scale, bias: jaxnorm.rms_norm(x, scale, epsilon=epsilon, epsilon_placement=placement)
  return lambda x, scale, bias: jaxnorm.layer_norm(x, scale, bias, epsilon=epsilon,
                                                   epsilon_placement=placement)


def _make_inputs(seed, n_rows, d):
  import jax
  import jax.numpy as jnp
  kx, ks, kb, kd = jax.random.split(jax.random.key(seed), 4)
  x = jax.random.normal(kx, (n_rows, d), jnp.float32)
  scale = 1.0 + 0.1 * jax.random.normal(ks, (d,), jnp.float32)
  bias = 0.1 * jax.random.normal(kb, (d,), jnp.float32)
  dy = jax.random.normal(kd, (n_rows, d), jnp.float32)
  return x, scale, bias, dy


def _scaled_fn(f):
  """jit: (x, scale, bias, dy, a, c) -> (N(a x + c), grad_x <dy, N(a x + c)>)."""
  import jax

  @jax.jit
  def g(x, scale, bias, dy, a, c):
    y, vjp = jax.vjp(lambda x_: f(a * x_ + c, scale, bias), x)
    return y, vjp(dy)[0]

  return g


def _rel_max(diff, ref):
  return float(np.max(np.abs(diff)) / max(float(np.max(np.abs(ref))), 1e-30))


def _predicted_rms_error(x, scale, a, epsilon):
  """max |N(a x) - N(x)| predicted from the closed-form factor rho(a) (float64)."""
  x = np.asarray(x, np.float64)
  ms = np.mean(x * x, axis=-1, keepdims=True)
  y1 = x / np.sqrt(ms + epsilon) * np.asarray(scale, np.float64)
  rho = np.sqrt((ms + epsilon) / (ms + epsilon / (a * a)))
  return float(np.max(np.abs(y1 * (rho - 1.0))))


def op_invariance(cfg: Config) -> dict:
  """Forward/gradient scale-invariance and shift-invariance errors on the ``a``/``c`` grid."""
  import jax.numpy as jnp
  grid = np.logspace(-3, 3, cfg.n_points)
  out = {"a": grid.tolist(), "scale": {}, "shift": {}, "predicted_rms_eps": []}
  for label, kind, eps, placement in VARIANTS:
    g = _scaled_fn(_op_fn(kind, eps, placement))
    fwd = np.zeros((len(cfg.seeds), len(grid)))
    grad = np.zeros_like(fwd)
    shift_f = np.zeros_like(fwd)
    shift_g = np.zeros_like(fwd)
    for si, seed in enumerate(cfg.seeds):
      x, scale, bias, dy = _make_inputs(seed, cfg.n_rows, cfg.d)
      one, zero = jnp.float32(1.0), jnp.float32(0.0)
      y1, g1 = (np.asarray(v) for v in g(x, scale, bias, dy, one, zero))
      for i, a in enumerate(grid):
        ya, ga = (np.asarray(v) for v in g(x, scale, bias, dy, jnp.float32(a), zero))
        fwd[si, i] = float(np.max(np.abs(ya - y1)))
        grad[si, i] = _rel_max(ga - g1, g1)
        yc, gc = (np.asarray(v) for v in g(x, scale, bias, dy, one, jnp.float32(a)))
        shift_f[si, i] = float(np.max(np.abs(yc - y1)))
        shift_g[si, i] = _rel_max(gc - g1, g1)
    out["scale"][label] = {"fwd": fwd.max(0).tolist(), "grad": grad.max(0).tolist()}
    out["shift"][label] = {"fwd": shift_f.max(0).tolist(), "grad": shift_g.max(0).tolist()}
  x, scale, _, _ = _make_inputs(cfg.seeds[0], cfg.n_rows, cfg.d)
  out["predicted_rms_eps"] = [_predicted_rms_error(x, scale, a, 1e-6) for a in grid]
  return out


def weight_grad_norms_op(cfg: Config) -> dict:
  """The notes' setting: ``y = N(x W)``, ``L = <dy, y>``; ``||dL/dW||`` for LN vs RMS per seed."""
  import jax
  import jax.numpy as jnp
  import jaxnorm

  def loss(w, x, dy, kind):
    h = x @ w
    y = jaxnorm.layer_norm(h) if kind == "ln" else jaxnorm.rms_norm(h)
    return jnp.sum(y * dy)

  grad = jax.jit(jax.grad(loss), static_argnums=3)
  rows = []
  for seed in cfg.seeds:
    kx, kw, kd = jax.random.split(jax.random.key(1000 + seed), 3)
    x = jax.random.normal(kx, (cfg.n_rows, cfg.d), jnp.float32)
    w = jax.random.normal(kw, (cfg.d, cfg.d), jnp.float32) * math.sqrt(1.0 / cfg.d)
    dy = jax.random.normal(kd, (cfg.n_rows, cfg.d), jnp.float32)
    ln = float(jnp.linalg.norm(grad(w, x, dy, "ln")))
    rms = float(jnp.linalg.norm(grad(w, x, dy, "rms")))
    rows.append({"seed": seed, "ln": ln, "rms": rms, "rms_over_ln": rms / ln})
  return {"rows": rows, "ratio_mean": float(np.mean([r["rms_over_ln"] for r in rows]))}


def _total_layer_norm(entry: dict) -> float:
  groups = ("attn_qkv", "attn_out", "mlp_in", "mlp_out")
  return float(math.sqrt(sum(float(v) ** 2 for g in groups for v in entry[g])))


# The model-level part runs one seed (its cost); the report labels its ratios with it.
MODEL_SEED = 0


def model_grad_norms(ctx, cfg: Config) -> dict:
  """LN vs RMS Pre-LN models (seed :data:`MODEL_SEED`): per-group grad norms at init, total
  block-weight grad norm in training."""
  from experiments.harness import probes
  corpus = ctx.corpus()
  tcfg = ctx.preset["train"]
  init = {}
  for norm in ("layer_norm", "rms_norm"):
    mc = ctx.model_config(n_layers=cfg.n_layers, norm_position="pre", norm_type=norm)
    kw = dict(batch_size=tcfg["batch_size"], seq_len=tcfg["seq_len"], seed=MODEL_SEED, n_batches=2)
    r = ctx.cached(f"init-{norm}", {"model": mc, "data": ctx.preset.get("data"), **kw},
                   lambda mc=mc, kw=kw: probes.grad_norms_at_init(mc, corpus, **kw))
    init[norm] = {g: r[g] for g in ("attn_qkv", "attn_out", "mlp_in", "mlp_out")}
    init[norm]["total"] = _total_layer_norm(r)
  curves = {}
  for norm in ("layer_norm", "rms_norm"):
    spec = {"norm_position": "pre", "norm_type": norm, "init": "xavier", "lr": 1e-3, "warmup": 0}
    run = train_run(ctx, spec, cfg.n_layers, cfg.train_steps, seed=MODEL_SEED)
    steps = [m["step"] for m in run.metrics if "attn_qkv" in m]
    totals = [_total_layer_norm(m) for m in run.metrics if "attn_qkv" in m]
    curves[norm] = {"step": steps, "total": totals, "run": run.path.name,
                    "final_val_loss": run.summary.get("final_val_loss")}
  n = min(len(curves["layer_norm"]["total"]), len(curves["rms_norm"]["total"]))
  ratio = (np.asarray(curves["rms_norm"]["total"][:n]) /
           np.maximum(np.asarray(curves["layer_norm"]["total"][:n]), 1e-30))
  return {"seed": MODEL_SEED, "init": init, "train": curves,
          "init_ratio": init["rms_norm"]["total"] / init["layer_norm"]["total"],
          "train_ratio_median": float(np.median(ratio)) if n else float("nan"),
          "train_ratio_q10_q90": ([float(np.quantile(ratio, 0.1)), float(np.quantile(ratio, 0.9))]
                                  if n else [float("nan")] * 2),
          "train_ratio": ratio.tolist()}


def plot(ctx, data: dict) -> list[str]:
  """Draws the figures of the invariance experiment into its folder.

  ``scale_invariance.png``: forward and relative gradient error against ``a`` for every variant,
  with the predicted effect of epsilon; ``shift_invariance.png``: the same against the shift
  ``c``; ``grad_norms_ln_vs_rms.png`` (if the model-level part ran): per-layer gradient norms of
  LN and RMS Pre-LN models at init and their total block-weight gradient norm in training.
  Errors below 1e-9 are drawn at 1e-9.

  Args:
    ctx: the suite context (saves the figures).
    data: the data of :func:`run`: ``op`` (:func:`op_invariance`), ``op_weight_grads`` and
      ``model`` (:func:`model_grad_norms`, or None).

  Returns:
    The PNG file names.
  """
  files = []
  grid = np.asarray(data["op"]["a"])
  floor = 1e-9
  fig, axes = ctx.subplots(1, 2, figsize=(11, 4))
  for ax, key, title in ((axes[0], "fwd", "forward: max |N(a x) - N(x)|"),
                         (axes[1], "grad", "gradient: rel. max |d/dx N(a x) - d/dx N(x)|")):
    for label, _, _, _ in VARIANTS:
      ax.loglog(grid, np.maximum(data["op"]["scale"][label][key], floor), marker="o", ms=3, label=label)
    if key == "fwd":
      ax.loglog(grid, np.maximum(data["op"]["predicted_rms_eps"], floor), "k--", lw=1,
                label="predicted epsilon effect (eps=1e-6)")
    ax.axvspan(1e-2, 1e2, color="grey", alpha=0.1)
    ax.axhline(BREAK_LEVEL, color="grey", ls=":", lw=1)
    ax.set_xlabel("scale a")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
  axes[0].legend(fontsize=7)
  fig.suptitle("Scale invariance (float32, jaxnorm custom VJP; shaded: a in [1e-2, 1e2]; "
               f"errors below {floor:g} drawn at {floor:g})", fontsize=10)
  files.append(ctx.save_figure(fig, "scale_invariance.png"))

  fig, axes = ctx.subplots(1, 2, figsize=(11, 4))
  for ax, key, title in ((axes[0], "fwd", "forward: max |N(x + c) - N(x)|"),
                         (axes[1], "grad", "gradient: rel. max |d/dx N(x + c) - d/dx N(x)|")):
    for label in ("LayerNorm eps=1e-6", "LayerNorm eps=0", "RMSNorm eps=1e-6"):
      ax.loglog(grid, np.maximum(data["op"]["shift"][label][key], floor), marker="o", ms=3, label=label)
    ax.set_xlabel("shift c")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
  axes[0].legend(fontsize=8)
  fig.suptitle("Shift invariance: LayerNorm is invariant (up to rounding of x + c), RMSNorm is not",
               fontsize=10)
  files.append(ctx.save_figure(fig, "shift_invariance.png"))

  model = data.get("model")
  if model:
    files.append(_plot_grad_norms(ctx, model))
  return files


def _plot_grad_norms(ctx, model: dict) -> str:
  """``grad_norms_ln_vs_rms.png``: per-layer gradient norms of LN and RMS Pre-LN models at init and their
  total block-weight gradient norm in training (``model``: :func:`model_grad_norms`)."""
  from jaxnorm import OPS  # the layers' class names label the curves
  fig, axes = ctx.subplots(1, 2, figsize=(11, 4))
  ax = axes[0]
  groups = ("attn_qkv", "attn_out", "mlp_in", "mlp_out")
  for norm, ls, short in (("layer_norm", "-", "LN"), ("rms_norm", "--", "RMS")):
    for gi, g in enumerate(groups):
      vals = model["init"][norm][g]
      ax.plot(np.arange(1, len(vals) + 1), vals, ls, color=f"C{gi}",
              label=f"{g} ({short})")
  ax.set_xlabel("layer")
  ax.set_ylabel("gradient norm at init")
  ax.set_yscale("log")
  ax.set_title("Pre-LN model at init: LN (solid) vs RMS (dashed)", fontsize=10)
  ax.legend(fontsize=6, ncol=2)
  ax = axes[1]
  for norm in ("layer_norm", "rms_norm"):
    c = model["train"][norm]
    ax.plot(c["step"], c["total"], label=OPS[norm].layer, lw=1)  # the layer's class name
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("norm of all block-weight gradients")
  ax.set_title(f"during training (median RMS/LN ratio {model['train_ratio_median']:z.2f})", fontsize=10)
  ax.legend(fontsize=8)
  return ctx.save_figure(fig, "grad_norms_ln_vs_rms.png")


def units(cfg: Config) -> list:
  """The probe settings (Pre-LN gradients at init) and training runs of :func:`run`, in its order."""
  out = [Unit("invariance", f"init-{norm}", cfg.n_layers, 0, ("grad", cfg.n_layers, "xavier", "pre", norm), "grad")
         for norm in ("layer_norm", "rms_norm")]
  out += [train_unit("invariance", f"pre-{norm}-lr0.001-w0", cfg.n_layers, cfg.train_steps, "pre", norm)
          for norm in ("layer_norm", "rms_norm")]
  return out


def run(ctx, cfg: Config) -> dict:
  """Runs the experiment; returns its summary (data, claims, files)."""
  data = {"op": op_invariance(cfg), "op_weight_grads": weight_grad_norms_op(cfg)}
  ctx.log("op-level invariance done")
  try:
    data["model"] = model_grad_norms(ctx, cfg)
  except ImportError as e:  # the op-level part stands alone
    ctx.log(f"model-level part skipped: {e}")
    data["model"] = None
    data["model_skipped"] = str(e)
  ctx.save_json("data.json", data)
  grid = data["op"]["a"]
  header = ["a"] + [f"{label} {k}" for label, *_ in VARIANTS for k in ("fwd", "grad")]
  ctx.save_csv("scale_invariance.csv", header,
               ([a] + [data["op"]["scale"][label][k][i] for label, *_ in VARIANTS for k in ("fwd", "grad")]
                for i, a in enumerate(grid)))
  files = plot(ctx, data)
  return {"claims": verdicts(data), "files": files, "seeds": list(cfg.seeds),
          "headline": _headline(data)}


def _headline(data):
  grid = np.asarray(data["op"]["a"])
  sc = data["op"]["scale"]
  rows = []
  for label, *_ in VARIANTS:
    f = np.asarray(sc[label]["fwd"])
    g = np.asarray(sc[label]["grad"])
    inner = (grid >= 1e-2 - 1e-12) & (grid <= 1e2 + 1e-12)
    rows.append({"variant": label, "fwd_max_inner": float(f[inner].max()), "fwd_max_all": float(f.max()),
                 "grad_max_inner": float(g[inner].max()), "grad_max_all": float(g.max())})
  return rows


def report_section(summary: dict, rel: str) -> str:
  """Markdown section of the invariance experiment: the question, the plots and the error table.

  The protocol (``summary``, ``rel``, what the report adds) is in :mod:`experiments.suite.report`.
  """
  lines = [
      "Question: is RMSNorm(a x) = RMSNorm(x), and is the gradient with respect to the original x "
      "independent of a, as the source notes say; where does epsilon break it; is LayerNorm shift "
      "invariant; are LN and RMS weight-gradient norms close? (float32, jaxnorm custom-VJP ops, "
      "errors are maxima over rows, features and seeds.)", "",
      f"![scale invariance]({rel}/scale_invariance.png)", "",
      "*RMSNorm's forward and gradient error against the input scale a (log-log), without epsilon (float32 "
      "rounding) and with the default epsilon beside its closed-form prediction.*", "",
      "| variant | max fwd error, a in [1e-2, 1e2] | over [1e-3, 1e3] | max rel. grad error, [1e-2, 1e2] "
      "| over [1e-3, 1e3] |",
      "|---|---|---|---|---|",
  ]
  for r in summary["headline"]:
    lines.append(f"| {r['variant']} | {r['fwd_max_inner']:z.1e} | {r['fwd_max_all']:z.1e} | "
                 f"{r['grad_max_inner']:z.1e} | {r['grad_max_all']:z.1e} |")
  lines += [
      "",
      "Without epsilon both norms are scale invariant to float32 rounding over six decades. With "
      "epsilon = 1e-6 inside the square root the error follows the closed-form factor "
      "sqrt((ms + eps) / (ms + eps / a^2)) (dashed line): it is epsilon, not the implementation, "
      "that breaks invariance once a^2 E[x^2] is no longer large against eps (the break points "
      "are in the list below). With epsilon outside the square root the error scales like eps / a "
      "instead of eps / a^2, so it breaks later.",
      "",
      f"![shift invariance]({rel}/shift_invariance.png)", "",
      "*Output change under a constant shift c of the input: LayerNorm (invariant up to the rounding of x + c) "
      "and RMSNorm (not invariant).*", "",
  ]
  if "grad_norms_ln_vs_rms.png" in summary.get("files", []):
    lines += [f"![LN vs RMS gradient norms]({rel}/grad_norms_ln_vs_rms.png)", "",
              "*Weight-gradient norms of LayerNorm and RMSNorm models: the op, a Pre-LN model at init and in "
              "training (same seed).*", ""]
  return "\n".join(lines)


def reanalyse(ctx, cfg: Config, summary: dict) -> dict:
  """The summary with its claims judged again from the folder's ``data.json`` (no measuring; figures and
  tables kept: they do not depend on the rules; :mod:`experiments.suite.reanalyse`)."""
  from experiments.suite.registry import read_json
  return {**summary, "claims": verdicts(read_json(ctx.exp_dir / "data.json"))}
