#!/usr/bin/env bash
# Device calls for issues 35 (search) and 37 (compile on the node), one mode per call (each fits 10 minutes).
# Usage on a 2-GPU machine, repository root, results under $OUT (carry .whl for the FLA client):
#   bash benchmarks/device_search_compile.sh ag RUNS      # all-gather + GEMM: RUNS cold runs (ours, exhaustive,
#                                                         # budget10), each with its tuner logs and `report`
#   bash benchmarks/device_search_compile.sh compile REPEATS ARMS   # FLA step and MLP op cold, 2 ranks
#   bash benchmarks/device_search_compile.sh quality CALLS          # MLP op: CALLS tuning calls' regret, 2 ranks
#   bash benchmarks/device_search_compile.sh gemm                   # one GPU: the 1296-config GEMM space
set -u
mode=${1:-ag}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Results go to $WORK, then one archive of it to $OUT (the device hands back few files).
FINAL=${OUT:-/tmp/out}; OUT=${WORK:-/tmp/work}; mkdir -p "$OUT" "$FINAL"
trap 'tar czf "$FINAL/$mode.tgz" -C "$OUT" . ; cp "$OUT"/summary.txt "$FINAL/" 2>/dev/null' EXIT
export PYTHONPATH=$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee -a "$OUT/versions.txt"
nproc | tee -a "$OUT/versions.txt"
case "$mode" in
  ag)
    for r in $(seq 1 "${2:-5}"); do
      d="$OUT/ag-run$r"; mkdir -p "$d"
      NPROC=2 timeout "${RUN_TIMEOUT_S:-150}" ./launch benchmarks/bench_ag_gemm.py --arms "${ARMS:-ours,exhaustive,budget10}" \
        --no-warm --out "$d" > "$d/run.log" 2>&1
      grep -E "^\| (ours|exhaustive|budget10) |MISS|PASS" "$d/run.log"
      python3 -m triton_ctx_tune report "$d"/ctx_logs/* > "$d/report.txt" 2>&1
    done ;;
  compile)
    WORLDS=2 REPEATS=${2:-3} bash -c "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:$PWD timeout ${TIMEOUT_S:-570} python3 \
      benchmarks/bench_compile_node.py --out $OUT --worlds 2 --ops ${OPS:-fla,mlp} --arms ${3:-ours,ours-noworkers,plain} --once=${ONCE:-} \
      --repeats \$REPEATS --timeout-s ${JOB_TIMEOUT_S:-200}" 2>&1 | tail -80 ;;
  quality)
    NPROC=2 timeout 570 ./launch benchmarks/bench_mlp.py --table quality --quality-calls "${2:-5}" --no-vanilla \
      --out "$OUT" > "$OUT/quality.log" 2>&1; tail -30 "$OUT/quality.log" ;;
  gemm)
    timeout "${GEMM_TIMEOUT_S:-570}" python3 benchmarks/bench_gemm_space.py --out "$OUT" --fractions 0.1 --compiles 100 2>&1 \
      | tee "$OUT/gemm_space.log" | tail -20 ;;
  *) echo "usage: $0 ag|compile|quality|gemm" >&2; exit 2 ;;
esac
