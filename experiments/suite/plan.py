r"""The chunk plan of a preset: its units (training runs, probe settings) with estimated times.

``python -m experiments run --preset gpu --list`` prints it. A *unit* is what the suite caches
(:mod:`experiments.suite.context`): one training run or one probe setting. The plan lists them in
the order the suite computes them, as each study declares them (``units(cfg)`` of the study
protocol, :mod:`experiments.suite.study`; the smoke test checks that the counts agree with what
the suite cached) and packs them greedily, in that order, into chunks of at most
:data:`CHUNK_S` seconds. Each chunk is one invocation of

.. code-block:: bash

   python -m experiments run --preset gpu --budget 7

(the same command every time: ``--budget`` stops before a unit that would end past 7 minutes,
and the next invocation starts at the first unit that is not cached).

**The times are estimates**, from a cost model per device kind (:data:`COSTS`):

.. math::

   t_\text{run} = c_\text{compile}\,[\text{first time in the plan}]
      + n_\text{steps}\,(s_0 + s_1 (L - 6)) + t_\text{start}

with the per-step time of the H100 speed experiment (4.8 ms device time for the 6-layer
width-256 step, about 8 ms with the host's per-step work, 0.8 ms per further layer;
``docs/experiments.md``) and compile times that no longer grow with depth (the blocks are
scanned: :mod:`jaxnorm.models`). The compile constants for the H100 are the unrolled 6-layer
figures of the issue's H100 measurements (grad_init settings of about 10 s at 6 layers; depth
runs whose first compile took about 50 s at 24 layers, about 2 s per layer, so about 15 s at 6)
raised by the scanned/unrolled-6-layer compile-time ratio measured on the CPU (1.0-1.7x): 18 s
for a train step, 10 s for a gradient function. They are estimates until a GPU chunk is timed.

**Two CPU kinds (issue 31).** ``cpu-avx512`` is the Intel Xeon of this project's 2-core machines,
calibrated on its clean ``cpu`` and ``cpu-extra`` runs, with a step time per sequence length of
the preset (16 x 32 tokens for ``cpu``, 16 x 64 for ``cpu-extra``); ``cpu-avx2`` (AMD EPYC, AVX2
only) is the same model times :data:`AVX2_FACTOR` (1.49: the AMD machine's own measured step over
this Intel's; the issue's 1.8 was relative to a faster Intel machine). A CPU
preset runs as one invocation, so its plan is one chunk; ``--list`` prints both kinds.
"""

from __future__ import annotations

import dataclasses

from experiments.suite import presets as presets_lib
from experiments.suite import study
from experiments.suite.registry import EXPERIMENTS
from experiments.suite.study import Unit

__all__ = ["AVX2_FACTOR", "CHUNK_S", "COSTS", "CPU_KINDS", "Cost", "Unit", "chunks", "default_kinds", "format_plan",
           "total_s", "units"]

CHUNK_S = 420.0  # 7 minutes: the gpu preset's chunks and their start-ups fit a 30-minute lease


