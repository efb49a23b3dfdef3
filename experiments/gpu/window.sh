#!/usr/bin/env bash
# One device window (issue 46, steps 1 and 5): the gpu preset's report, then the checks only a GPU
# shows (the Triton kernels' tests, forward mode and impl="auto" on the GPU's JAX, shard_map).
# Run from the repository root on the device machine; $OUT is where files come back. Each stage has
# its own timeout so that a slow stage never loses the ones before it.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-6}
TEST_S=${TEST_S:-150}
bash experiments/gpu/preset.sh; echo "preset rc $?" | tee -a "$OUT/device.txt"
timeout -k 5 "$TEST_S" python3 -m pytest -q -p no:cacheprovider -x \
  tests/jaxnorm/test_pallas.py tests/jaxnorm/test_forward_mode.py tests/jaxnorm/test_ops_sharding.py > "$OUT/tests-gpu.log" 2>&1
echo "tests rc $?" | tee -a "$OUT/device.txt"
tail -n 5 "$OUT/tests-gpu.log"
