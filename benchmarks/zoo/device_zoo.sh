#!/usr/bin/env bash
# One device call for the conformance zoo (docs/zoo.md), from the repository root on a machine with 2 GPUs and no
# internet: install the wheels carried in .whl/ (fla-core, cut-cross-entropy, einops, packaging) and .whl/zoo/
# (flag-gems, gemlite, torchao, sqlalchemy, greenlet) offline, run both arms at 1 and 2 ranks, each arm as its own
# job from its own empty Triton cache, and merge. Writes $OUT/zoo.md, the arms' JSON and logs, and
# $OUT/ctx_logs.tgz (the tuner's rank logs). The outputs the merge compares stay on the machine (tens of MB).
# CASES (default: default) picks cases, as run_zoo.py --cases. PLAIN_LIMIT and OURS_LIMIT (default 150 s and 110 s)
# bound each job, so that the four fit one 10-minute device call: an arm that runs out keeps the cases it finished
# (its JSON is rewritten after every case). WORLDS (default "1 2") picks the world sizes: split a run over two calls
# on the same warm machine with WORLDS=2 then WORLDS=1; both write into ZOO_RUN (default /tmp/zoo-run), and each
# call merges everything there.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUN=${ZOO_RUN:-/tmp/zoo-run}; mkdir -p "$RUN"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$ROOT"/.whl/*.whl "$ROOT"/.whl/zoo/*.whl
export PYTHONPATH=/tmp/site:$ROOT
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
git -C "$ROOT" log -1 --format=%H 2>/dev/null | tee -a "$OUT/versions.txt"
for world in ${WORLDS:-1 2}; do
  for arm in plain ours; do
    cache=$(mktemp -d "${TMPDIR:-/tmp}/zoo-triton-cache-$arm-XXXXXX")
    echo "=== $arm, $world rank(s): TRITON_CACHE_DIR=$cache"
    limit=$([[ $arm == plain ]] && echo "${PLAIN_LIMIT:-150}" || echo "${OURS_LIMIT:-110}")
    TRITON_CACHE_DIR=$cache NPROC=$world timeout "$limit" "$ROOT/launch" "$ROOT/benchmarks/zoo/run_zoo.py" \
      --arm "$arm" --out "$RUN" --cases "${CASES:-default}" > "$OUT/zoo-$arm-w$world.log" 2>&1 || echo "exit $?"
    grep -E '^\[bench r0' "$OUT/zoo-$arm-w$world.log" | grep -v '^\[bench r0 .*===' | tail -40
    rm -rf "$cache"
  done
done
python3 "$ROOT/benchmarks/zoo/merge.py" "$RUN"
cp "$RUN"/zoo.md "$RUN"/zoo-*.json "$OUT"/ 2>/dev/null
logs=$(cd "$RUN" && ls -d ctx_logs-* 2>/dev/null)
[[ -n $logs ]] && tar czf "$OUT/ctx_logs.tgz" -C "$RUN" $logs
