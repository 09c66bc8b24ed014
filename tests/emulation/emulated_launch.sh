#!/usr/bin/env bash
# nf-launch itself on emulated GPUs (the NF_CUDA_EMULATION build), with emulated_tiny.pbtxt:
#
#   matches-cpu RANKS [--set ...]   the same job under `mpirun -np RANKS` on the CPU backend and
#                                   on RANKS emulated GPUs (one each, NcclCommunicator over the
#                                   NCCL double): every step's loss within 1e-5 relative (the
#                                   layout-equivalence tolerance of docs/parallelism.md; the two
#                                   backends sum in different orders: measured 1.3e-8 over 8
#                                   steps on one rank)
#   resume                          one rank killed (SIGKILL) after step 6 of 8, with a
#                                   checkpoint at step 4, resumes: steps 5 to 8 are bit for bit
#                                   those of an uninterrupted run
#   precision FP16|BF16             8 steps with every loss finite and no step skipped
#
#   emulated_launch.sh SCENARIO NF_LAUNCH CONFIG MPIRUN... [-- ARGS]
set -euo pipefail
scenario=$1 nf_launch=$2 config=$3
shift 3
mpirun=()
while [[ $# -gt 0 && "$1" != "--" ]]; do mpirun+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export NF_EMU_DEVICES=${NF_EMU_DEVICES:-4}

# "step loss" per record of a log.jsonl, the last record of each step (a resumed run repeats
# the steps after its checkpoint).
losses() {
  grep '"loss"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([^,]*),.*/\1 \2/' |
    awk '{ last[$1] = $2 } END { for (s in last) print s, last[s] }' | sort -n
}

case "$scenario" in
  matches-cpu)
    ranks=$1
    shift
    "${mpirun[@]}" -np "$ranks" "$nf_launch" --config "$config" --set train.device=CPU "$@" \
      --run-dir "$dir/cpu" >"$dir/cpu.out" 2>&1 || { cat "$dir/cpu.out"; fail "the CPU run failed"; }
    "${mpirun[@]}" -np "$ranks" "$nf_launch" --config "$config" "$@" --run-dir "$dir/gpu" \
      >"$dir/gpu.out" 2>&1 || { cat "$dir/gpu.out"; fail "the emulated GPU run failed"; }
    grep -q "on cuda:" "$dir/gpu.out" || fail "the GPU run did not train on a CUDA device"
    join <(losses "$dir/cpu/log.jsonl") <(losses "$dir/gpu/log.jsonl") | awk '
      { n++; d = ($2 - $3) / $2; if (d < 0) d = -d; if (d > worst) worst = d
        if (d > 1e-5) { printf "step %d: loss %s on the CPU, %s on emulated GPUs\n", $1, $2, $3; bad = 1 } }
      END { printf "%d steps compared, worst relative difference %.1e\n", n, worst
            if (n != 8) { print "expected 8 steps"; exit 1 }
            exit bad }'
    ;;
  resume)
    "${mpirun[@]}" -np 1 "$nf_launch" --config "$config" --run-dir "$dir/whole" >"$dir/whole.out" 2>&1 ||
      { cat "$dir/whole.out"; fail "the uninterrupted run failed"; }
    resumed=(--config "$config" --set checkpoint.save_interval=4 --run-dir "$dir/killed/run")
    set +e
    "$here/../parallel/signal_rank.sh" KILL 0 "$dir/killed/run/log.jsonl" 6 -- \
      "${mpirun[@]}" -np 1 "$nf_launch" "${resumed[@]}" >"$dir/killed.out" 2>&1
    status=$?
    set -e
    ((status != 0 && status != 99)) || { cat "$dir/killed.out"; fail "the kill did not happen ($status)"; }
    [[ -d $dir/killed/run/checkpoints/iter_0000004 ]] || fail "no checkpoint at step 4"
    "${mpirun[@]}" -np 1 "$nf_launch" "${resumed[@]}" >"$dir/resumed.out" 2>&1 ||
      { cat "$dir/resumed.out"; fail "the resumed run failed"; }
    grep -q "resum" "$dir/resumed.out" || { cat "$dir/resumed.out"; fail "the run did not resume"; }
    diff <(losses "$dir/whole/log.jsonl") <(losses "$dir/killed/run/log.jsonl") ||
      fail "the resumed run's losses are not the uninterrupted run's"
    echo "steps 1-8 after a kill at step 6 and a resume from step 4: bit for bit the uninterrupted run's"
    ;;
  precision)
    precision=$1
    "${mpirun[@]}" -np 1 "$nf_launch" --config "$config" --set "train.precision=$precision" \
      --run-dir "$dir/run" >"$dir/run.out" 2>&1 || { cat "$dir/run.out"; fail "the run failed"; }
    losses "$dir/run/log.jsonl" | awk '
      { n++; if ($2 !~ /^[0-9.eE+-]+$/ || $2 + 0 <= 0) { print "step " $1 ": loss " $2; bad = 1 } }
      END { if (n != 8) { print "expected 8 steps, got " n; exit 1 } exit bad }' ||
      fail "a non-finite loss"
    grep -q '"skipped_total":0' <(grep '"step":8,' "$dir/run/log.jsonl") ||
      fail "steps were skipped: $(grep -o '"skipped_total":[0-9]*' "$dir/run/log.jsonl" | tail -1)"
    echo "$precision: 8 steps, every loss finite, none skipped"
    ;;
  *)
    fail "unknown scenario $scenario"
    ;;
esac