@dataclasses.dataclass(frozen=True)
class Cost:
  """Cost model of one device kind (seconds).

  Attributes:
    step_at: measured steps that replace the linear model, ``{(n_layers, seq_len): seconds}``.
    layout_factor: a measured layout's step over the ``ref_layout`` step at the same depth, ``{(batch,
      seq_len): factor}`` (the ``scale`` study's layouts of 512 tokens a step at sequence 128 and 256); a
      layout not listed is priced as the reference batch's step at its sequence length times ``batch / ref
      batch``.
    ref_layout: ``(batch, seq_len)`` of the steps ``step_s`` was measured with (its batch for every length).
    update_s: the measured seconds of one update probe, its compile included (``None``: the formula of
      :func:`unit_seconds`).
    guessed: layouts ``(batch, seq_len)`` whose factor is a guess, not a measurement (the plan says so).
    step_s: one training step of a 6-layer width-64 (CPU) or width-256 (GPU) model, host work
      and evaluations included, per sequence length of the preset's batches.
    step_per_layer_s: added per layer beyond 6 (taken off per layer below 6), per sequence length.
    compile_train_s: compiling a train step and its eval step (any depth: scanned blocks).
    compile_grad_s: compiling the gradient function of the probes (any depth).
    start_s: per unit: building the model, data, evaluation, files.
    invocation_s: per chunk: process start, imports, corpus, provenance.
    op_s: one op-level speed measurement (shape, implementation, op).
  """

  step_s: dict
  step_per_layer_s: dict
  compile_train_s: float
  compile_grad_s: float
  start_s: float
  invocation_s: float
  op_s: float
  step_at: dict = dataclasses.field(default_factory=dict)
  layout_factor: dict = dataclasses.field(default_factory=dict)
  guessed: frozenset = frozenset()
  ref_layout: tuple = (16, 32)
  update_s: float | None = None

  def step(self, n_layers: int, seq_len: int, batch_size: int | None = None) -> float:
    """Seconds per training step at ``n_layers`` with batches of ``seq_len`` tokens (``batch_size`` of them,
    where the unit sets its own layout).

    Raises:
      ValueError: no step time was measured at ``seq_len`` (or at the layout) on this kind.
    """
    if batch_size is not None and (batch_size, seq_len) in self.layout_factor:
      return self.layout_factor[(batch_size, seq_len)] * self.step(n_layers, self.ref_layout[1])
    if batch_size is not None and batch_size != self.ref_layout[0]:
      # Not measured: the calibrated step of the reference batch at this sequence length, scaled by the windows.
      return self.step(n_layers, seq_len) * batch_size / self.ref_layout[0]
    if (n_layers, seq_len) in self.step_at:
      return self.step_at[(n_layers, seq_len)]
    if seq_len not in self.step_s:
      raise ValueError(f"seq_len must be one this cost model was calibrated at, {sorted(self.step_s)}, got "
                       f"{seq_len}; measure a step there and add it to COSTS.")
    # Linear in the depth on both sides of 6 (a 2-layer step costs less than a 6-layer one),
    # never below one layer's share.
    per_layer = self.step_per_layer_s[seq_len]
    return max(self.step_s[seq_len] + per_layer * (n_layers - 6), per_layer)

  def scaled(self, factor: float) -> "Cost":
    """The same model with every time multiplied by ``factor`` (a slower CPU of the same code)."""
    return Cost({k: v * factor for k, v in self.step_s.items()},
                {k: v * factor for k, v in self.step_per_layer_s.items()},
                self.compile_train_s * factor, self.compile_grad_s * factor, self.start_s * factor,
                self.invocation_s * factor, self.op_s * factor, {k: v * factor for k, v in self.step_at.items()},
                dict(self.layout_factor), self.guessed, self.ref_layout,
                None if self.update_s is None else self.update_s * factor)


# The Intel Xeon (AVX-512, 2 cores) this was calibrated on, issue 31 (2026-11-26): a 6-layer step
# of the width-64 model, logging and evaluations included, 30 ms at 16 x 32 tokens and 78-80 ms at
# 16 x 64; a 12-layer step 78-86 ms at 16 x 32 (so 8 ms per further layer there); a compile about
# 5 s; the pilots' 300-step runs 8-9 s (experiments/results/pilots). Measured with the job at the
# highest priority while another job used the other core; the clean runs of issue 31 themselves
# shared the cores (load 3.5-7), so their wall times are upper bounds.
#
# The 2-layer step at 16 x 32 tokens (the dyt study, issue 36) is measured, not extrapolated (the linear model
# goes below zero there): 0.31 x the 6-layer step, from 5 interleaved rounds of 40 steps each
# (experiments/results/pilots/dyt/timing.jsonl: 19.9 vs 64.2 ms at load 9, the train step alone) and from
# whole 240-step runs with their evaluations (ratio 0.317 at load 8.3-8.6, pilots README); 0.31 x 30 ms,
# rounded up.
# The 2-layer step at 16 x 64 tokens (the qk_norm study of cpu-extra) is measured too, from the clean cpu-extra
# run at 06b2b44 (load 5.9 at its start): the study's 170 s for 72 runs of 80 steps, less 4 compiles (20 s) and
# 72 starts (36 s), is 19.8 ms a step (the linear model said 42 ms); 2 x the (2, 32) step agrees.
# The scale study's layouts of 512 tokens a step (issue 55), measured side by side with the 16 x 32 step of the
# same 6-layer model (max_len 256), 5 interleaved rounds of 30 steps after a compile round
# (experiments/results/pilots/scale/timing.jsonl; the ratios hold on a loaded machine, the absolute times do
# not): on the AMD EPYC with AVX-512, 4 x 128 costs 1.89 and 2 x 256 2.39 times the 16 x 32 step; with
# XLA_FLAGS=--xla_cpu_max_isa=AVX2 (the AVX2 programs on the same CPU, the stand-in for the AVX2-only machine),
# 2.40 and 4.31 times.
LAYOUT_AVX512 = {(4, 128): 1.89, (2, 256): 2.39}
LAYOUT_AVX2 = {(4, 128): 2.40, (2, 256): 4.31}
_AVX512 = Cost(step_s={32: 0.030, 64: 0.078}, step_per_layer_s={32: 0.008, 64: 0.009}, compile_train_s=5.0,
               compile_grad_s=3.0, start_s=0.5, invocation_s=12.0, op_s=1.0,
               step_at={(2, 32): 0.0095, (2, 64): 0.020}, layout_factor=LAYOUT_AVX512)
