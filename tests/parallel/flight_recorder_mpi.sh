#!/usr/bin/env bash
# The flight recorder end to end (parallel/flight_dumps.h, nf-flight): a real nf-launch job
# under mpirun hangs one way or another, and `nf-flight RUN` must name the rank at fault.
#
#   stop     pipeline rank 1 of a pp 2 job is stopped (SIGSTOP) at step 3 or 4: rank 0's watchdog
#            (3 s) dumps and asks for the others' records; rank 1 cannot answer
#   kill     pipeline rank 1 is killed (SIGKILL): mpirun ends the job with SIGTERM, on which rank
#            0 dumps; rank 1 leaves no record
#   desync   rank 1 of a tp 2 x dp 2 job issues a world barrier no other rank issues
#            (NF_INJECT_DESYNC=1:4): every rank waits, and rank 1 is the one out of step
#   request  `nf-flight --request RUN` and a SIGUSR2 to rank 1 make the ranks of a running job
#            write their records, and the job goes on
#
#   flight_recorder_mpi.sh SCENARIO NF_LAUNCH NF_FLIGHT CONFIG MPIRUN...
set -uo pipefail
scenario=$1 nf_launch=$2 nf_flight=$3 config=$4
shift 4
mpirun=("$@")
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run=$dir/run
fail() { echo "FAIL: $*" >&2; exit 1; }

# `nf-flight RUN` must print every one of the given lines' texts.
expect_flight() {
  local out
  out=$("$nf_flight" "$run") || fail "nf-flight exited with $?"
  echo "$out"
  for text in "$@"; do
    grep -qF -- "$text" <<<"$out" || fail "nf-flight did not say: $text"
  done
}

pp2=(--config "$config" --set parallel.pipeline_parallel=2
     --set parallel.collective_timeout_seconds=3 --set train.train_iters=100000 --run-dir "$run")
case "$scenario" in
  stop | kill)
    signal=${scenario^^}
    "$here/signal_rank.sh" "$signal" 1 "$run/log.jsonl" 3 -- "${mpirun[@]}" -np 2 "$nf_launch" \
      "${pp2[@]}" >"$dir/job.out" 2>&1
    status=$?
    ((status != 0)) || fail "the job ended with 0 after SIG$signal"
    if [[ $scenario == stop ]]; then
      # A stopped rank leaves no record, or one written only when it was continued (by mpirun,
      # to end the job): late, or on time but saying it did not run: either way it is named.
      expect_flight "verdict: the job waits for rank(s) [1 ("
      grep -qE "verdict: the job waits for rank\(s\) \[1 \((did not answer|no recent record|did not run for [0-9.]+ s)\)\]$" \
        <("$nf_flight" "$run") || fail "the stopped rank is not named as silent or frozen"
      # Any record it wrote came after the stop (at least the watchdog's 3 s), which it must see.
      if [[ -f $run/flight/rank_00001.jsonl ]]; then
        "$nf_flight" "$run" | grep -qE "^rank 1 .* did not run for [0-9.]+ s" ||
          fail "rank 1's record does not say that it was stopped"
      fi
    else
      expect_flight "rank 1: no record: it never answered" \
        "verdict: the job waits for rank(s) [1 (no recent record)]"
    fi
    ;;
  desync)
    NF_INJECT_DESYNC=1:4 "${mpirun[@]}" -x NF_INJECT_DESYNC -np 4 "$nf_launch" --config "$config" \
      --set parallel.tensor_parallel=2 --set parallel.collective_timeout_seconds=3 \
      --run-dir "$run" >"$dir/job.out" 2>&1
    status=$?
    ((status == 134)) || fail "the job ended with $status, not the watchdog's 134"
    expect_flight "4 rank(s), 4 record(s)" "barrier #" \
      "verdict: rank(s) [1] issued collectives the rest of their group did not"
    ;;
  request)
    "${mpirun[@]}" -np 2 "$nf_launch" "${pp2[@]}" >"$dir/job.out" 2>&1 &
    job=$!
    for _ in $(seq 600); do
      [[ -f $run/log.jsonl ]] && (($(grep -c '"loss"' "$run/log.jsonl") >= 3)) && break
      kill -0 "$job" 2>/dev/null || fail "the job ended early: $(cat "$dir/job.out")"
      sleep 0.1
    done
    "$nf_flight" --request "$run" || fail "nf-flight --request failed"
    # Both ranks answer (their threads look every 100 ms) while the job trains on.
    for _ in $(seq 600); do
      grep -qs '"reason":"requested: nf-flight --request"' "$run/flight/rank_00000.jsonl" &&
        grep -qs '"reason":"requested: nf-flight --request"' "$run/flight/rank_00001.jsonl" && break
      sleep 0.1
    done
    grep -qs '"reason":"requested: nf-flight --request"' "$run/flight/rank_00001.jsonl" ||
      fail "the ranks did not answer nf-flight --request"
    victim=$(for pid in $(pgrep -P "$job") $(pgrep -g "$(ps -o pgid= "$job" | tr -d ' ')"); do
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && echo "$pid"
    done | head -n 1)
    [[ -n $victim ]] || fail "rank 1's process not found"
    kill -USR2 "$victim"
    for _ in $(seq 600); do
      grep -qs '"reason":"SIGUSR2 (a request)"' "$run/flight/rank_00001.jsonl" && break
      sleep 0.1
    done
    grep -qs '"reason":"SIGUSR2 (a request)"' "$run/flight/rank_00001.jsonl" ||
      fail "rank 1 did not answer SIGUSR2"
    kill -0 "$job" 2>/dev/null || fail "the job did not go on after the requests"
    lines=$(grep -c '"loss"' "$run/log.jsonl")
    for _ in $(seq 600); do (($(grep -c '"loss"' "$run/log.jsonl") > lines)) && break; sleep 0.1; done
    (($(grep -c '"loss"' "$run/log.jsonl") > lines)) || fail "no step after the requests"
    kill -TERM "$job"
    wait "$job"
    "$nf_flight" "$run" | head -n 3
    ;;
  *) fail "unknown scenario $scenario" ;;
esac
echo "flight recorder: $scenario named as expected"
