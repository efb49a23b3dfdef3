#!/usr/bin/env bash
# Device window 2 (issue 37, steps 2-4): kernels at every width against the copy measured in the
# same process, the per-head (QK) rows, then the GPU-only tests. Each stage has its own timeout
# and writes under /tmp/bench; everything is packed into $OUT/bench.tgz at the end, so a stage
# that runs out of time never loses the ones before it.
set -uo pipefail
B=/tmp/bench
source "$(dirname "$0")/common.sh"
R="--repeats 15 --sample-ms 3"
# bf16: x of 128-256 MiB, widths 1024-16384 (5120, 6144 and 12288 included)
stage bf16 170 python3 -m experiments bench --dtypes bfloat16 $PLAIN $R --out $B/bf16 \
  --shapes 65536x1024,32768x2048,16384x4096,16384x5120,16384x6144,8192x12288,8192x16384
stage f32 80 python3 -m experiments bench --dtypes float32 $PLAIN $R --out $B/f32 \
  --shapes 32768x1024,16384x4096,16384x5120,8192x12288
stage fused 60 python3 -m experiments bench --dtypes bfloat16 --ops add_layer_norm,add_rms_norm \
  --fused-impls jaxnorm-pallas,unfused-pallas,jaxnorm-xla,unfused-xla,flax-linen $R --out $B/fused \
  --shapes 16384x4096,16384x5120
stage qk 45 python3 -m experiments bench-qk --dtype bfloat16 --tokens 16384 --heads 8,32 \
  --head-dims 64,128,256 --repeats 10 --sample-ms 5 --out $B/qk --tag h100
stage tests 70 python3 -m pytest -q -x -p no:cacheprovider tests/jaxnorm/test_pallas.py tests/jaxnorm/test_forward_mode.py
tar czf "$OUT/bench.tgz" -C /tmp bench
cat $B/stages.txt
