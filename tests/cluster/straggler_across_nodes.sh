#!/usr/bin/env bash
# A slow node named: a 4-rank nf-launch on a two-node test cluster (tests/cluster/cluster.sh;
# tp 2 inside each node, dp 2 across them: every rank does the same work) logs a "stragglers"
# report every 2 steps. On the quiet run, nothing is flagged (three reports); then node 1's ranks
# are put in a cgroup holding them to 5% of one CPU (cpu.cfs_quota_us, as a throttled or
# overloaded node), and one of the next two reports must flag a rank of node 1, by name and
# host. SIGUSR1 then stops the job with a checkpoint.
#
#   straggler_across_nodes.sh NF_LAUNCH REPO_ROOT
set -uo pipefail
nf_launch=$1 repo=$2
source "$repo/tests/cluster/cluster.sh"
source "$repo/tests/cluster/cluster_mpirun.sh"
source "$repo/tests/scripts/lib.sh"  # wait_for
cluster_up 2
dir=$CLUSTER_DIR
cgroup=/sys/fs/cgroup/cpu/nf${CLUSTER_TAG}slow
cleanup_cgroup() {
  [[ -d $cgroup ]] || return 0
  # Leftover processes go back to the root group, so the group can go.
  while read -r pid; do echo "$pid" >/sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null; done <"$cgroup/cgroup.procs"
  rmdir "$cgroup" 2>/dev/null || true
}
trap 'kill "$launcher" 2>/dev/null; cleanup_cgroup; cluster_down' EXIT
fail() {
  echo "straggler_across_nodes: $*" >&2
  [[ -f $dir/run.out ]] && tail -n 20 "$dir/run.out"
  [[ -f $dir/run/log.jsonl ]] && grep '"stragglers"' "$dir/run/log.jsonl"
  exit 1
}
[[ -d /sys/fs/cgroup/cpu ]] || fail "no cgroup v1 cpu controller at /sys/fs/cgroup/cpu"

cluster_mpirun_command slot 2
export NF_NUM_THREADS=1
"${CLUSTER_MPIRUN[@]}" -np 4 "$nf_launch" --config "$repo/deploy/configs/tiny.pbtxt" \
  --set parallel.tensor_parallel=2 --set train.train_iters=100000 --set train.log_interval=2 \
  --set train.straggler_ratio=1.5 --set checkpoint.save_interval=0 --run-dir "$dir/run" \
  >"$dir/run.out" 2>&1 &
launcher=$!
watched_pid=$launcher
reports() { grep '"event":"stragglers"' "$dir/run/log.jsonl" 2>/dev/null; }
count() { reports | wc -l; }
has_reports() { (($(count) >= $1)); }
wait_for 180 "three reports of the quiet run" has_reports 3
quiet=$(reports | head -n 3)
echo "$quiet"
if grep -q '"flagged":true' <<<"$quiet"; then fail "the quiet run flagged a straggler"; fi

mkdir "$cgroup" || fail "cannot create $cgroup"
echo 100000 >"$cgroup/cpu.cfs_period_us"
echo 5000 >"$cgroup/cpu.cfs_quota_us"
for pid in $(ip netns pids "${CLUSTER_NODES[1]}"); do
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == nf-launch ]] && echo "$pid" >"$cgroup/cgroup.procs"
done
[[ -n $(cat "$cgroup/cgroup.procs") ]] || fail "no rank of node 1 went into the cgroup"
limited=$(count)
echo "node 1's ranks held to 5% of a CPU after report $limited"
wait_for 300 "two reports after the limit" has_reports $((limited + 2))
after=$(reports | sed -n "$((limited + 1)),$((limited + 2))p")
echo "$after"
grep -qE '"slowest":\{"rank":[23],"host":"'"${CLUSTER_NODES[1]}"'"[^}]*\},"fastest":\{[^}]*\},"ratio":[0-9.e+]*,"flagged":true' <<<"$after" ||
  fail "neither of the two reports after the limit flagged a rank of ${CLUSTER_NODES[1]}"
unset watched_pid
kill -USR1 "$launcher"
wait "$launcher"
echo "straggler_across_nodes: quiet run unflagged; node 1 named within two reports of its limit"
