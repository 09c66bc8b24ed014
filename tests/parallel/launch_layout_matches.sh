#!/usr/bin/env bash
# nf-launch under mpirun trains like one process: runs the tiny config for 10 steps once as a
# single process and once as `mpirun -np RANKS` with the given --set overrides, and compares the
# per-step losses of the two log.jsonl files and the validation losses (steps 0, 5, 10) of the
# two validation.jsonl files (1e-5 relative, the layout-equivalence tolerance;
# docs/parallelism.md). Only rank 0 may write them: one record per step or evaluation.
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
common=(--config "$config" --set train.train_iters=10 --set train.lr_schedule.warmup_iters=2
        --set train.eval_interval=5 --set train.eval_iters=2)
"$nf_launch" "${common[@]}" --run-dir "$dir/single" >"$dir/single.out"
"${mpirun[@]}" -np "$ranks" "$nf_launch" "${common[@]}" "$@" --run-dir "$dir/parallel" \
  >"$dir/parallel.out"
cat "$dir/parallel.out"
losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
compare() {  # FILE RECORDS
  paste <(losses "$dir/single/$1") <(losses "$dir/parallel/$1") | awk -v file="$1" -v want="$2" '
    { n++; d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d
      if (d > 1e-5) { printf "%s record %d: loss %s single, %s parallel\n", file, n, $1, $2; bad = 1 } }
    END { printf "%s: %d records compared, worst relative difference %.1e\n", file, n, worst
          if (n != want) { printf "expected %d records in each %s\n", want, file; exit 1 }
          exit bad }'
}
compare log.jsonl 10 && compare validation.jsonl 3
