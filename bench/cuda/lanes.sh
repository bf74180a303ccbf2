#!/usr/bin/env bash
# Several lanes of bench/cuda/run.sh stages at once on one GPU machine, all stopped at one time
# limit. Worth it once the machine's kernels are compiled (MLX_PTX_CACHE_DIR): warm, four test
# lanes ran in 57 s together. Cold, lanes compile kernels with NVRTC side by side and finish far
# less: beside the gradient table's 12 workers, a lane of test files that took 57 s warm (over four
# lanes) did not finish in 540 s, nor did the table itself (30 s alone, warm) (bench/PARITY-cuda.md,
# seventh session).
#
#   LOGS=/tmp/cuda bash bench/cuda/lanes.sh 570 "ops-quantizedMatmul repro" "parity" "golden"
#
# Each quoted group runs in order in its own lane, with its logs in $LOGS/lane<K>/. With $OUT set,
# every lane's logs are packed into $OUT/cuda-logs.tgz and the summaries concatenated into
# $OUT/summary.log, also when the limit cut a lane short. Timings measured in lanes are not
# benchmarks: run bench-<w> stages alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
limit=$1; shift
LOGS=${LOGS:-report/cuda}
mkdir -p "$LOGS"
pids=()
k=0
for lane in "$@"; do
  k=$((k + 1))
  # shellcheck disable=SC2086 # a lane is a list of stage names
  LOGS="$LOGS/lane$k" OUT='' setsid bash bench/cuda/run.sh $lane > /dev/null 2>&1 &
  pids+=($!)
done
# at the limit, every lane's whole process group goes (a stage's own processes included)
end=$((SECONDS + limit))
while (( SECONDS < end )); do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  (( alive )) || break
  sleep 2
done
for p in "${pids[@]}"; do
  if kill -0 "$p" 2>/dev/null; then echo "lane of pid $p stopped at the ${limit} s limit" >> "$LOGS/stopped"; kill -TERM -- "-$p" 2>/dev/null; fi
done
sleep 3
for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
for d in "$LOGS"/lane*/; do echo "##### ${d%/}: $(cat "${d}stages" 2>/dev/null)"; cat "$d/summary.log" 2>/dev/null; done > "$LOGS/summary.log"
cat "$LOGS/stopped" >> "$LOGS/summary.log" 2>/dev/null
if [[ -n ${OUT:-} ]]; then tar czf "$OUT/cuda-logs.tgz" -C "$LOGS" . && cp "$LOGS/summary.log" "$OUT/"; fi
