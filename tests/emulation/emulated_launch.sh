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
#   fault stop|kill|absent|hung-abort
#                                   tp 2 x pp 2 on 4 emulated GPUs with a 3 s collective timeout,
#                                   where world rank 1 is stopped (SIGSTOP) or killed (SIGKILL)
#                                   after step 2, or never issues the collectives of its first
#                                   step (NF_INJECT_ABSENT_RANK=1: the others block inside
#                                   ncclGroupEnd, connecting to it); hung-abort is the stop with
#                                   every ncclCommAbort hanging (NF_EMU_NCCL_ABORT_HANGS=1, NCCL
#                                   issue 992), ended by the watchdog's hard exit. The failure is
#                                   named (a report waiting for peers [1], or rank 1 gone) and
#                                   the job ends within the watchdog's bound (3 s + the abort's
#                                   15 s grace + 5 s) of the fault: with 134 (the watchdog's), or
#                                   for the kill also 137 (mpirun's, see below). Prints the time.
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
  fault)
    fault=$1
    run=$dir/run
    args=(--config "$config" --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
          --set parallel.collective_timeout_seconds=3 --set train.train_iters=100000
          --run-dir "$run")
    out=$dir/job.out
    set +e
    case "$fault" in
      stop | kill)
        marker="sending SIG"
        "$here/../parallel/signal_rank.sh" "${fault^^}" 1 "$run/log.jsonl" 2 -- \
          "${mpirun[@]}" -np 4 "$nf_launch" "${args[@]}" >"$out" 2>&1 &
        ;;
      hung-abort)
        marker="sending SIG"
        NF_EMU_NCCL_ABORT_HANGS=1 "$here/../parallel/signal_rank.sh" STOP 1 "$run/log.jsonl" 2 -- \
          "${mpirun[@]}" -x NF_EMU_NCCL_ABORT_HANGS -np 4 "$nf_launch" "${args[@]}" >"$out" 2>&1 &
        ;;
      absent)
        marker="NF_INJECT_ABSENT_RANK"
        NF_INJECT_ABSENT_RANK=1 "${mpirun[@]}" -x NF_INJECT_ABSENT_RANK -np 4 "$nf_launch" \
          "${args[@]}" >"$out" 2>&1 &
        ;;
      *) fail "unknown fault $fault" ;;
    esac
    job=$!
    # The fault's time: when signal_rank.sh sends the signal, or rank 1 says it stops.
    faulted=
    for _ in $(seq 3000); do
      grep -q "$marker" "$out" 2>/dev/null && { faulted=$(date +%s.%N); break; }
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
    done
    [[ -n $faulted ]] || { wait "$job"; cat "$out"; fail "the fault never happened"; }
    # A job that outlives the bound by far hangs (as before the host-call deadlines and the hard
    # exit): ended here, so that the scenario fails instead of waiting for CTest's timeout.
    for _ in $(seq 600); do
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$job" 2>/dev/null; then
      kill -TERM $(pgrep -P "$job") "$job" 2>/dev/null
      wait "$job"
      cat "$out"
      fail "the job was still running 60 s after the fault"
    fi
    wait "$job"
    status=$?
    set -e
    seconds=$(echo "$(date +%s.%N) - $faulted" | bc)
    reports=$(grep -E "did not complete within 3s|failed at step|exited on signal|the abort did not finish" "$out" || true)
    echo "$reports"
    echo "$fault: the job ended with $status ${seconds} s after the fault"
    (($(echo "$seconds < 23" | bc))) || fail "the job took ${seconds} s to end (bound: 3 + 15 + 5 s)"
    peer1='waiting for peers \[1( on [^],]*)?\]; aborting the job'
    case "$fault" in
      stop)
        ((status == 134)) || { cat "$out"; fail "the job ended with $status, not the watchdog's 134"; }
        grep -qE "did not complete within 3s at step [0-9]+; $peer1" <<<"$reports" ||
          { cat "$out"; fail "no report waits for rank 1"; }
        ;;
      kill)
        # Both ends race: mpirun sees rank 1 die and ends the job (SIGTERM to the others) with the
        # killed rank's 137, while the survivors' watchdogs see NCCL's asynchronous error (the
        # double's ncclRemoteError: "rank 1 (process N) is gone") within a poll and abort with
        # 134. Measured: mpirun first (137), the survivors' reports naming the lost process
        # printed before it killed them.
        ((status == 134 || status == 137)) ||
          { cat "$out"; fail "the job ended with $status, neither 134 nor mpirun's 137"; }
        grep -qE "process rank 1 .*exited on signal 9|\(process [0-9]+\) is gone\); aborting the job|$peer1" <<<"$reports" ||
          { cat "$out"; fail "nothing names the killed rank 1"; }
        ;;
      hung-abort)
        ((status == 134)) || { cat "$out"; fail "the job ended with $status, not the watchdog's 134"; }
        grep -qE "did not complete within 3s at step [0-9]+; $peer1" <<<"$reports" ||
          { cat "$out"; fail "no report waits for rank 1"; }
        grep -qE "the abort did not finish within 15s of the watchdog's report \(ncclCommAbort or MPI_Abort hung\); exiting with 134" <<<"$reports" ||
          { cat "$out"; fail "no rank says its abort hung"; }
        ;;
      absent)
        ((status == 134)) || { cat "$out"; fail "the job ended with $status, not the watchdog's 134"; }
        grep -qE "\(host blocked in ncclGroupEnd\) on group [a-z]+ \(ranks \[[0-9, ]+\]\) did not complete within 3s at step 1; $peer1" <<<"$reports" ||
          { cat "$out"; fail "no report of a host blocked in ncclGroupEnd waiting for rank 1"; }
        compgen -G "$run/flight/rank_*.jsonl" >/dev/null || fail "the watchdog wrote no flight dump"
        ;;
    esac
    ;;
  *)
    fail "unknown scenario $scenario"
    ;;
esac
