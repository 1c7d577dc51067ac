#!/usr/bin/env bash
# Session 23 call 2 (one H200): the large GEMM space (1152 configs, 3 shapes) under flush_l2="step" (the default
# since 753f368): exhaustive against budget 10%, re-timed oracle, as many runs as fit.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/keep/gs
{ date -u; git log --oneline -1 2>/dev/null; grep -c 'flush_l2: bool | str = "step"' triton_ctx_tune/options.py; nvidia-smi -L; nproc; } > "$OUT/log.txt" 2>&1
for i in 1 2 3 4 5; do
  [ $SECONDS -gt 420 ] && { echo "no time for run $i" >> "$OUT/log.txt"; break; }
  timeout 170 python3 benchmarks/bench_gemm_space.py --compiles "" --out /tmp/gs$i > /tmp/keep/gs/gs$i.log 2>&1
  echo "== gs$i rc=$? at $SECONDS s" >> "$OUT/log.txt"
  grep -E "exhaustive:|budget 0|^\| (exhaustive|budget)" /tmp/keep/gs/gs$i.log >> "$OUT/log.txt"
  mkdir -p /tmp/keep/gs/run$i; cp /tmp/gs$i/*.json /tmp/keep/gs/run$i/ 2>/dev/null
  for r in /tmp/gs$i/ctx_logs/*/rank-0.jsonl; do a=$(basename $(dirname $r)); gzip -c $r > /tmp/keep/gs/run$i/$a-rank0.jsonl.gz; done
done
tar czf "$OUT/gs.tgz" -C /tmp/keep gs
date -u >> "$OUT/log.txt"
