#!/usr/bin/env bash
# Metrics across nodes: a 4-rank nf-launch on a two-node test cluster (tests/cluster/cluster.sh;
# two ranks per node, tp = 2 inside each node, pp = 2 across them) with monitoring on. Each rank
# listens on port_base + its local rank (its index on its node, not its global rank) on its own
# node's address; each node publishes its two ranks with deploy/prometheus/normformer-targets.sh
# into one targets folder (a shared file system's, as on a cluster), and Debian's Prometheus,
# running on node 0 with the project's scrape config, must scrape all four ranks across the
# network, each from the node that runs it. Then node 1's link is slowed down: rank 0's
# communication wait per step must grow in the group whose traffic crosses it (pp) and not in
# the one inside node 0 (tp). SIGUSR1 to mpirun then stops every rank with a checkpoint (exit
# code 3).
#
#   metrics_across_nodes.sh NF_LAUNCH REPO_ROOT
set -euo pipefail
nf_launch=$1 repo=$2
for tool in prometheus curl python3; do
  command -v "$tool" >/dev/null || { echo "metrics_across_nodes: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done
source "$repo/tests/cluster/cluster.sh"
source "$repo/tests/cluster/cluster_mpirun.sh"
source "$repo/tests/scripts/lib.sh"  # wait_for
cluster_up 2
dir=$CLUSTER_DIR
fail() {
  echo "metrics_across_nodes: $*" >&2
  for log in "$dir"/*.log; do [[ -f $log ]] && { echo "== $log"; tail -n 20 "$log"; }; done
  exit 1
}
# Every node has its own ports: the defaults serve.
port_base=9600 prometheus_port=9090 job=cluster-metrics

cluster_mpirun_command slot 2
"${CLUSTER_MPIRUN[@]}" -np 4 "$nf_launch" --config "$repo/deploy/configs/tiny.pbtxt" \
  --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2 \
  --set train.train_iters=100000 --set train.log_interval=2 \
  --set monitoring.enabled=true --set "monitoring.port_base=$port_base" \
  --set "monitoring.job=$job" --run-dir "$dir/run" >"$dir/run.log" 2>&1 &
launcher=$!

mkdir -p "$dir/targets"
for node in 0 1; do  # one publisher per node, as the batch scripts start them
  cluster_exec "$node" "$repo/deploy/prometheus/normformer-targets.sh" --dir "$dir/targets" \
    --job "$job" --port-base "$port_base" --ranks 2 >"$dir/targets$node.log" 2>&1 &
done
sed -e "s|/etc/prometheus/normformer-targets/|$dir/targets/|" \
  -e 's|scrape_interval: 15s|scrape_interval: 1s|' -e 's|refresh_interval: 30s|refresh_interval: 1s|' \
  -e 's|scrape_timeout: 10s|scrape_timeout: 1s|' -e 's|evaluation_interval: 15s|evaluation_interval: 1s|' \
  -e "s|- alerts.yml|- $repo/deploy/prometheus/alerts.yml|" \
  "$repo/deploy/prometheus/prometheus.yml" >"$dir/prometheus.yml"
cluster_exec 0 prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$dir/prometheus.log" 2>&1 &

# PromQL on node 0's Prometheus: the result as lines "label=value ... value".
query() {
  cluster_exec 0 curl -s --get "http://127.0.0.1:$prometheus_port/api/v1/query" \
    --data-urlencode "query=$1" | python3 -c 'import json, sys
try:
    result = json.load(sys.stdin)["data"]["result"]
except ValueError:
    result = []
for series in sorted(result, key=lambda s: sorted(s["metric"].items())):
    print(" ".join(f"{k}={v}" for k, v in sorted(series["metric"].items())), series["value"][1])'
}
all_up() { [[ $(query "count(up{job=\"$job\"} == 1)") == " 4" ]]; }
watched_pid=$launcher
wait_for 120 "Prometheus on node 0 to scrape all four ranks" all_up
stepped() { [[ $(query "count(normformer_steps_total{job=\"$job\"} > 0)") == " 4" ]]; }
wait_for 120 "every rank to report steps" stepped
unset watched_pid

# Each target is a node's address and a local rank's port, and the rank behind it is one of
# that node's: ranks 0-1 on node 0, 2-3 on node 1 (--map-by slot).
placement=$(query "max by (node, local_rank, instance, rank) (normformer_steps_total{job=\"$job\"})" |
  sed 's/ [^ ]*$//')
echo "$placement"
expected=""
for rank in 0 1 2 3; do
  node=$((rank / 2)) local_rank=$((rank % 2))
  expected+="instance=${CLUSTER_NODES[node]}:$((port_base + local_rank)) local_rank=$local_rank node=${CLUSTER_NODES[node]} rank=$rank"$'\n'
done
[[ "$placement"$'\n' == "$expected" ]] || fail "targets and ranks do not match; expected:
$expected"
# And straight from the other node: node 1 reads node 0's rank 1 over the link.
page=$(cluster_exec 1 curl -sf "http://${CLUSTER_NODES[0]}:$((port_base + 1))/metrics") || true
grep -q "^normformer_steps_total{.*rank=\"1\"" <<<"$page" || fail "node 1 cannot read rank 1's page on node 0"

# A slow link shows where a user looks for it: node 1's link limited to 20 Mbit/s each way
# (tc's token bucket; netem, for delay, is not in every kernel): rank 0's wait seconds per step
# must at least double in the pp group, whose traffic crosses it. (They grow in the tp group
# too, which stays on node 0: wait seconds count late peers, and rank 0's tp partner is held up
# by its own pipeline receives.) Read from rank 0's page over two windows of steps.
waits_per_step() {  # prints "pp_seconds_per_step tp_seconds_per_step" between two page reads
  local first second
  first=$(cluster_exec 1 curl -sf "http://${CLUSTER_NODES[0]}:$port_base/metrics")
  sleep "$1"
  second=$(cluster_exec 1 curl -sf "http://${CLUSTER_NODES[0]}:$port_base/metrics")
  python3 - <(echo "$first") <(echo "$second") <<'PY'
import re, sys
def read(path):
    values = {"steps": 0.0, "pp": 0.0, "tp": 0.0}
    for line in open(path):
        if line.startswith("normformer_steps_total{"):
            values["steps"] = float(line.split()[-1])
        match = re.match(r'normformer_comm_seconds_total\{.*group="(pp|tp)"', line)
        if match:
            values[match.group(1)] += float(line.split()[-1])
    return values
a, b = read(sys.argv[1]), read(sys.argv[2])
steps = b["steps"] - a["steps"]
assert steps > 0, "no steps in the window"
print(f'{(b["pp"] - a["pp"]) / steps:.4f} {(b["tp"] - a["tp"]) / steps:.4f}')
PY
}
read -r pp_before tp_before < <(waits_per_step 3)
ip netns exec "${CLUSTER_NODES[1]}" tc qdisc replace dev eth0 root tbf rate 20mbit burst 32kb latency 1s
ip netns exec "nf${CLUSTER_TAG}sw" tc qdisc replace dev "v${CLUSTER_NODES[1]}" root tbf rate 20mbit burst 32kb latency 1s
sleep 2
read -r pp_after tp_after < <(waits_per_step 6)
echo "wait seconds per step on rank 0: pp $pp_before -> $pp_after, tp $tp_before -> $tp_after (node 1's link at 20 Mbit/s)"
python3 -c "import sys; pp0, pp1 = map(float, sys.argv[1:]); sys.exit(not pp1 > 2 * pp0)" \
  "$pp_before" "$pp_after" ||
  fail "the slow link did not show as pp wait seconds (pp $pp_before -> $pp_after, tp $tp_before -> $tp_after)"

kill -USR1 "$launcher"  # mpirun forwards it to every rank, on every node
status=0
wait "$launcher" || status=$?
((status == 3)) || fail "nf-launch ended with $status after SIGUSR1, expected 3"
echo "metrics_across_nodes: Prometheus on node 0 scraped all 4 ranks on their own nodes' addresses"
