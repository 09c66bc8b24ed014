#!/usr/bin/env bash
# nf-launch under mpirun trains like one process: runs the tiny config for 10 steps once as a
# single process and once as `mpirun -np RANKS` with the given --set overrides, and compares the
# per-step losses of the two log.jsonl files (1e-5 relative, the layout-equivalence tolerance;
# docs/parallelism.md). Only rank 0 may write the log: one record per step.
#
#   launch_layout_matches.sh NF_LAUNCH CONFIG RANKS MPIRUN... -- --set ...
set -euo pipefail
nf_launch=$1 config=$2 ranks=$3
shift 3
mpirun=()
while [[ "$1" != "--" ]]; do mpirun+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--config "$config" --set train.train_iters=10 --set train.lr_schedule.warmup_iters=2)
"$nf_launch" "${common[@]}" --run-dir "$dir/single" >"$dir/single.out"
"${mpirun[@]}" -np "$ranks" "$nf_launch" "${common[@]}" "$@" --run-dir "$dir/parallel" \
  >"$dir/parallel.out"
cat "$dir/parallel.out"
losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
paste <(losses "$dir/single/log.jsonl") <(losses "$dir/parallel/log.jsonl") | awk '
  { n++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d
    if (d > 1e-5) { printf "step %d: loss %s single, %s parallel\n", n, $1, $2; bad = 1 } }
  END { printf "%d steps compared, worst relative difference %.1e\n", n, worst
        if (n != 10) { print "expected 10 records in each log"; exit 1 }
        exit bad }'
