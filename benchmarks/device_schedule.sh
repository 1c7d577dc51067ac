#!/usr/bin/env bash
# One device call for issue 38 on 2 GPUs (NCCL): the multi-rank and GPU tests, the guard's cost, the warm call
# cost against the previous commit (.prev/, a `git archive` of it), and the FLA training loop's fixed, reexec
# and online arms for STEPS steps (client wheels carried in .whl/). Writes under $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUN=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
{ python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee "$OUT/versions.txt"
if [[ ${TESTS:-1} == 1 ]]; then
  timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -x -p no:cacheprovider tests/test_dist.py tests/test_online.py \
    tests/test_train_loop.py tests/test_exactly_once.py tests/test_schedule.py tests/test_gpu.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
fi
if [[ ${BENCH:-1} == 1 ]]; then
  timeout 120 python3 benchmarks/bench_guard.py --worlds 2 --reps 300 --out "$OUT/guard.json" 2>&1 | tail -3 | tee "$OUT/guard.txt"
  for tree in .prev .; do
    (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 benchmarks/bench_call_cost.py --rounds 15 --calls 1000) 2>&1 \
      | tail -6 | sed "s|^|[$tree] |" | tee -a "$OUT/call_cost.txt"
  done
fi
if [[ ${FLA:-1} == 1 ]]; then
  ARMS=${ARMS:-"fixed reexec online"} NPROC=2 timeout "${FLA_LIMIT:-330}" benchmarks/clients/run_train_all.sh "$RUN/fla" \
    --clients fla_simple_gla --steps "${STEPS:-50}" > "$RUN/fla.log" 2>&1
  tail -25 "$RUN/fla.log"
  for arm in reexec online; do
    d=$(ls -d "$RUN/fla/ctx_logs/train-$arm"/*/ 2>/dev/null | head -1)
    [[ -n $d ]] && python3 -m triton_ctx_tune report "$d" > "$RUN/fla/report-$arm.txt" 2>&1
  done
  cp "$RUN/fla/train.txt" "$OUT/fla-train.txt" 2>/dev/null
  tar czf "$OUT/fla.tgz" -C "$RUN" .
fi
