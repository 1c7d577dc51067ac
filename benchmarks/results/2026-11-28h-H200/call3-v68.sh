#!/usr/bin/env bash
# Session 23 call 3 (2 H200) at a658526 (flush_l2="step" the default): issue 37's rows under the new default:
# the FLA step cold 3 times with plain triton.autotune once, the MLP op cold 3 times, the README's example cold
# 3 times (a fresh Triton cache and tuning cache each).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{ date -u; git log --oneline -1 2>/dev/null; grep -c 'flush_l2: bool | str = "step"' triton_ctx_tune/options.py; grep -c "def in_sweep" benchmarks/bench_gemm_space.py; nvidia-smi -L; nproc; } > "$OUT/log.txt" 2>&1
for r in 1 2 3; do
  export TRITON_CACHE_DIR=$(mktemp -d); rm -rf .autotune_logs
  TRITON_CTX_TUNE_CACHE_DIR=$(mktemp -d) timeout 60 ./launch examples/tp_mlp.py > "$OUT/example$r.txt" 2>&1
  echo "== example $r rc=$? $(date -u +%T)" >> "$OUT/log.txt"; grep -E "first call|compile:|keys tuned|tuned in" "$OUT/example$r.txt" | head -4 >> "$OUT/log.txt"
  unset TRITON_CACHE_DIR
done
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/bench_compile_node.py --out /tmp/resm --worlds 2 --ops mlp \
  --arms ours --repeats 3 --timeout-s 45 > "$OUT/mlp-cold.log" 2>&1; echo "== mlp cold rc=$? $(date -u +%T)" >> "$OUT/log.txt"
grep -E "cold step|compile:" "$OUT/mlp-cold.log" >> "$OUT/log.txt"
PYTHONPATH=/tmp/site:$PWD timeout 330 python3 benchmarks/bench_compile_node.py --out /tmp/resf --worlds 2 --ops fla \
  --arms ours,plain --once plain --repeats 3 --timeout-s 160 > "$OUT/fla.log" 2>&1; echo "== fla rc=$? $(date -u +%T)" >> "$OUT/log.txt"
grep -E "cold|compile:" "$OUT/fla.log" >> "$OUT/log.txt"
tar czf "$OUT/res.tgz" -C /tmp resm resf 2>/dev/null
date -u >> "$OUT/log.txt"
