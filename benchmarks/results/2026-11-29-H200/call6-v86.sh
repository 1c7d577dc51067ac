#!/usr/bin/env bash
# Session 25 call 6 (one H200, one rank), tree 256cc7c (the gate finds its next ticket once per change): the GPU-marked
# tests, the MLP op cold 3 times and the FLA step cold once.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NPROC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{ date -u; grep -c "def _queue" triton_ctx_tune/compile/precompile.py; nvidia-smi -L; nproc; lscpu | grep -E "Model name"; } > "$OUT/log.txt" 2>&1
PYTHONPATH=/tmp/site timeout 200 python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
echo "== gpu tests rc=$? at $SECONDS s" >> "$OUT/log.txt"; tail -2 "$OUT/gpu-tests.txt" >> "$OUT/log.txt"
for i in 1 2 3; do
  PYTHONPATH=/tmp/site timeout 60 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla --out /tmp/res/new-$i > /tmp/res-new-$i.log 2>&1
  echo "== mlp $i rc=$? at $SECONDS s" >> "$OUT/log.txt"
done
python3 .device/tl.py /tmp/res/new-* >> "$OUT/log.txt" 2>&1
tar czf "$OUT/mlp.tgz" -C /tmp res 2>/dev/null
PYTHONPATH=/tmp/site timeout 100 python3 benchmarks/bench_compile_node.py --out /tmp/fla --worlds 1 --ops fla --arms ours \
  --repeats 1 --timeout-s 90 > "$OUT/fla.log" 2>&1
echo "== fla rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "cold step|compile:" "$OUT/fla.log" >> "$OUT/log.txt"
tar czf "$OUT/fla.tgz" -C /tmp fla 2>/dev/null
date -u >> "$OUT/log.txt"
