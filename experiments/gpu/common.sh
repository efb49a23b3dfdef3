# Sourced by the device-window scripts of this folder: the environment every window runs in and
# `stage NAME SECONDS CMD...`, which runs one step under its own timeout, logs it to $B/NAME.log,
# appends its exit status to $B/stages.txt and prints the log's tail (a step that runs out of
# time never loses the ones before it); PLAIN, the plain norms' bench implementations; and the
# device's record in $B/device.txt. The script sets B (its log folder) first.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$B"
stage() { local name=$1 secs=$2; shift 2; echo "== $name (timeout ${secs}s) $(date -u +%T)";
  timeout -k 5 "$secs" "$@" > "$B/$name.log" 2>&1; echo "rc $? $name $(date -u +%T)" | tee -a "$B/stages.txt"; tail -n 4 "$B/$name.log"; }
# The plain norms' bench implementations every kernel window compares, and the device's record.
PLAIN="--ops layer_norm,rms_norm --impls jaxnorm-pallas,jaxnorm-xla,flax-linen,jax-pallas-ops,reference-vjp"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$B/device.txt"
