#!/usr/bin/env bash
# One device call (one GPU): cold tuning with compile workers forked from the zygote (the default) against
# threads only (TRITON_CTX_TUNE_COMPILE_WORKERS=0) and against workers started at set-up with the library
# preloaded (run_clients.py --early-workers); ARMS may add atstart: the default with the zygote started at job
# start, as decorating at import does (--decorated-at-start). The MLP op (bench_mlp.py --table tuning) and the FLA training
# step (run_clients.py, fla_simple_gla), each arm a fresh process with a fresh Triton cache, arms alternating,
# REPEATS rounds. Needs the client wheels in .whl/ (fla-core, einops, packaging). Writes under $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REPEATS=${REPEATS:-1}
ARMS=${ARMS:-threads zygote early}
OPS=${OPS:-mlp fla}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' | tee -a "$OUT/versions.txt"
nproc | tee -a "$OUT/versions.txt"
for r in $(seq "$REPEATS"); do
  for arm in $ARMS; do
    case $arm in threads) W=0 ;; *) W= ;; esac
    extra=(); [[ $arm == early ]] && extra=(--early-workers); [[ $arm == atstart ]] && extra=(--decorated-at-start)
    if [[ $arm != early && $arm != atstart && $OPS == *mlp* ]]; then
      TRITON_CTX_TUNE_COMPILE_WORKERS=$W NPROC=1 timeout 240 ./launch benchmarks/bench_mlp.py --table tuning --no-vanilla \
        --out "$OUT/mlp-$arm-$r" > "$OUT/mlp-$arm-$r.log" 2>&1
      python3 - "$OUT/mlp-$arm-$r" "$arm" <<'PY'
import json, pathlib, sys
sys.path.insert(0, "benchmarks")
from bench_compile_node import mlp_cold_rows
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for row in mlp_cold_rows(json.loads(f.read_text())):
        print("MLP", sys.argv[2], row.get("ours_cold_s"), row.get("ours_warm_s"), row.get("ours_executions"))
PY
    fi
    [[ $OPS == *fla* ]] || continue
    TRITON_CTX_TUNE_COMPILE_WORKERS=$W NPROC=1 timeout 300 ./launch benchmarks/clients/run_clients.py --arm ours \
      --clients fla_simple_gla --step-iters 3 "${extra[@]}" --out "$OUT/fla-$arm-$r.json" > "$OUT/fla-$arm-$r.log" 2>&1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print('FLA', sys.argv[2], r['client'] if 'client' in r else '', r['first_call']['wall_s'], r['first_call']['executions'], r['warm_call']['wall_s']) for r in d['results']]" "$OUT/fla-$arm-$r.json" "$arm" 2>&1 | tail -2
    # Per key of the FLA step: when its precompile ended, how many configs the workers compiled, workers ready.
    python3 - "$OUT" "$arm" <<'PY'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1], "ctx_logs").rglob("rank-0.jsonl"):
    rows = [json.loads(l) for l in f.read_text().splitlines() if '"precompile"' in l]
    rows = [r for r in rows if r.get("event") == "precompile"]
    print("PRE", sys.argv[2], " ".join(f"{r['kernel'][:18]}:{len(r['by_workers'])}/{len(r['mine'])}"
                                      f"@{r['seconds']:.1f}s,w{(r.get('workers') or {}).get('ready', '-')}" for r in rows))
PY
    mv "$OUT/ctx_logs" "$OUT/ctx-$arm-$r-$RANDOM" 2>/dev/null
  done
done
