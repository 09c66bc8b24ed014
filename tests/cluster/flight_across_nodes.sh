#!/usr/bin/env bash
# The flight recorder across nodes: a 4-rank nf-launch on a two-node test cluster
# (tests/cluster/cluster.sh; tp 2 inside each node, pp 2 across them, the run directory shared)
# hangs three ways, and `nf-flight RUN` names the rank at fault each time:
#   stop     rank 2 (on node 1) is stopped (SIGSTOP): the ranks waiting for it dump their
#            records after the 3 s watchdog; rank 2 cannot answer (and may leave no record, or
#            one that says it did not run)
#   kill     rank 2 is killed (SIGKILL): mpirun ends the others, which dump on its SIGTERM
#   desync   rank 3 (on node 1) issues a world barrier no other rank issues (NF_INJECT_DESYNC)
# and says how long after the fault the verdict could be read.
#
#   flight_across_nodes.sh NF_LAUNCH NF_FLIGHT REPO_ROOT
set -uo pipefail
nf_launch=$1 nf_flight=$2 repo=$3
source "$repo/tests/cluster/cluster.sh"
source "$repo/tests/cluster/cluster_mpirun.sh"
source "$repo/tests/scripts/lib.sh"  # wait_for
cluster_up 2
dir=$CLUSTER_DIR
fail() {
  echo "flight_across_nodes: $*" >&2
  for log in "$dir"/*.out; do [[ -f $log ]] && { echo "== $log"; tail -n 20 "$log"; }; done
  exit 1
}
cluster_mpirun_command slot 2
export NF_NUM_THREADS=1
layout=(--config "$repo/deploy/configs/tiny.pbtxt" --set parallel.tensor_parallel=2
        --set parallel.pipeline_parallel=2 --set parallel.collective_timeout_seconds=3
        --set train.train_iters=100000)

# The pid of world rank $1 in node 1's namespace.
pid_of_rank() {
  local pid
  for pid in $(ip netns pids "${CLUSTER_NODES[1]}"); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == nf-launch ]] || continue
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" &&
      { echo "$pid"; return 0; }
  done
  return 1
}

# scenario NAME SIGNAL|desync EXPECTED_VERDICT
scenario() {
  local name=$1 fault=$2 verdict=$3 run=$dir/$1
  local inject=
  [[ $fault == desync ]] && inject=3:4
  NF_INJECT_DESYNC=$inject "${CLUSTER_MPIRUN[@]}" -x NF_INJECT_DESYNC -np 4 "$nf_launch" "${layout[@]}" \
    --run-dir "$run" >"$dir/$name.out" 2>&1 &
  local launcher=$! faulted=$SECONDS
  if [[ $fault != desync ]]; then
    watched_pid=$launcher
    steps() { [[ -f $run/log.jsonl ]] && (($(grep -c '"loss"' "$run/log.jsonl") >= 3)); }
    wait_for 120 "step 3 of the $name run" steps
    unset watched_pid
    local victim
    victim=$(pid_of_rank 2) || fail "$name: rank 2's process not found on node 1"
    kill "-$fault" "$victim"
    faulted=$SECONDS
  fi
  local status=0
  wait "$launcher" || status=$?
  ((status != 0)) || fail "$name: the job ended with 0"
  echo "== $name: the job ended $((SECONDS - faulted)) s after the $([[ $fault == desync ]] &&
    echo "launch (the desync comes at step 4)" || echo "SIG$fault") (exit $status)"
  "$nf_flight" "$run" | tee "$dir/$name.flight"
  grep -qF -- "$verdict" "$dir/$name.flight" || fail "$name: nf-flight did not say: $verdict"
  # The host of each record: node 0's ranks 0-1, node 1's 2-3.
  grep -q "rank 0 (tp=0, dp=0, pp=0) on ${CLUSTER_NODES[0]}" "$dir/$name.flight" ||
    fail "$name: rank 0's host is not named"
}

# A stopped rank leaves no record, or one written only when it was continued (mpirun ending the
# job): after the watchdog's grace, or on time but saying the process did not run: "[2 (did not
# answer)]", "[2 (no recent record)]", or "[2 (did not run for 4.0 s)]" (stopped inside the tp
# all-reduce rank 3 waits in too).
scenario stop STOP "verdict: the job waits for rank(s) [2 ("
if [[ -f $dir/stop/flight/rank_00002.jsonl ]]; then
  grep -qE "^rank 2 .* did not run for [0-9.]+ s" "$dir/stop.flight" ||
    fail "stop: rank 2's record does not say that it was stopped"
fi
scenario kill KILL "verdict: the job waits for rank(s) [2 (no recent record)]"
scenario desync desync "verdict: rank(s) [3] issued collectives the rest of their group did not"
echo "flight_across_nodes: the stopped, killed and out-of-step rank each named across nodes"
