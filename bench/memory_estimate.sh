#!/usr/bin/env bash
# The memory estimate (nf-launch --dry-run, and the check before a launch) against the measured
# peak resident set (GNU time's %M, per rank) of real CPU runs: the tiny config, the 125M shape
# (seq_len 512, micro-batch 2, two steps, fp16 as its config says) and the 125M shape on a
# 2-stage pipeline (4 micro-batches of 1 in flight, 1F1B). The estimate leaves out the
# process's own footprint (code, libraries, OpenBLAS and MPI buffers), so the same runs are
# made with a 2-layer, 16-wide model as the baseline and the table shows peak - baseline.
# Prints a Markdown table; docs/memory.md keeps one.
#
#   bench/memory_estimate.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
launch="$build/tools/nf-launch"
mpirun=(mpirun --oversubscribe --allow-run-as-root)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export OMPI_MCA_btl_vader_single_copy_mechanism=none

tiny=(--config "$root/deploy/configs/tiny.pbtxt" --set train.train_iters=40)
m125=(--config "$root/deploy/configs/normformer-125m.pbtxt" --set train.seq_len=512
  --set train.micro_batch_size=2 --set train.global_batch_size=2 --set train.train_iters=2
  --set train.lr_schedule.warmup_iters=1)
pipeline=("${m125[@]}" --set parallel.pipeline_parallel=2 --set train.micro_batch_size=1
  --set train.global_batch_size=4)
smallest=(--set model.num_layers=2 --set model.d_model=16 --set model.num_heads=2
  --set model.ffn_dim=32)

# The last column (GiB) of --dry-run's row for pipeline rank $1.
estimate() {
  local rank=$1 ranks=$2
  shift 2
  "$launch" --dry-run --world-size "$ranks" "$@" |
    awk -F'|' -v r=" $rank " '$2 == r { sub(/ GiB/, "", $(NF - 1)); print $(NF - 1) + 0 }'
}

# Peak resident set (GiB) of each rank of a run, one per line, rank order.
peaks() {
  local ranks=$1
  shift
  local run="$scratch/run-$RANDOM"
  if ((ranks == 1)); then
    /usr/bin/time -f %M -o "$run.time.0" "$launch" "$@" --run-dir "$run" >/dev/null
  else
    "${mpirun[@]}" -np "$ranks" bash -c \
      'exec /usr/bin/time -f %M -o "$0.time.$OMPI_COMM_WORLD_RANK" "$@"' "$run" \
      "$launch" "$@" --run-dir "$run" >/dev/null
  fi
  for ((r = 0; r < ranks; ++r)); do awk '{ print $1 / 1048576 }' "$run.time.$r"; done
}

echo "| run | rank | estimate GiB | peak GiB | baseline GiB | peak - baseline GiB | (peak - baseline) / estimate |"
echo "|---|---|---|---|---|---|---|"
row() {  # name ranks args...
  local name=$1 ranks=$2
  shift 2
  mapfile -t measured < <(peaks "$ranks" "$@")
  mapfile -t base < <(peaks "$ranks" "$@" "${smallest[@]}")
  for ((r = 0; r < ranks; ++r)); do
    local e
    e=$(estimate "$r" "$ranks" "$@")
    awk -v n="$name" -v r="$r" -v e="$e" -v p="${measured[r]}" -v b="${base[r]}" 'BEGIN {
      printf "| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", n, r, e, p, b, p - b, (p - b) / e }'
  done
}
row tiny 1 "${tiny[@]}"
row "125M shape" 1 "${m125[@]}"
row "125M shape, pp=2" 2 "${pipeline[@]}"
