#!/usr/bin/env bash
# Both arms of the real-client suite, each as its own job from its own empty Triton cache, then one report.
# Usage: benchmarks/clients/run_all.sh OUT_DIR [run_clients.py options, e.g. --clients fla_simple_gla]
# Writes OUT_DIR/clients-{plain,ours}.json and .log, OUT_DIR/ctx_logs/ (the tuner's rank logs), OUT_DIR/clients.json.
# NPROC (default 2) ranks, one per GPU, through ./launch (NCCL, NVLink multicast off).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:?usage: run_all.sh OUT_DIR [run_clients.py options]}
shift
mkdir -p "$OUT"
export NPROC=${NPROC:-2}
status=0
files=()
for arm in plain ours; do
  cache=$(mktemp -d "${TMPDIR:-/tmp}/clients-triton-cache-$arm-XXXXXX")
  echo "=== arm $arm: TRITON_CACHE_DIR=$cache"
  TRITON_CACHE_DIR=$cache "$ROOT/launch" "$ROOT/benchmarks/clients/run_clients.py" --arm "$arm" \
    --out "$OUT/clients-$arm.json" "$@" 2>&1 | tee "$OUT/clients-$arm.log" || status=1
  rm -rf "$cache"
  [[ -f $OUT/clients-$arm.json ]] && files+=("$OUT/clients-$arm.json")
done
if ((${#files[@]})); then
  "${PYTHON:-python3}" "$ROOT/benchmarks/clients/run_clients.py" --merge "${files[@]}" --out "$OUT/clients.json" || status=1
fi
exit $status