# AMD EPYC, AVX2 only: its own measured step, 0.116 s for the 16 x 64 model (issue 31's per-study times of
# a clean cpu run at 715294c: the warm-up grid, 3840 steps in 447 s), over this Intel's 0.078 s. The
# issue's "1.8x" compared it with another, faster Intel machine (the README's 12 min 38 s run); the
# same factor is assumed for every other cost (not measured there).
AVX2_FACTOR = 0.116 / 0.078

COSTS = {
    # Estimates for one H100 (see the module docstring): not measured end to end.
    # Calibrated on the H200 run of the gpu preset (experiments/results/gpu-h200-2026-11-28/preset-run.log,
    # issue 50): a 500-step 6-layer run of 32 x 256 bytes took 5.3 s with its evaluations and start (9.8 ms a step), a
    # 12-layer one 9.0 s (18 ms: 1.25 ms per further layer); the first run of a program 11-17 s more (its
    # compile), an update probe about 6 s. The 256 x 32 layout (the scale study's mirror leg, issue 55) is a
    # guess: the same tokens as 32 x 256 with an eighth of the attention work; 0.8 of its step until a GPU
    # measures it.
    "gpu": Cost(step_s={256: 9.8e-3}, step_per_layer_s={256: 1.25e-3}, compile_train_s=12.0, compile_grad_s=10.0,
                start_s=0.3, invocation_s=20.0, op_s=2.0, layout_factor={(256, 32): 0.8},
                guessed=frozenset({(256, 32)}), ref_layout=(32, 256), update_s=6.0),
    "cpu-avx512": _AVX512,
    "cpu-avx2": dataclasses.replace(_AVX512.scaled(AVX2_FACTOR), layout_factor=LAYOUT_AVX2),
}
CPU_KINDS = ("cpu-avx512", "cpu-avx2")


def default_kinds(preset_name: str) -> tuple[str, ...]:
  """The device kinds a preset's plan is printed for: the GPU for ``gpu`` and ``gpu-*``, both CPU kinds
  otherwise."""
  return ("gpu",) if preset_name == "gpu" or preset_name.startswith("gpu-") else CPU_KINDS


def _config(preset: dict, name: str):
  module = study.load(EXPERIMENTS[name])
  return module, module.Config(**preset.get(name, {}))


def units(preset_name: str) -> list[Unit]:
  """Every unit of a preset, in the order the suite computes them: each study's own
  ``units(cfg)`` (:mod:`experiments.suite.study`), in the order of the report, rates of the form
  ``("lr/d", c)`` in their ``run_key`` resolved with the preset's width."""
  preset = presets_lib.get_preset(preset_name)
  d = preset.get("model", {}).get("d_model")
  out: list[Unit] = []
  for name in presets_lib.studies(preset):
    module, cfg = _config(preset, name)
    out += [dataclasses.replace(u, run_key=_resolve(u.run_key, d)) for u in module.units(cfg)]
  return out


def _resolve(key: tuple, d_model: int | None) -> tuple:
  return tuple(float(f"{x[1] / d_model:z.4g}") if isinstance(x, tuple) and len(x) == 2 and x[0] == "lr/d"
               and d_model else x for x in key)


