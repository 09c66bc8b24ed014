#!/usr/bin/env bash
# Layouts across nodes: nf-launch under mpirun on a two-node test cluster (tests/cluster/
# cluster.sh: network namespaces joined by a bridge, TCP between them) trains like one process
# (tests/parallel/launch_layout_matches.sh: every step's loss within 1e-5 relative), with
#  - tp = 2 inside each node and pp = 2 across them (--map-by slot), and the reverse (--map-by
#    node: tp across the nodes, pp inside), which must work too and be warned about;
#  - tp = 2 inside each node and dp = 2 across them, ZeRO-1.
# The header's placement line must say which groups cross nodes, and the nodes' links must have
# carried the traffic. Last, with NF_BENCH_LAYOUT (a build with the benchmarks), nf-bench-layout
# --links on the first layout: a row per group, the pipeline group's marked as crossing nodes
# and the tensor group's not.
#
#   layouts_across_nodes.sh NF_LAUNCH REPO_ROOT [NF_BENCH_LAYOUT]
set -euo pipefail
nf_launch=$1 repo=$2 bench_layout=${3:-}
source "$repo/tests/cluster/cluster.sh"
source "$repo/tests/cluster/cluster_mpirun.sh"
cluster_up 2
config=$repo/deploy/configs/tiny.pbtxt
out=$CLUSTER_DIR/out

# run MAP_BY EXPECTED_PLACEMENT --set ...: one layout; fails the test with its output.
run() {
  local map_by=$1 expected=$2
  shift 2
  cluster_mpirun_command "$map_by" 2
  local before after
  before=$(cluster_link_bytes 1)
  if ! "$repo/tests/parallel/launch_layout_matches.sh" "$nf_launch" "$config" 4 \
      "${CLUSTER_MPIRUN[@]}" -- "$@" >"$out" 2>&1; then
    cat "$out"
    echo "layouts_across_nodes: --map-by $map_by $*: the losses differ or the run failed" >&2
    exit 1
  fi
  after=$(cluster_link_bytes 1)
  grep -F "placement: 4 ranks on 2 nodes" "$out" || { cat "$out"; exit 1; }
  if ! grep -qF "$expected" "$out"; then
    cat "$out"
    echo "layouts_across_nodes: --map-by $map_by $*: expected \"$expected\" in the header" >&2
    exit 1
  fi
  grep "records compared" "$out"
  # A tiny run sends a few MB between its stages or replicas: far more than the launcher's own
  # messages. Nothing may have gone around the link.
  echo "node 1's link carried $(( (after - before) / 1024 )) KiB"
  (( after - before > 1024 * 1024 )) || { echo "layouts_across_nodes: under 1 MiB crossed the link" >&2; exit 1; }
}

run slot "within a node: tp; across nodes: pp" \
  --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
run node "within a node: pp; across nodes: tp" \
  --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
grep -F "warning: tensor-parallel groups span nodes" "$out" ||
  { echo "layouts_across_nodes: no warning for tp across nodes" >&2; exit 1; }
run slot "within a node: tp; across nodes: dp" \
  --set parallel.tensor_parallel=2 --set parallel.distributed_optimizer=true
echo "layouts_across_nodes: every layout matched the single process"
[[ -n $bench_layout ]] || exit 0

cluster_mpirun_command slot 2
"${CLUSTER_MPIRUN[@]}" -np 4 "$bench_layout" --config "$config" --set parallel.tensor_parallel=2 \
  --set parallel.pipeline_parallel=2 --steps 2 --links >"$out" 2>&1 || { cat "$out"; exit 1; }
grep -E '^\| (tp|pp) \|' "$out"
grep -qE '^\| tp \| 0, 1 \| no \|' "$out" && grep -qE '^\| pp \| 0, 2 \| yes \|' "$out" ||
  { cat "$out"; echo "layouts_across_nodes: nf-bench-layout --links: wrong groups or nodes" >&2; exit 1; }
