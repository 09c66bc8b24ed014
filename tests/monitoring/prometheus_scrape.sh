#!/usr/bin/env bash
# Every metric from every rank, through a real Prometheus: a 4-rank nf-launch (tensor parallel
# 2 x pipeline parallel 2, metrics on, validation and checkpoints every few steps) runs while
# Debian's prometheus server scrapes it with the project's deploy/prometheus/prometheus.yml
# (scrape interval and targets folder adapted to the test; the targets file written by
# deploy/prometheus/normformer-targets.sh, as on a cluster node). The test then asks
# Prometheus's HTTP API for each metric the ranks export and expects all four ranks in the
# answer, evaluates every query of the Grafana dashboard (each must return data), checks each
# rank's page with `promtool check metrics`, and stops the run with SIGUSR1 (a checkpoint and
# exit code 3).
#
#   prometheus_scrape.sh NF_LAUNCH REPO_ROOT
set -euo pipefail
nf_launch=$1 repo=$2
for tool in prometheus promtool curl mpirun python3; do
  command -v "$tool" >/dev/null || { echo "prometheus_scrape: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "prometheus_scrape: $*" >&2
  for log in "$dir"/*.log; do [[ -f $log ]] && { echo "== $log"; tail -n 20 "$log"; }; done
  exit 1
}
source "$repo/tests/scripts/lib.sh"  # wait_for, free_port_base

# Ranks on base .. base+3, Prometheus on base+10 (the Slurm test takes 12000-20000).
base=$(free_port_base 20000 32000 0 1 2 3 10)
prometheus_port=$((base + 10))
job=scrape-test

# ---- the run ------------------------------------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none NF_NUM_THREADS=1
mpirun --oversubscribe -np 4 "$nf_launch" --config "$repo/deploy/configs/tiny.pbtxt" \
  --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2 \
  --set train.train_iters=100000 --set train.log_interval=2 --set train.eval_interval=4 \
  --set train.eval_iters=1 --set checkpoint.save_interval=4 \
  --set monitoring.enabled=true --set monitoring.bind_address=127.0.0.1 \
  --set monitoring.port_base=$base --set monitoring.job=$job \
  --run-dir "$dir/run" >"$dir/run.log" 2>&1 &
launcher=$!
pids+=("$launcher")
watched_pid=$launcher  # wait_for gives up as soon as nf-launch has ended

# ---- Prometheus with the project's scrape config --------------------------------------------------------
mkdir -p "$dir/targets"
"$repo/deploy/prometheus/normformer-targets.sh" --dir "$dir/targets" --job "$job" \
  --port-base "$base" --ranks 4 --host 127.0.0.1 >"$dir/targets.log" 2>&1 &
pids+=("$!")
sed -e "s|/etc/prometheus/normformer-targets/|$dir/targets/|" \
  -e 's|scrape_interval: 15s|scrape_interval: 1s|' -e 's|refresh_interval: 30s|refresh_interval: 1s|' \
  -e 's|scrape_timeout: 10s|scrape_timeout: 1s|' -e 's|evaluation_interval: 15s|evaluation_interval: 1s|' -e "s|- alerts.yml|- $repo/deploy/prometheus/alerts.yml|" \
  "$repo/deploy/prometheus/prometheus.yml" >"$dir/prometheus.yml"
promtool check config "$dir/prometheus.yml" >"$dir/promtool-config.log" 2>&1 ||
  fail "promtool check config refused the adapted scrape config"
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$dir/prometheus.log" 2>&1 &
pids+=("$!")

# The value of a scalar-valued PromQL query (0 when it has no result or Prometheus is not
# answering yet).
query_value() {
  curl -s --get "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json, sys
try:
    result = json.load(sys.stdin)["data"]["result"]
except ValueError:
    result = []
print(int(float(result[0]["value"][1])) if result else 0)'
}
# How many ranks (the ranks' own `rank` label) Prometheus has series of `selector` from.
ranks_with() { query_value "count(count by (rank) ($1))"; }
# `up` carries the targets' labels (job, node, local_rank), not the ranks'.
all_ranks_up() { [[ $(query_value 'count(up{job="'$job'"} == 1)') == 4 ]]; }
wait_for 120 "Prometheus to scrape all four ranks" all_ranks_up
# After a validation (step 4), a checkpoint (step 4) and per-block norms (log step 2): every
# metric has a value; a few more scrapes make sure Prometheus has them.
# (checkpoints come every 4 steps and only the newest two are kept: look at the log instead)
checkpointed() {
  [[ -f $dir/run/log.jsonl ]] && (($(grep -c '"loss"' "$dir/run/log.jsonl") >= 8)) &&
    compgen -G "$dir/run/checkpoints/iter_*" >/dev/null
}
wait_for 180 "the run to reach step 8" checkpointed
sleep 3

# Every metric of expected_metrics.txt (a histogram by its buckets).
metrics=()
while read -r name type _; do
  [[ -z $name || $name == \#* ]] && continue
  [[ $type == histogram ]] && name+=_bucket
  metrics+=("$name")
done <"$repo/tests/monitoring/expected_metrics.txt"
for metric in "${metrics[@]}"; do
  found=$(ranks_with "$metric{job=\"$job\"}")
  [[ $found == 4 ]] || fail "$metric: Prometheus has it from $found of 4 ranks"
done
# Per-block norms: embedding, the 4 layers and the head, from every rank.
blocks=$(ranks_with 'count by (rank, layer) (normformer_layer_grad_norm{job="'$job'"})')
[[ $blocks == 4 ]] || fail "normformer_layer_grad_norm: from $blocks of 4 ranks"
layers=$(query_value 'count(normformer_layer_grad_norm{job="'$job'",rank="0"})')
[[ $layers == 6 ]] || fail "rank 0 reports $layers blocks, expected 6 (embedding, 4 layers, head)"

# The waits are measured, not left at zero: the last pipeline stage waits for the first one's
# activations, and every rank here loads micro-batches (first stage: ids, last: targets).
positive_on() { query_value "count(($1) > 0)"; }
idle=$(positive_on 'normformer_pipeline_idle_ratio{job="'$job'",pp_rank="1"}')
[[ $idle == 2 ]] || fail "normformer_pipeline_idle_ratio > 0 on $idle of the 2 last-stage ranks"
waited=$(positive_on 'normformer_comm_seconds_total{job="'$job'",group="pp",op="recv"}')
[[ $waited == 4 ]] || fail "pipeline receives took time on $waited of 4 ranks"
# The configuration, as the run resolved it, on every rank.
info=$(query_value 'count(normformer_run_info{job="'$job'",layers="4",tp="2",pp="2",dp="1",normformer="scale_attn,scale_heads,scale_fc",precision="FP32",device="cpu"})')
[[ $info == 4 ]] || fail "normformer_run_info with the run's configuration from $info of 4 ranks"
loading=$(positive_on 'normformer_data_wait_seconds_total{job="'$job'"}')
[[ $loading == 4 ]] || fail "normformer_data_wait_seconds_total > 0 on $loading of 4 ranks"

# Every query of the Grafana dashboard, its variables substituted ($job; $__rate_interval as
# Grafana would make it of a 1 s scrape: 4 x 1 s, at least 15 s), returns data through
# Prometheus's HTTP API, except the GPU panels' DCGM_* queries: this job has no DCGM exporter.
python3 - "$repo/deploy/grafana/normformer-run.json" "$prometheus_port" "$job" <<'PY' ||
import json, sys, urllib.parse, urllib.request
dashboard, port, job = sys.argv[1], sys.argv[2], sys.argv[3]
empty, asked = [], 0
for panel in json.load(open(dashboard))["panels"]:
    for target in panel.get("targets", []):
        expr = target["expr"]
        if "DCGM_" in expr:
            continue
        query = expr.replace("$job", job).replace("$__rate_interval", "15s")
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        answer = json.load(urllib.request.urlopen(url))
        asked += 1
        if answer["status"] != "success" or not answer["data"]["result"]:
            empty.append(f"panel {panel['id']} '{panel['title']}': {query}")
for line in empty:
    print(f"no data: {line}", file=sys.stderr)
print(f"dashboard: {asked} queries, {asked - len(empty)} with data")
sys.exit(1 if empty else 0)
PY
  fail "dashboard queries without data (above)"

for ((rank = 0; rank < 4; rank++)); do
  curl -s "http://127.0.0.1:$((base + rank))/metrics" >"$dir/rank$rank.metrics"
  if ! promtool check metrics <"$dir/rank$rank.metrics" >"$dir/promtool-rank$rank.log" 2>&1; then
    cat "$dir/promtool-rank$rank.log"
    fail "promtool check metrics complained about rank $rank's page"
  fi
done

# ---- stop the run as a scheduler would (Slurm's --signal) --------------------------------------------------------------
kill -USR1 "$launcher"  # mpirun forwards it to every rank
status=0
wait "$launcher" || status=$?
((status == 3)) || fail "nf-launch ended with $status after SIGUSR1, expected 3"
echo "prometheus_scrape: ${#metrics[@]} metrics from all 4 ranks in Prometheus; promtool check metrics clean on each rank"
