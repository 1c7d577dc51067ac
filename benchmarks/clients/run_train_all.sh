#!/usr/bin/env bash
# The training-loop benchmark's four arms, each as its own job from its own empty Triton cache, then one report.
# Usage: benchmarks/clients/run_train_all.sh OUT_DIR [train_loop.py options, e.g. --clients cce --steps 100]
# Writes OUT_DIR/train-{fixed,plain,reexec,online}.json and .log, OUT_DIR/ctx_logs/ (the tuner's rank logs),
# OUT_DIR/train.json and OUT_DIR/train.txt (the merged report).
# ARMS (default "fixed plain reexec online") picks arms. NPROC (default 2) ranks, one per GPU, through ./launch (NCCL, NVLink multicast off).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:?usage: run_train_all.sh OUT_DIR [train_loop.py options]}
shift
mkdir -p "$OUT"
export NPROC=${NPROC:-2}
status=0
files=()
for arm in ${ARMS:-fixed plain reexec online}; do
  cache=$(mktemp -d "${TMPDIR:-/tmp}/train-triton-cache-$arm-XXXXXX")
  echo "=== arm $arm: TRITON_CACHE_DIR=$cache"
  TRITON_CACHE_DIR=$cache "$ROOT/launch" "$ROOT/benchmarks/clients/train_loop.py" --arm "$arm" \
    --out "$OUT/train-$arm.json" "$@" 2>&1 | tee "$OUT/train-$arm.log" || status=1
  rm -rf "$cache"
  [[ -f $OUT/train-$arm.json ]] && files+=("$OUT/train-$arm.json")
done
if ((${#files[@]})); then
  "${PYTHON:-python3}" "$ROOT/benchmarks/clients/train_loop.py" --merge "${files[@]}" --out "$OUT/train.json" \
    2>&1 | tee "$OUT/train.txt" || status=1
fi
exit $status
