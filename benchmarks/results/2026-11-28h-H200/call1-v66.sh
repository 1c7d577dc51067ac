#!/usr/bin/env bash
# Session 23 call 1 (2 H200): all-gather + GEMM, 5 cold runs in one call at d8e05e4 (flush_l2="step" default):
# ours default, exhaustive, budget10.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/keep/ag
{ date -u; git log --oneline -1 2>/dev/null; grep -c 'flush_l2: bool | str = "step"' triton_ctx_tune/options.py; nvidia-smi -L; nproc; } > "$OUT/log.txt" 2>&1
for i in 1 2 3 4 5; do
  [ $SECONDS -gt 500 ] && { echo "no time for ag run $i" >> "$OUT/log.txt"; break; }
  NPROC=2 timeout 90 ./launch benchmarks/bench_ag_gemm.py --arms exhaustive,ours,budget10 --no-warm --out /tmp/ag$i > /tmp/keep/ag/ag$i.log 2>&1
  echo "== ag$i rc=$? at $SECONDS s" >> "$OUT/log.txt"
  grep -E "^\| (exhaustive|ours|budget10) " /tmp/keep/ag/ag$i.log >> "$OUT/log.txt"
  mkdir -p /tmp/keep/ag/run$i; cp -r /tmp/ag$i/* /tmp/keep/ag/run$i/ 2>/dev/null
done
tar czf "$OUT/ag.tgz" -C /tmp/keep ag
date -u >> "$OUT/log.txt"
