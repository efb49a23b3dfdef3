#!/usr/bin/env bash
# Second device window (issue 46, steps 2 and 5): the kernels at every width against the copy
# measured in the same process (bfloat16, float32, fused add + norm), then the GPU-only tests with
# their output on stdout too. Each stage has its own timeout; results are packed into $OUT at the end.
set -uo pipefail
B=/tmp/bench
source "$(dirname "$0")/common.sh"
R="--repeats 11 --sample-ms 3"
stage bf16 150 python3 -m experiments bench --dtypes bfloat16 $PLAIN $R --out $B/bf16 \
  --shapes 65536x1024,32768x2048,16384x4096,16384x5120,16384x6144,8192x12288,8192x16384
stage f32 60 python3 -m experiments bench --dtypes float32 $PLAIN $R --out $B/f32 \
  --shapes 32768x1024,16384x4096,8192x12288
stage fused 45 python3 -m experiments bench --dtypes bfloat16 --ops add_layer_norm,add_rms_norm \
  --fused-impls jaxnorm-pallas,jaxnorm-xla,unfused-xla,flax-linen $R --out $B/fused --shapes 16384x4096,8192x12288
echo "== tests $(date -u +%T)"
timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider tests/jaxnorm/test_pallas.py tests/jaxnorm/test_forward_mode.py \
  tests/jaxnorm/test_ops_sharding.py 2>&1 | tee $B/tests-gpu.log | tail -n 25
echo "rc ${PIPESTATUS[0]} tests" | tee -a $B/stages.txt
tar czf "$OUT/bench.tgz" -C /tmp bench
cat $B/stages.txt
