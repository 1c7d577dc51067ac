#!/usr/bin/env bash
# Session 25 call 3 (one H200, one rank), tree 886157a: the FLA step cold 3 times and plain triton.autotune once in
# the same call (bench_compile_node.py), then the README's example cold 3 times (a fresh Triton cache and tuning
# cache each).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{ date -u; grep -c "_early_ends" triton_ctx_tune/engine/schedule.py; nvidia-smi -L; nproc; } > "$OUT/log.txt" 2>&1
PYTHONPATH=/tmp/site timeout 450 python3 benchmarks/bench_compile_node.py --out /tmp/fla --worlds 1 --ops fla \
  --arms ours,plain --once plain --repeats 3 --timeout-s 300 > "$OUT/fla.log" 2>&1
echo "== fla rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "cold step|compile:" "$OUT/fla.log" >> "$OUT/log.txt"
tar czf "$OUT/fla.tgz" -C /tmp fla 2>/dev/null
for r in 1 2 3; do
  [ $SECONDS -gt 540 ] && { echo "no time for example $r" >> "$OUT/log.txt"; break; }
  export TRITON_CACHE_DIR=$(mktemp -d); rm -rf .autotune_logs
  TRITON_CTX_TUNE_CACHE_DIR=$(mktemp -d) timeout 40 ./launch examples/tp_mlp.py > "$OUT/example$r.txt" 2>&1
  echo "== example $r rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "first call|compile:|second call" "$OUT/example$r.txt" >> "$OUT/log.txt"
  unset TRITON_CACHE_DIR
done
date -u >> "$OUT/log.txt"
