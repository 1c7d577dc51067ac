#!/usr/bin/env bash
# One device call for the training-loop benchmark (RESULTS.md section 12): install the client wheels carried in
# .whl/ (fla-core, cut-cross-entropy, einops, packaging), then the four arms per client. Writes under $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/versions.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/versions.txt"
STEPS=${STEPS:-300}
NPROC=${NPROC:-2} timeout "${FLA_LIMIT:-380}" benchmarks/clients/run_train_all.sh "$OUT/fla" --clients fla_simple_gla --steps "$STEPS" > "$OUT/fla.log" 2>&1
tail -30 "$OUT/fla.log"
NPROC=${NPROC:-2} timeout "${CCE_LIMIT:-180}" benchmarks/clients/run_train_all.sh "$OUT/cce" --clients cce --steps "$STEPS" > "$OUT/cce.log" 2>&1
tail -30 "$OUT/cce.log"
