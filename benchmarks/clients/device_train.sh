#!/usr/bin/env bash
# One device call for the training-loop benchmark (RESULTS.md section 12): install the client wheels carried in
# .whl/ (fla-core, cut-cross-entropy, einops, packaging), then the four arms per client. Writes under $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUN=$(mktemp -d)  # everything, packed into $OUT/train.tgz at the end (the device returns few files)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/versions.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/versions.txt"
STEPS=${STEPS:-300}
NPROC=${NPROC:-2} timeout "${FLA_LIMIT:-380}" benchmarks/clients/run_train_all.sh "$RUN/fla" --clients fla_simple_gla --steps "$STEPS" > "$RUN/fla.log" 2>&1
tail -14 "$RUN/fla.log"
NPROC=${NPROC:-2} timeout "${CCE_LIMIT:-180}" benchmarks/clients/run_train_all.sh "$RUN/cce" --clients cce --steps "$STEPS" > "$RUN/cce.log" 2>&1
tail -14 "$RUN/cce.log"
for c in fla cce; do
  for arm in reexec online; do
    d=$(ls -d "$RUN/$c/ctx_logs/train-$arm"/*/ 2>/dev/null | head -1)
    [[ -n $d ]] && python3 -m triton_ctx_tune report "$d" > "$RUN/$c/report-$arm.txt" 2>&1
  done
  cp "$RUN/$c/train.txt" "$OUT/$c-train.txt" 2>/dev/null
done
tar czf "$OUT/train.tgz" -C "$RUN" .
