#!/usr/bin/env bash
# One device call for issue 37 (compile on the node): FLA's training step and the MLP op, cold Triton cache per
# arm, at 1 and 2 ranks (WORLDS), arms ours / ours-noworkers / plain (benchmarks/bench_compile_node.py).
# Needs the client wheels in $WHL_DIR (default .whl: fla-core, einops, packaging; carry it to the device).
# Usage (repository root, on a 2-GPU machine): OUT=/some/dir bash benchmarks/device_compile_node.sh
# Within a 10-minute device call, one world size per call: WORLDS=1 ..., then WORLDS=2 ... (about 4 min each).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WHL_DIR=${WHL_DIR:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL_DIR"/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
nproc | tee -a "$OUT/versions.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/versions.txt"
timeout "${TIMEOUT_S:-570}" python3 benchmarks/bench_compile_node.py --out "$OUT" --worlds "${WORLDS:-1,2}" --ops "${OPS:-fla,mlp}" \
  --repeats "${REPEATS:-1}" --timeout-s "${JOB_TIMEOUT_S:-240}" 2>&1 | tee "$OUT/bench_compile_node.log"
