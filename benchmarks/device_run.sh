#!/usr/bin/env bash
# One device call: the GPU-relevant tests (single GPU and 2-rank NCCL) and the training-loop arms.
# Usage on the device machine (repository root): bash benchmarks/device_run.sh  (writes under $OUT)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/versions.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/versions.txt"
timeout 420 python3 -m pytest -q -s -x -p no:cacheprovider tests/test_exactly_once.py tests/test_online.py \
  tests/test_train_loop.py 2>&1 | tee "$OUT/tests_exactly_once.log" | tail -25
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_steady.py 2>&1 | tee "$OUT/tests_gpu.log" | tail -6
timeout 120 python3 benchmarks/bench_call_cost.py --rounds 20 --calls 2000 --out "$OUT/call_cost.json" 2>&1 | tail -8
find /tmp/pytest-of-*/ -name 'train_loop.rank0.json' -exec cp {} "$OUT/train_loop.rank0.json" \; 2>/dev/null
ls "$OUT"
