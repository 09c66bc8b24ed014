#!/usr/bin/env bash
# nf-plan's ranking against measured steps on this CPU: for each layout bench/layouts.sh runs
# (the tiny config; every (tp, pp, dp) in {1, 2}^3 with its schedule and ZeRO-1 variants, and
# tp = 4), the median step time nf-bench-layout measures next to the time nf-plan --score --cpu
# models for it (this machine's GEMM rate, shared by ranks that outnumber the cores; the MPI
# all-reduce latency and bandwidth nf-bench-layout --links measures on two ranks), and the
# Spearman rank correlation of the two. Prints a Markdown table; docs/parallelism.md keeps one.
#
#   bench/plan_check.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
config="$root/deploy/configs/tiny.pbtxt"
mpirun=(mpirun --oversubscribe --allow-run-as-root)
export NF_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

# The tp group's all-reduce latency (us) and bus bandwidth (GB/s) between two ranks.
read -r latency bandwidth < <("${mpirun[@]}" -np 2 "$build/bench/nf-bench-layout" \
  --config "$config" --steps 2 --set parallel.tensor_parallel=2 --links |
  awk -F'|' '$2 ~ /^ tp $/ { print $7 + 0, $8 + 0 }')

measure() {  # ranks sets... -> rank 0's median step seconds
  local ranks=$1
  shift
  "${mpirun[@]}" -np "$ranks" "$build/bench/nf-bench-layout" --config "$config" \
    --steps "$steps" "$@" | awk -F'|' '$6 + 0 == 0 && NF > 10 { print $7 + 0 }'
}
model() {  # ranks sets... -> modelled step seconds
  local ranks=$1
  shift
  "$build/launcher/nf-plan" --config "$config" --score --cpu --gpus-per-node "$ranks" \
    --nodes 1 --nvlink-gbps "$bandwidth" --network-gbps "$bandwidth" --latency-us "$latency" \
    --gemm-efficiency 1 "$@" | awk '{ print $4 }'
}

rows=()
run() {  # name ranks overrides...
  local name=$1 ranks=$2
  shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  local measured modelled
  measured=$(measure "$ranks" "${sets[@]}")
  modelled=$(model "$ranks" "${sets[@]}")
  rows+=("$name $measured $modelled")
  echo "| $name | $ranks | $measured | $modelled |"
}

echo "MPI all-reduce between two ranks: ${latency} us, ${bandwidth} GB/s bus bandwidth"
echo
echo "| layout | ranks | measured step s | modelled step s |"
echo "|---|---|---|---|"
run "single-rank" 1
for tp in 1 2; do
  for pp in 1 2; do
    for dp in 1 2; do
      ranks=$((tp * pp * dp))
      ((ranks == 1)) && continue
      layout=("parallel.tensor_parallel=$tp" "parallel.pipeline_parallel=$pp")
      name="tp$tp-pp$pp-dp$dp"
      run "$name" $ranks "${layout[@]}"
      if ((dp > 1)); then
        run "$name-zero1" $ranks "${layout[@]}" parallel.distributed_optimizer=true
      fi
      if ((pp > 1)); then
        run "$name-gpipe" $ranks "${layout[@]}" parallel.pipeline_schedule=GPIPE
        run "$name-interleaved" $ranks "${layout[@]}" \
          parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B parallel.virtual_stages=2
      fi
    done
  done
done
run "tp4" 4 parallel.tensor_parallel=4
printf '%s\n' "${rows[@]}" | python3 -c '
import sys
rows = [line.split() for line in sys.stdin if line.strip()]
def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
a = ranks([float(r[1]) for r in rows])
b = ranks([float(r[2]) for r in rows])
n = len(rows)
ma, mb = sum(a) / n, sum(b) / n
cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
var = (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5
print("\nSpearman rank correlation, measured vs modelled, over %d layouts: %.2f" % (n, cov / var))
'