def unit_seconds(unit: Unit, cost: Cost, compiled: set, seq_len: int, n_ops: int = 8) -> float:
  """Estimated seconds of ``unit`` (batches of ``seq_len`` tokens); adds its compile key to
  ``compiled`` (first time pays) and its ``run_key`` (a run already priced costs nothing: the suite's
  cache finds it)."""
  if unit.run_key:
    if ("run",) + unit.run_key in compiled:
      return 0.0
    compiled.add(("run",) + unit.run_key)
  first = unit.compile_key not in compiled
  compiled.add(unit.compile_key)
  if unit.kind == "op":
    return n_ops * cost.op_s
  if unit.kind == "grad":
    return cost.start_s + (cost.compile_grad_s if first else 0.0)
  t = cost.start_s + unit.steps * cost.step(unit.n_layers, unit.seq_len or seq_len, unit.batch_size)
  if unit.kind == "update" and cost.update_s is not None:
    return cost.update_s
  if unit.kind == "update":  # plus the probe's own forward functions (about a third)
    return t + (cost.compile_train_s if first else 0.0) + cost.compile_train_s / 3
  return t + (cost.compile_train_s if first else 0.0)


def chunks(preset_name: str, device: str | None = None, limit_s: float = CHUNK_S) -> list[list]:
  """Greedy packing of :func:`units` into chunks of at most ``limit_s`` estimated seconds (on a
  CPU kind, by default, one chunk: the CPU presets run as one invocation).

  Returns:
    A list of chunks, each a list of ``(unit, seconds)``; a chunk's total includes the
    invocation start-up.
  """
  device = device or default_kinds(preset_name)[0]
  cost = COSTS[device]
  if device in CPU_KINDS and limit_s == CHUNK_S:
    limit_s = float("inf")        # a CPU preset runs as one invocation
  seq_len = presets_lib.get_preset(preset_name)["train"]["seq_len"]
  compiled: set = set()
  plan, current, total = [], [], cost.invocation_s
  for u in units(preset_name):
    t = unit_seconds(u, cost, compiled, seq_len)
    if current and total + t > limit_s:
      plan.append(current)
      current, total = [], cost.invocation_s
    current.append((u, t))
    total += t
  if current:
    plan.append(current)
  return plan


def total_s(preset_name: str, device: str) -> float:
  """The estimated seconds of a whole preset on ``device`` (a key of :data:`COSTS`), every chunk's
  start-up included."""
  cost = COSTS[device]
  return sum(cost.invocation_s + sum(t for _, t in c) for c in chunks(preset_name, device))


def format_plan(preset_name: str, device: str | None = None) -> str:
  """The chunk plan as text: per chunk, its experiments, unit counts and estimated seconds."""
  device = device or default_kinds(preset_name)[0]
  cost = COSTS[device]
  plan = chunks(preset_name, device)
  lines = [f"chunk plan of preset {preset_name!r} (estimated, cost model {device!r}; "
           + ("one invocation):" if device in CPU_KINDS else f"chunks <= {CHUNK_S / 60:z.0f} min):")]
  grand = 0.0
  for i, chunk in enumerate(plan, 1):
    total = cost.invocation_s + sum(t for _, t in chunk)
    grand += total
    per_exp: dict[str, list] = {}
    for u, t in chunk:
      per_exp.setdefault(u.experiment, []).append(t)
    parts = ", ".join(f"{e} {len(ts)} units {sum(ts):z.0f} s" for e, ts in per_exp.items())
    lines.append(f"  chunk {i}: ~{total / 60:z.1f} min  ({parts})")
  lines.append(f"  total: ~{grand / 60:z.1f} min in {len(plan)} chunks")
  guessed = sorted({(u.batch_size, u.seq_len) for c in plan for u, _ in c} & set(cost.guessed))
  if guessed:
    lines.append("  not calibrated on this kind (a guess until measured): layouts "
                 + ", ".join(f"{b} x {t}" for b, t in guessed))
  if device in CPU_KINDS:
    lines.append(f"run it as: python -m experiments run --preset {preset_name}")
    return "\n".join(lines)
  budget = f" --budget {CHUNK_S / 60:z.0f}"
  lines.append(f"run each chunk as: python -m experiments run --preset {preset_name}{budget}"
               f"   (the same command {len(plan)} times; it resumes where the last one stopped)")
  return "\n".join(lines)
