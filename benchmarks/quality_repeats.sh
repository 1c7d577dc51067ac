#!/usr/bin/env bash
# Winner stability (issue 24): N cold tuning runs of the MLP op, each in a fresh process, with confirmation of
# close candidates on and off; each run scored against its own exhaustive sweep (bench_mlp.py --table quality).
# Usage: bash benchmarks/quality_repeats.sh OUT [N]   (one process per GPU via ./launch; writes OUT/quality_repeats.json)
set -euo pipefail
OUT=$1; N=${2:-5}
mkdir -p "$OUT/runs"
for i in $(seq 1 "$N"); do
  for arm in confirm plain; do
    flag=$([[ $arm == confirm ]] && echo 1 || echo 0)
    TRITON_CTX_TUNE_CONFIRM=$flag ./launch benchmarks/bench_mlp.py --table quality --no-vanilla --rounds 3 \
      --rep-ms 100 --out "$OUT/runs/$arm-$i" >"$OUT/runs/$arm-$i.log" 2>&1 || echo "run $arm-$i failed"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
runs = {}
for path in sorted(glob.glob(f"{out}/runs/*/quality-*.json")):
    arm_run = path.split("/")[-2]
    d = json.load(open(path))
    runs[arm_run] = {"summary": d.get("summary"), "picks": d.get("details", {}).get("op_latency", {}).get("configs", {}).get("chosen"),
                     "ours_regret": d.get("details", {}).get("ours_regret"),
                     "exhaustive_best": {k: v["best"] for k, v in d.get("details", {}).get("exhaustive", {}).items()},
                     "exhaustive_ms": {k: v["ms_max_over_ranks"] for k, v in d.get("details", {}).get("exhaustive", {}).items()},
                     "provenance": d.get("provenance")}
json.dump(runs, open(f"{out}/quality_repeats.json", "w"), indent=1)
print(json.dumps({k: (v["summary"] or {}).get("regret_geomean_pct") for k, v in runs.items()}))
PY
