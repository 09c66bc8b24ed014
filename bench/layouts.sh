#!/usr/bin/env bash
# Runs nf-bench-layout for every (tp, pp, dp) in {1, 2}^3 and tp = 4 (1F1B; the pipelined
# layouts also with GPipe and interleaved 1F1B, the data-parallel ones also with ZeRO-1) on the
# tiny config and prints a Markdown table: rank 0's median step time, its ratio to the
# single-rank run, and rank 0's bytes per step by group (every rank's bytes are checked against
# the formulas inside nf-bench-layout, which fails the run on a mismatch).
#
# On a 2-core machine this measures overhead, not speed-up: a layout of N ranks shares the same
# two cores (one thread per rank), and the single-rank baseline uses both cores itself.
#
#   bench/layouts.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
bench="$build/bench/nf-bench-layout"
mpirun=(mpirun --oversubscribe --allow-run-as-root)

run() {  # ranks threads overrides...
  local ranks=$1 threads=$2
  shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  NF_NUM_THREADS=$threads OMPI_MCA_btl_vader_single_copy_mechanism=none \
    "${mpirun[@]}" -np "$ranks" "$bench" --config "$root/deploy/configs/tiny.pbtxt" \
    --steps "$steps" "${sets[@]}" | awk -F'|' '$6 + 0 == 0 && NF > 10'  # rank 0's row
}

echo "| tp | pp | dp | schedule | step s | vs 1 rank | tp bytes | dp bytes | pp bytes | mp | embedding | world |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
base=
emit() {  # a rank-0 row of nf-bench-layout
  local tp pp dp schedule seconds btp bdp bpp bmp bemb bworld ratio
  IFS='|' read -r _ tp pp dp schedule _ seconds btp bdp bpp bmp bemb bworld _ <<<"$1"
  [[ -z "$base" ]] && base=$seconds
  ratio=$(awk -v s="$seconds" -v b="$base" 'BEGIN { printf "%.2f", s / b }')
  echo "|$tp|$pp|$dp|$schedule|$seconds| $ratio |$btp|$bdp|$bpp|$bmp|$bemb|$bworld|"
}
emit "$(run 1 2)"
for tp in 1 2; do
  for pp in 1 2; do
    for dp in 1 2; do
      ranks=$((tp * pp * dp))
      ((ranks == 1)) && continue
      layout=("parallel.tensor_parallel=$tp" "parallel.pipeline_parallel=$pp")
      emit "$(run $ranks 1 "${layout[@]}")"
      if ((dp > 1)); then
        emit "$(run $ranks 1 "${layout[@]}" parallel.distributed_optimizer=true)"
      fi
      if ((pp > 1)); then
        emit "$(run $ranks 1 "${layout[@]}" parallel.pipeline_schedule=GPIPE)"
        emit "$(run $ranks 1 "${layout[@]}" parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B \
          parallel.virtual_stages=2)"
      fi
    done
  done
done
emit "$(run 4 1 parallel.tensor_parallel=4)"
