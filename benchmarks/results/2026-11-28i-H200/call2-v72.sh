#!/usr/bin/env bash
# Session 24 call 2 (one H200): the MLP op's quality table at 1 rank with the 2-rank per-rank shapes (--I 7168),
# this tree (the survivors' race) against 2687653, alternating, a fresh process and Triton cache each; then the
# GPU-marked tests on this tree.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/old && tar xzf .device/old-2687653.tgz -C /tmp/old
{ python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"; date -u
  grep -c "def next_lockstep_round" triton_ctx_tune/engine/state.py /tmp/old/triton_ctx_tune/engine/state.py; nproc; nvidia-smi -L; } > "$OUT/log.txt" 2>&1
for i in 1 2 3; do
  for arm in new old; do
    [ $SECONDS -gt 330 ] && break 2
    dir=/tmp/q$arm$i; [ $arm = new ] && cd "$ROOT" || cd /tmp/old
    PYTHONPATH=/tmp/site timeout 120 ./launch benchmarks/bench_mlp.py --table quality --no-vanilla --I 7168 --out $dir > $dir.log 2>&1
    echo "run $arm $i rc=$? $(date -u +%T)" >> "$OUT/log.txt"
    j=$(ls $dir/quality-*.json 2>/dev/null | head -1)
    [ -n "$j" ] && cp "$j" /tmp/quality-$arm$i.json
    [ -z "$j" ] && tail -20 $dir.log >> "$OUT/log.txt"
  done
done
cd "$ROOT"
python3 - >> "$OUT/log.txt" 2>&1 <<'PY'
import glob, json
for path in sorted(glob.glob("/tmp/quality-*.json")):
    d = json.load(open(path)); s, det = d["summary"], d["details"]
    r, io = det["ours_regret"][0], det["in_op_regret"][0]
    print(path.split("/")[-1], "picks", io["picks"], "in-op best", {k: v["best"] for k, v in det["in_op_oracle"].items()})
    print("  do_bench regret %", {k: round(v, 3) for k, v in r["regret_pct"].items()}, "geomean", round(r["geomean_regret_pct"], 3))
    print("  in-op regret %", {k: round(v, 3) for k, v in io["regret_pct"].items()}, "geomean", round(io["geomean_regret_pct"], 3),
          "paired", {k: round(v, 3) for k, v in io["paired_regret_pct"].items()}, "geomean", round(io["paired_geomean_regret_pct"], 3))
    print("  op ratio chosen/exhaustive", round(s["op_ratio_chosen"], 4))
PY
tar czf "$OUT/quality.tgz" -C /tmp $(cd /tmp && ls -d quality-*.json qnew* qold* 2>/dev/null) 2>/dev/null
PYTHONPATH=/tmp/site timeout 210 python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$OUT/gpu-tests.txt" 2>&1; echo "gpu tests rc=$? at $SECONDS s" >> "$OUT/log.txt"
tail -5 "$OUT/gpu-tests.txt" >> "$OUT/log.txt"
date -u >> "$OUT/log.txt"
