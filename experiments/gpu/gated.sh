#!/usr/bin/env bash
# Device window for issue 46, step 4 (prepared on CPU, not yet run on a GPU): gated RMSNorm's
# Triton kernels against the unfused jnp composition and the memory floor of their own bytes,
# bfloat16, widths 1024-8192, both gate orders, one group and groups of 128; then the gated
# tests on the GPU (the kernels compiled, not interpreted). Stages have their own timeouts;
# everything is packed into $OUT at the end.
set -uo pipefail
B=/tmp/gated
source "$(dirname "$0")/common.sh"
R="--repeats 11 --sample-ms 3"
SHAPES=65536x1024,32768x2048,16384x4096,8192x8192
stage one-group 120 python3 -m experiments bench-gated --dtypes bfloat16 --impls auto,xla $R \
  --shapes $SHAPES --out $B/one-group --tag gpu
stage groups 90 python3 -m experiments bench-gated --dtypes bfloat16 --impls auto,xla $R \
  --shapes $SHAPES --group-size 128 --orders last --out $B/groups --tag gpu
echo "== tests $(date -u +%T)"
timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider tests/jaxnorm/test_gated.py \
  tests/jaxnorm/test_gated_kernel.py 2>&1 | tee $B/tests-gpu.log | tail -n 25
echo "rc ${PIPESTATUS[0]} tests" | tee -a $B/stages.txt
tar czf "$OUT/gated.tgz" -C /tmp gated
cat $B/stages.txt
