#!/usr/bin/env bash
# Session 25 call 7 (one H200, one rank), tree b26aa7c: the MLP op's quality table (bench_mlp --table quality --I 7168,
# as section 49's call 2), as many runs as fit in 200 s.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NPROC=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; lscpu | grep -E "Model name"; } > "$OUT/log.txt" 2>&1
for i in 1 2 3; do
  [ $SECONDS -gt 140 ] && break
  dir=/tmp/qnew$i
  timeout 100 ./launch benchmarks/bench_mlp.py --table quality --no-vanilla --I 7168 --out $dir > $dir.log 2>&1
  echo "run new $i rc=$? $(date -u +%T) at $SECONDS s" >> "$OUT/log.txt"
  j=$(ls $dir/quality-*.json 2>/dev/null | head -1)
  [ -n "$j" ] && cp "$j" /tmp/quality-new$i.json
  [ -z "$j" ] && tail -20 $dir.log >> "$OUT/log.txt"
done
python3 - >> "$OUT/log.txt" 2>&1 <<'PY'
import glob, json
for path in sorted(glob.glob("/tmp/quality-*.json")):
    d = json.load(open(path)); s, det = d["summary"], d["details"]
    r, io = det["ours_regret"][0], det["in_op_regret"][0]
    print(path.split("/")[-1], "picks", io["picks"], "in-op best", {k: v["best"] for k, v in det["in_op_oracle"].items()})
    print("  in-op regret %", {k: round(v, 3) for k, v in io["regret_pct"].items()}, "geomean", round(io["geomean_regret_pct"], 3),
          "paired", {k: round(v, 3) for k, v in io["paired_regret_pct"].items()}, "geomean", round(io["paired_geomean_regret_pct"], 3))
    print("  op ratio chosen/exhaustive", round(s["op_ratio_chosen"], 4))
PY
tar czf "$OUT/quality.tgz" -C /tmp $(cd /tmp && ls -d quality-*.json qnew* 2>/dev/null) 2>/dev/null
date -u >> "$OUT/log.txt"
