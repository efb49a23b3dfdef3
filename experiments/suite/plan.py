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
The ``cpu`` constants come from the last clean 2-core ``cpu`` run and the CPU compile times.
"""

from __future__ import annotations

import dataclasses

from experiments.suite import presets as presets_lib
from experiments.suite import study
from experiments.suite.registry import EXPERIMENTS
from experiments.suite.study import Unit

__all__ = ["CHUNK_S", "COSTS", "Unit", "chunks", "format_plan", "units"]

CHUNK_S = 420.0  # 7 minutes: the gpu preset's chunks and their start-ups fit a 30-minute lease


@dataclasses.dataclass(frozen=True)
class Cost:
  """Cost model of one device kind (seconds).

  Attributes:
    step_s: one training step of a 6-layer model (host work included).
    step_per_layer_s: added per layer beyond 6.
    compile_train_s: compiling a train step and its eval step (any depth: scanned blocks).
    compile_grad_s: compiling the gradient function of the probes (any depth).
    start_s: per unit: building the model, data, evaluation, files.
    invocation_s: per chunk: process start, imports, corpus, provenance.
    op_s: one op-level speed measurement (shape, implementation, op).
  """

  step_s: float
  step_per_layer_s: float
  compile_train_s: float
  compile_grad_s: float
  start_s: float
  invocation_s: float
  op_s: float

  def step(self, n_layers: int) -> float:
    """Seconds per training step at ``n_layers``."""
    return self.step_s + self.step_per_layer_s * max(n_layers - 6, 0)


COSTS = {
    # Estimates for one H100 (see the module docstring): not measured end to end.
    "gpu": Cost(step_s=8e-3, step_per_layer_s=0.8e-3, compile_train_s=18.0, compile_grad_s=10.0,
                start_s=0.3, invocation_s=20.0, op_s=2.0),
    # The 2-core CPU (width 64), from the last clean cpu run (warm-up grid: 7200 6-layer steps
    # in 475 s) and the scanned compiles measured on it.
    "cpu": Cost(step_s=0.06, step_per_layer_s=0.009, compile_train_s=6.0, compile_grad_s=3.0,
                start_s=0.3, invocation_s=10.0, op_s=1.0),
}


def _config(preset: dict, name: str):
  module = study.load(EXPERIMENTS[name])
  return module, module.Config(**preset.get(name, {}))


def units(preset_name: str) -> list[Unit]:
  """Every unit of a preset, in the order the suite computes them: each study's own
  ``units(cfg)`` (:mod:`experiments.suite.study`), in the order of the report."""
  preset = presets_lib.get_preset(preset_name)
  out: list[Unit] = []
  for name in EXPERIMENTS:
    module, cfg = _config(preset, name)
    out += module.units(cfg)
  return out


def unit_seconds(unit: Unit, cost: Cost, compiled: set, n_ops: int = 8) -> float:
  """Estimated seconds of ``unit``; adds its compile key to ``compiled`` (first time pays)."""
  first = unit.compile_key not in compiled
  compiled.add(unit.compile_key)
  if unit.kind == "op":
    return n_ops * cost.op_s
  if unit.kind == "grad":
    return cost.start_s + (cost.compile_grad_s if first else 0.0)
  t = cost.start_s + unit.steps * cost.step(unit.n_layers)
  if unit.kind == "update":  # plus the probe's own forward functions (about a third)
    return t + (cost.compile_train_s if first else 0.0) + cost.compile_train_s / 3
  return t + (cost.compile_train_s if first else 0.0)


def chunks(preset_name: str, device: str | None = None, limit_s: float = CHUNK_S) -> list[list]:
  """Greedy packing of :func:`units` into chunks of at most ``limit_s`` estimated seconds.

  Returns:
    A list of chunks, each a list of ``(unit, seconds)``; a chunk's total includes the
    invocation start-up.
  """
  cost = COSTS[device or ("gpu" if preset_name == "gpu" else "cpu")]
  compiled: set = set()
  plan, current, total = [], [], cost.invocation_s
  for u in units(preset_name):
    t = unit_seconds(u, cost, compiled)
    if current and total + t > limit_s:
      plan.append(current)
      current, total = [], cost.invocation_s
    current.append((u, t))
    total += t
  if current:
    plan.append(current)
  return plan


def format_plan(preset_name: str, device: str | None = None) -> str:
  """The chunk plan as text: per chunk, its experiments, unit counts and estimated seconds."""
  device = device or ("gpu" if preset_name == "gpu" else "cpu")
  cost = COSTS[device]
  plan = chunks(preset_name, device)
  lines = [f"chunk plan of preset {preset_name!r} (estimated, cost model {device!r}; "
           f"chunks <= {CHUNK_S / 60:.0f} min):"]
  grand = 0.0
  for i, chunk in enumerate(plan, 1):
    total = cost.invocation_s + sum(t for _, t in chunk)
    grand += total
    per_exp: dict[str, list] = {}
    for u, t in chunk:
      per_exp.setdefault(u.experiment, []).append(t)
    parts = ", ".join(f"{e} {len(ts)} units {sum(ts):.0f} s" for e, ts in per_exp.items())
    lines.append(f"  chunk {i}: ~{total / 60:.1f} min  ({parts})")
  lines.append(f"  total: ~{grand / 60:.1f} min in {len(plan)} chunks")
  budget = f" --budget {CHUNK_S / 60:.0f}"
  lines.append(f"run each chunk as: python -m experiments run --preset {preset_name}{budget}"
               f"   (the same command {len(plan)} times; it resumes where the last one stopped)")
  return "\n".join(lines)
