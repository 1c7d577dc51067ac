#!/usr/bin/env bash
# Session 25 call 4 (one H200, one rank), tree 886157a: the README's example cold and the MLP op cold (bench_mlp),
# alternating, 3 each, on one host, with their rank logs; the timelines of both.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NPROC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; grep -c "_early_ends" triton_ctx_tune/engine/schedule.py; nvidia-smi -L; nproc; lscpu | grep -E "Model name"; } > "$OUT/log.txt" 2>&1
for r in 1 2 3; do
  export TRITON_CACHE_DIR=$(mktemp -d); rm -rf .autotune_logs
  TRITON_CTX_TUNE_CACHE_DIR=$(mktemp -d) timeout 40 ./launch examples/tp_mlp.py > "$OUT/example$r.txt" 2>&1
  echo "== example $r rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "first call|compile:" "$OUT/example$r.txt" >> "$OUT/log.txt"
  mkdir -p /tmp/res/example-$r/ctx_logs/x && cp .autotune_logs/*/rank-0.jsonl /tmp/res/example-$r/ctx_logs/x/ 2>/dev/null || cp .autotune_logs/rank-0.jsonl /tmp/res/example-$r/ctx_logs/x/
  unset TRITON_CACHE_DIR
  timeout 90 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla --out /tmp/res/bench-$r > /tmp/res/bench-$r.log 2>&1
  echo "== bench $r rc=$? at $SECONDS s" >> "$OUT/log.txt"
done
python3 .device/tl.py /tmp/res/example-* /tmp/res/bench-1 /tmp/res/bench-2 /tmp/res/bench-3 >> "$OUT/log.txt" 2>&1
ls -R .autotune_logs | head -5 >> "$OUT/log.txt"
tar czf "$OUT/res.tgz" -C /tmp res 2>/dev/null
date -u >> "$OUT/log.txt"
