#!/usr/bin/env bash
# Session 26 call 1 (one H200, one rank): the FLA step cold, this tree (compile order by the tile per warp, the gate
# counting a key's announced configs) against 9ba59e4, 3 rounds alternating (order rotated per round), plain
# triton.autotune once in the same call.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/old && tar xzf .device/old-9ba59e4.tgz -C /tmp/old
{ date -u; grep -c "_expected" triton_ctx_tune/compile/precompile.py /tmp/old/triton_ctx_tune/compile/precompile.py;
  nvidia-smi -L; nproc; lscpu | grep -E "Model name|Thread|Core|Socket"; } > "$OUT/log.txt" 2>&1
one() {  # arm round [extra args]
  local arm=$1 i=$2; shift 2; local dir=/tmp/fla/$arm-$i
  case $arm in
    new|plain) cd "$ROOT" ;;
    old) cd /tmp/old ;;
  esac
  PYTHONPATH=/tmp/site timeout 300 python3 benchmarks/bench_compile_node.py --out "$dir" --worlds 1 --ops fla \
    --arms "$([ "$arm" = plain ] && echo plain || echo ours)" --repeats 1 --timeout-s 250 > "$dir.log" 2>&1
  echo "== $arm $i rc=$? at $SECONDS s" >> "$OUT/log.txt"
  grep -E "cold step|compile:" "$dir.log" >> "$OUT/log.txt"; cd "$ROOT"
}
mkdir -p /tmp/fla
arms=(new old)
for i in 1 2 3; do
  for k in 0 1; do one "${arms[$(( (i + k) % 2 ))]}" "$i"; done
  [ $i = 1 ] && one plain 1
  [ $SECONDS -gt 470 ] && { echo "stop after round $i" >> "$OUT/log.txt"; break; }
done
tar czf "$OUT/fla.tgz" -C /tmp fla 2>/dev/null
for d in /tmp/fla/new-* /tmp/fla/old-*; do python3 .device/tl.py $d/fla-ours-1r-1 >> "$OUT/log.txt" 2>&1; done
date -u >> "$OUT/log.txt"
