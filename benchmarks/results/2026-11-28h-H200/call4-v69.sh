#!/usr/bin/env bash
# Session 23 call 4 (2 H200): a key still compiling times the configs every rank has compiled (branch early):
# the MLP op cold 3 times with rank logs, the GPU-marked tests, the README's example cold while time is left.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
{ date -u; grep -c "def ready_first" triton_ctx_tune/engine/state.py; nvidia-smi -L; } > "$OUT/log.txt" 2>&1
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/bench_compile_node.py --out /tmp/resm --worlds 2 --ops mlp \
  --arms ours --repeats 3 --timeout-s 45 > "$OUT/mlp-cold.log" 2>&1; echo "== mlp cold rc=$? at $SECONDS s" >> "$OUT/log.txt"
grep -E "cold step|compile:" "$OUT/mlp-cold.log" >> "$OUT/log.txt"
tar czf "$OUT/resm.tgz" -C /tmp resm 2>/dev/null
PYTHONPATH=/tmp/site:$PWD timeout 250 python3 -m pytest -m gpu tests -q -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
echo "== gpu tests rc=$? at $SECONDS s" >> "$OUT/log.txt"; tail -4 "$OUT/gpu-tests.txt" >> "$OUT/log.txt"
for r in 1 2; do
  [ $SECONDS -gt 420 ] && { echo "no time for example $r" >> "$OUT/log.txt"; break; }
  export TRITON_CACHE_DIR=$(mktemp -d); rm -rf .autotune_logs
  TRITON_CTX_TUNE_CACHE_DIR=$(mktemp -d) timeout 40 ./launch examples/tp_mlp.py > "$OUT/example$r.txt" 2>&1
  echo "== example $r rc=$? at $SECONDS s" >> "$OUT/log.txt"; grep -E "first call|compile:|second call" "$OUT/example$r.txt" >> "$OUT/log.txt"
  unset TRITON_CACHE_DIR
done
date -u >> "$OUT/log.txt"
