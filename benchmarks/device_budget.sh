#!/usr/bin/env bash
# Issue 35's device runs (the lead's). Usage on the device machine, repository root, results under $OUT:
#   bash benchmarks/device_budget.sh gemm     # one GPU: budgeted vs exhaustive on a 1296-config GEMM space, 3 shapes
#   bash benchmarks/device_budget.sh ag       # two GPUs: all-gather + GEMM, ours (auto) vs exhaustive vs budget10
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/versions.txt"
case "${1:-gemm}" in
  gemm)
    timeout 570 python3 benchmarks/bench_gemm_space.py --out "$OUT" --fractions 0.1 --compiles 100 2>&1 | tee "$OUT/gemm_space.log" | tail -20 ;;
  ag)
    NPROC=2 timeout 570 ./launch benchmarks/bench_ag_gemm.py --arms ours,exhaustive,budget10 --out "$OUT" 2>&1 | tee "$OUT/ag_gemm.log" | tail -20 ;;
  *) echo "usage: $0 gemm|ag" >&2; exit 2 ;;
esac
ls -R "$OUT" | head -50
