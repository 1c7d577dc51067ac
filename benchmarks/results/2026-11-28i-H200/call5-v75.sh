#!/usr/bin/env bash
# Session 24 call 5 (one H200, one rank): the final rule (fastest sample): the MLP op cold 3 times, then the
# GPU-marked tests.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NPROC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{ date -u; grep -c "def local_fastest" triton_ctx_tune/engine/state.py; nvidia-smi -L; } > "$OUT/log.txt" 2>&1
for i in 1 2 3; do
  PYTHONPATH=/tmp/site timeout 90 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla --out /tmp/res/new-$i > /tmp/new-$i.log 2>&1
  echo "== new $i rc=$? at $SECONDS s" >> "$OUT/log.txt"
done
PYTHONPATH=/tmp/site python3 - >> "$OUT/log.txt" 2>&1 <<'PY'
import json, glob, sys
sys.path.insert(0, "benchmarks")
from bench_compile_node import mlp_cold_rows
for f in sorted(glob.glob("/tmp/res/*/*.json")):
    for r in mlp_cold_rows(json.load(open(f))):
        print(f.split("/")[3], r.get("ours_cold_s"), r.get("ours_executions"))
PY
tar czf "$OUT/res.tgz" -C /tmp res 2>/dev/null
PYTHONPATH=/tmp/site timeout 230 python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
echo "== gpu tests rc=$? at $SECONDS s" >> "$OUT/log.txt"; tail -3 "$OUT/gpu-tests.txt" >> "$OUT/log.txt"
date -u >> "$OUT/log.txt"
