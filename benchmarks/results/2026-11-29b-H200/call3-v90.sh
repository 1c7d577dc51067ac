#!/usr/bin/env bash
# Session 26 call 3 (one H200, one rank), the final tree (front workers, the stand-in's group leading its plan): the
# MLP op cold against 9ba59e4, 5 rounds alternating; the FLA step cold 3 times and plain triton.autotune once; the
# GPU-marked tests.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NPROC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/old && tar xzf .device/old-9ba59e4.tgz -C /tmp/old
{ date -u; grep -c "ready_first({index})" triton_ctx_tune/engine/executor.py; nvidia-smi -L; nproc;
  lscpu | grep -E "Model name|Thread|Core|Socket"; } > "$OUT/log.txt" 2>&1
tree() { case $1 in new|plain) echo "$ROOT" ;; old) echo /tmp/old ;; esac; }
mlp() {  # arm round
  local dir=/tmp/mlp/$1-$2; mkdir -p "$dir"; cd "$(tree "$1")"
  PYTHONPATH=/tmp/site timeout 90 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla --out "$dir" > "$dir/run.log" 2>&1
  echo "== mlp $1 $2 rc=$? at $SECONDS s" >> "$OUT/log.txt"; cd "$ROOT"
}
fla() {  # arm round
  local dir=/tmp/fla/$1-$2; mkdir -p /tmp/fla; cd "$(tree "$1")"
  PYTHONPATH=/tmp/site timeout 200 python3 benchmarks/bench_compile_node.py --out "$dir" --worlds 1 --ops fla \
    --arms "$([ "$1" = plain ] && echo plain || echo ours)" --repeats 1 --timeout-s 180 > "$dir.log" 2>&1
  echo "== fla $1 $2 rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "cold step|compile:" "$dir.log" >> "$OUT/log.txt"; cd "$ROOT"
}
arms=(new old)
for i in 1 2 3 4 5; do for k in 0 1; do mlp "${arms[$(( (i + k) % 2 ))]}" "$i"; done; done
PYTHONPATH=/tmp/site python3 - >> "$OUT/log.txt" 2>&1 <<'PY'
import json, glob, os, sys
sys.path.insert(0, "benchmarks")
from bench_compile_node import mlp_cold_rows
rows = {}
for d in sorted(glob.glob("/tmp/mlp/*")):
    arm, i = os.path.basename(d).split("-")
    for f in glob.glob(d + "/*.json"):
        for r in mlp_cold_rows(json.load(open(f))):
            rows.setdefault(arm, []).append((int(i), r.get("ours_cold_s"), r.get("ours_executions") or r.get("executions")))
for arm, v in rows.items():
    print(arm, sorted(v))
PY
fla new 1; fla plain 1; fla new 2; fla new 3
tar czf "$OUT/runs.tgz" -C /tmp fla mlp 2>/dev/null
for d in /tmp/mlp/*-? /tmp/fla/new-?; do python3 .device/tl.py $d $d/fla-ours-1r-1 2>/dev/null >> "$OUT/log.txt"; done
left=$(( 590 - SECONDS ))
if [ $left -gt 120 ]; then
  PYTHONPATH=/tmp/site timeout $left python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
  echo "== gpu tests rc=$? at $SECONDS s" >> "$OUT/log.txt"; tail -3 "$OUT/gpu-tests.txt" >> "$OUT/log.txt"
else echo "no time for the GPU tests ($left s left)" >> "$OUT/log.txt"; fi
date -u >> "$OUT/log.txt"
