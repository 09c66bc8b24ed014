#!/usr/bin/env bash
# The run directory across nodes. Checkpoints are one directory every rank writes into and rank
# 0 commits (docs/checkpoints.md), so a job across nodes needs a run directory that every node
# sees. On the two-node test cluster (tests/cluster/cluster.sh) every path is shared but one,
# which each node sees as a folder of its own (a node-local disk, CLUSTER_NODE_LOCAL):
#  - a run directory there is refused at start-up on every rank, with one line naming the first
#    rank that does not see it and its host, and nothing trained;
#  - a run directory on the shared path saves, stops (SIGUSR1: exit 3) and resumes across the
#    nodes (its checkpoint complete: every rank's shard in it).
#
#   run_directory_across_nodes.sh NF_LAUNCH REPO_ROOT
set -euo pipefail
nf_launch=$1 repo=$2
source "$repo/tests/cluster/cluster.sh"
source "$repo/tests/cluster/cluster_mpirun.sh"
cluster_up 2
dir=$CLUSTER_DIR
fail() { echo "run_directory_across_nodes: $*" >&2; exit 1; }
export CLUSTER_NODE_LOCAL=$dir/local
cluster_mpirun_command slot 2
run=(--config "$repo/deploy/configs/tiny.pbtxt" --set parallel.tensor_parallel=2
     --set parallel.pipeline_parallel=2 --set train.train_iters=20
     --set train.lr_schedule.warmup_iters=5)

status=0
"${CLUSTER_MPIRUN[@]}" -np 4 "$nf_launch" "${run[@]}" --run-dir "$CLUSTER_NODE_LOCAL/run" \
  >"$dir/local.out" 2>&1 || status=$?
cat "$dir/local.out"
((status == 1)) || fail "a node-local run directory: exit $status, expected 1"
errors=$(grep -c "is not shared by the nodes" "$dir/local.out" || true)
((errors == 1)) || fail "expected the refusal once (rank 0 prints it), found it $errors times"
grep -qE "rank 2 on ${CLUSTER_NODES[1]} does not find \.shared-check-[0-9]+ in [^,]+, which rank 0 on ${CLUSTER_NODES[0]} just wrote" \
  "$dir/local.out" || fail "the refusal does not name rank 2 on ${CLUSTER_NODES[1]}"
# Refused before anything was written: the fresh run directory was never made (the check file
# went into the directory above it, and is gone).
[[ ! -e $dir/local.${CLUSTER_NODES[0]}/run ]] || fail "the refused run made its run directory"
leftover=$(ls -A "$dir/local.${CLUSTER_NODES[0]}" | grep '^\.shared-check' || true)
[[ -z $leftover ]] || fail "the check left $leftover behind"

# A shared run directory: stop with a checkpoint at step 10, then resume to the end.
status=0
"${CLUSTER_MPIRUN[@]}" -np 4 "$nf_launch" "${run[@]}" --set train.exit_interval=10 \
  --run-dir "$dir/shared" >"$dir/first.out" 2>&1 || status=$?
((status == 3)) || { cat "$dir/first.out"; fail "the shared run's first part: exit $status, expected 3"; }
shards=$(ls "$dir/shared/checkpoints/iter_0000010" | grep -c '\.shard$')
((shards == 4)) || fail "iter_0000010 holds $shards shards, expected one per rank (4)"
"${CLUSTER_MPIRUN[@]}" -np 4 "$nf_launch" "${run[@]}" --run-dir "$dir/shared" >"$dir/second.out" 2>&1 ||
  { cat "$dir/second.out"; fail "the resumed run failed"; }
grep -m1 "resumed from" "$dir/second.out" || fail "the second part did not resume"
echo "run_directory_across_nodes: node-local refused, shared saved, stopped and resumed across nodes"
