#!/usr/bin/env bash
# Device window 1 (issue 37, step 1): the gpu preset's report on one lent GPU.
# Run from the repository root on the device machine; $OUT is where files come back.
# Uses the image's JAX/Flax (PYTHONPATH=.), records the device and versions, runs the preset
# within --budget, then packs the exported report and the run cache (compile cache excluded).
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-7}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv
  python3 -c "import sys, jax, flax, optax; print(sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
  git log -1 --format='code %H' 2>/dev/null || true
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
start=$(date +%s)
python3 -m experiments run --preset gpu --budget "$BUDGET" --no-progress --export /tmp/gpu-export 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
echo "wall_s $(( $(date +%s) - start )) rc $rc" | tee -a "$OUT/device.txt"
tar czf "$OUT/gpu-export.tgz" -C /tmp gpu-export 2>/dev/null
tar czf "$OUT/gpu-results.tgz" --exclude=jax_cache results/gpu 2>/dev/null
exit "$rc"
