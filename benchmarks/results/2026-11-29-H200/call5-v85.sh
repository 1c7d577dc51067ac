#!/usr/bin/env bash
# Session 25 call 5 (one H200, one rank): the MLP op cold, this tree (the least wait from the step's first compile, the gate's
# fewest-waiting order) against 46e2c03, 5 rounds alternating (order rotated per round); a second host for the final tree (886157a).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NPROC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/old && tar xzf .device/old-46e2c03.tgz -C /tmp/old
{ date -u; grep -c "early_ends" triton_ctx_tune/engine/schedule.py /tmp/old/triton_ctx_tune/engine/schedule.py;
  nvidia-smi -L; nproc; lscpu | grep -E "Model name|Thread|Core|Socket"; } > "$OUT/log.txt" 2>&1
one() {  # arm round
  local arm=$1 i=$2 dir=/tmp/res/$1-$2; mkdir -p "$dir"
  case $arm in
    new) (cd "$ROOT" && PYTHONPATH=/tmp/site timeout 90 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla --out "$dir") ;;
    old) (cd /tmp/old && PYTHONPATH=/tmp/site timeout 90 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla --out "$dir") ;;
  esac > "$dir/run.log" 2>&1
  echo "== $arm $i rc=$? at $SECONDS s" >> "$OUT/log.txt"
}
arms=(new old)
for i in 1 2 3 4 5; do
  for k in 0 1; do one "${arms[$(( (i + k) % 2 ))]}" "$i"; done
  [ $SECONDS -gt 250 ] && { echo "stop after round $i" >> "$OUT/log.txt"; break; }
done
PYTHONPATH=/tmp/site python3 - >> "$OUT/log.txt" 2>&1 <<'PY'
import json, glob, os, sys
sys.path.insert(0, "benchmarks")
from bench_compile_node import mlp_cold_rows
rows = {}
for d in sorted(glob.glob("/tmp/res/*")):
    arm, i = os.path.basename(d).split("-")
    for f in glob.glob(d + "/*.json"):
        for r in mlp_cold_rows(json.load(open(f))):
            rows.setdefault(arm, []).append((int(i), r.get("ours_cold_s"), r.get("ours_executions") or r.get("executions")))
for arm, v in rows.items():
    print(arm, sorted(v))
PY
tar czf "$OUT/mlp.tgz" -C /tmp res 2>/dev/null
python3 .device/tl.py /tmp/res/new-* /tmp/res/old-* >> "$OUT/log.txt" 2>&1
date -u >> "$OUT/log.txt"
