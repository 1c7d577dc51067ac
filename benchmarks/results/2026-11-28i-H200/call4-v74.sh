#!/usr/bin/env bash
# Session 24 call 4 (one H200, one rank): the FLA step cold (fla-core 0.6.0, chunked simple GLA, forward and
# backward), this tree (the survivors' race) against 2687653, alternating, 2 runs each, a fresh Triton cache each.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/old && tar xzf .device/old-2687653.tgz -C /tmp/old
{ date -u; grep -c "def next_lockstep_round" triton_ctx_tune/engine/state.py /tmp/old/triton_ctx_tune/engine/state.py; nvidia-smi -L; nproc; } > "$OUT/log.txt" 2>&1
for i in 1 2; do
  for arm in new old; do
    [ $SECONDS -gt 420 ] && break 2
    [ $arm = new ] && cd "$ROOT" || cd /tmp/old
    PYTHONPATH=/tmp/site timeout 170 python3 benchmarks/bench_compile_node.py --out /tmp/fla/$arm$i --worlds 1 --ops fla \
      --arms ours --repeats 1 --timeout-s 160 > /tmp/fla-$arm$i.log 2>&1
    echo "== $arm $i rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "cold step|compile:" /tmp/fla-$arm$i.log >> "$OUT/log.txt"
  done
done
cd "$ROOT"; tar czf "$OUT/fla.tgz" -C /tmp fla $(cd /tmp && ls fla-*.log) 2>/dev/null
date -u >> "$OUT/log.txt"
