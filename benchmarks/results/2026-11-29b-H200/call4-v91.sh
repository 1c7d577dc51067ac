#!/usr/bin/env bash
# Session 26 call 4 (one H200, one rank), the final tree: the GPU-marked tests, then the README's example cold twice
# (a fresh Triton cache and tuning cache each).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{ date -u; git log --oneline -1 2>/dev/null; nvidia-smi -L; nproc; } > "$OUT/log.txt" 2>&1
PYTHONPATH=/tmp/site timeout 200 python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
echo "== gpu tests rc=$? at $SECONDS s" >> "$OUT/log.txt"; tail -3 "$OUT/gpu-tests.txt" >> "$OUT/log.txt"
for r in 1 2; do
  [ $SECONDS -gt 250 ] && { echo "no time for example $r" >> "$OUT/log.txt"; break; }
  export TRITON_CACHE_DIR=$(mktemp -d); rm -rf .autotune_logs
  TRITON_CTX_TUNE_CACHE_DIR=$(mktemp -d) timeout 40 ./launch examples/tp_mlp.py > "$OUT/example$r.txt" 2>&1
  echo "== example $r rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "first call|compile:|second call" "$OUT/example$r.txt" >> "$OUT/log.txt"
  unset TRITON_CACHE_DIR
done
date -u >> "$OUT/log.txt"
