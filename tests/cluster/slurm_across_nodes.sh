#!/usr/bin/env bash
# Slurm across nodes: slurmctld and one slurmd per node of a three-node test cluster
# (tests/cluster/cluster.sh; Debian's Slurm and munge, from scripts/setup.sh), and the shipped
# batch script deploy/slurm/normformer-LAUNCHER.sbatch (mpirun, or srun --mpi=pmix) submitted
# with `sbatch -N 2` on the tiny config (two ranks per node, data parallel 4). Mid-run one of the
# job's nodes goes down (its slurmd and every process on it killed, its link cut): the job must
# come back by itself on the two nodes left, resume from the last complete checkpoint and end
# with every step's loss equal to an uninterrupted run's (1e-5 relative). Two ways back, one per
# launcher: with mpirun, Slurm notices the silent node first (SlurmdTimeout 10 s) and requeues
# the job for the node failure; with srun, Slurm is made slow to notice (SlurmdTimeout 90 s, as
# with its 300 s default in production), srun returns with the watchdog's exit code 134 and the
# batch script requeues the job itself (deploy/slurm/run-requeued.sh).
#
#   slurm_across_nodes.sh NF_LAUNCH REPO_ROOT mpirun|srun
set -euo pipefail
nf_launch=$1 repo=$2 launcher=$3
for tool in munged slurmctld slurmd sbatch scontrol sinfo mpirun; do
  command -v "$tool" >/dev/null || { echo "slurm_across_nodes: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done
source "$repo/tests/cluster/cluster.sh"
source "$repo/tests/scripts/lib.sh"  # wait_for
cluster_up 3
dir=$CLUSTER_DIR
export CLUSTER_DIR SLURM_CONF=$dir/slurm.conf
fail() {
  echo "slurm_across_nodes: $*" >&2
  for log in "$dir"/log/*.log "$dir/job.out"; do [[ -f $log ]] && { echo "== $log"; tail -n "${LOG_LINES:-25}" "$log"; }; done
  exit 1
}
on0() { cluster_exec 0 "$@"; }  # the Slurm commands talk to slurmctld on node 0

# ---- munge (its socket is a file: every node reaches it) and Slurm --------------------------------
mkdir -p "$dir/munge" "$dir/state" "$dir/log"
chmod 700 "$dir/munge"
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed" --log-file="$dir/log/munged.log"
# munged runs outside the nodes (cluster_down ends everything inside them): stop it too.
trap 'kill "$(cat "$dir/munge/munged.pid" 2>/dev/null)" 2>/dev/null || true; cluster_down' EXIT
nodes=""
for ((i = 0; i < 3; i++)); do
  mkdir -p "$dir/spool/${CLUSTER_NODES[i]}"
  nodes+="NodeName=${CLUSTER_NODES[i]} NodeAddr=${CLUSTER_ADDRS[i]} CPUs=2 State=UNKNOWN"$'\n'
done
# Each node has its own ports (its own network namespace): Slurm's defaults serve. A node that
# stops answering is marked down after SlurmdTimeout (300 s by default). When the watchdog
# aborts the job, srun waits KillWait + 2 s for the step's processes on the lost node (which
# never answer) before it returns: 5 s instead of the default 30 keeps the test short.
if [[ $launcher == mpirun ]]; then slurmd_timeout=10; else slurmd_timeout=90; fi
cat >"$SLURM_CONF" <<CONF
ClusterName=normformer-cluster-test
SlurmctldHost=${CLUSTER_NODES[0]}(${CLUSTER_ADDRS[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/spool/%n/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmdTimeout=$slurmd_timeout
KillWait=5
TmpFS=$dir/node-tmp
$nodes
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
on0 slurmctld -i
# Each slurmd (and so each job step) sees a node-local TmpFS, as on real nodes: Slurm's PMIx
# plugin makes per-step folders there whose names would collide on a shared /tmp.
for ((i = 0; i < 3; i++)); do
  CLUSTER_NODE_LOCAL=$dir/node-tmp cluster_exec "$i" slurmd -N "${CLUSTER_NODES[i]}" ||
    fail "slurmd did not start on ${CLUSTER_NODES[i]}"
done
all_idle() { [[ $(on0 sinfo -h -t idle -o %D 2>/dev/null) == 3 ]]; }
wait_for 60 "the three nodes to register" all_idle

# ---- the uninterrupted reference: the same layout on one machine -----------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none NF_NUM_THREADS=1
steps=60
run_args=(--set train.train_iters=$steps --set train.log_interval=1 --set checkpoint.save_interval=10
          --set parallel.collective_timeout_seconds=10)
mpirun --oversubscribe -np 4 "$nf_launch" --config "$repo/deploy/configs/tiny.pbtxt" \
  "${run_args[@]}" --run-dir "$dir/reference" >"$dir/reference.out" 2>&1 ||
  fail "the reference run failed: $(tail -n 5 "$dir/reference.out")"

# ---- the batch job on two of the three nodes -----------------------------------------------------------
mkdir -p "$dir/targets"
job=$(cd "$repo" && CONFIG=deploy/configs/tiny.pbtxt RUN_DIR="$dir/run" NF_LAUNCH="$nf_launch" \
  PROMETHEUS_TARGETS="$dir/targets" on0 sbatch --parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --time=30 \
  --gpus-per-node=0 --output="$dir/job.out" --chdir="$repo" \
  "deploy/slurm/normformer-$launcher.sbatch" "${run_args[@]}")
echo "submitted job $job"
job_field() { on0 scontrol show job "$job" 2>/dev/null | grep -oE "(^| )$1=[^ ]*" | head -1 | cut -d= -f2; }
# Step records only: a multi-rank job's log also has "stragglers" events.
steps_logged() { [[ -f $dir/run/log.jsonl ]] && (($(grep -c '"loss"' "$dir/run/log.jsonl") >= $1)); }
# Every wait below depends on the machine's load: it ends when its state comes, or at once when
# the job has ended without it; the seconds only catch a wedged cluster.
job_alive() { slurm_job_alive "$(job_field JobState)"; }
still_possible=job_alive
wait_for 900 "step 15 of the first run" steps_logged 15
# While it runs: each of the job's nodes has published its two ranks (deploy/prometheus file-based
# discovery, written on the node), at the node's own name and port_base + local rank (from the
# launcher's local rank variables: OMPI's under mpirun, SLURM_LOCALID under srun), and every
# one of them answers there with a rank of that node (ranks 0-1 on the first, 2-3 on the second).
for node in $(on0 scontrol show hostnames "$(job_field NodeList)"); do
  targets_file=$dir/targets/run-$node.json
  [[ -f $targets_file ]] || fail "no targets file for $node in $dir/targets: $(ls "$dir/targets")"
  for target in $(python3 -c 'import json, sys
print(" ".join(t for g in json.load(open(sys.argv[1])) for t in g["targets"]))' "$targets_file"); do
    [[ $target == "$node":960[01] ]] || fail "$node publishes $target"
    page=$(on0 curl -sf "http://$target/metrics") || fail "nothing answers at $target"
    rank=$(grep '^normformer_steps_total{' <<<"$page" | grep -o '[{,]rank="[0-9]*"' | grep -o '[0-9]*')
    echo "$target serves rank $rank"
    expected_node=$(on0 scontrol show hostnames "$(job_field NodeList)" | sed -n "$((rank / 2 + 1))p")
    [[ $node == "$expected_node" && $((rank % 2)) == "${target##*:960}" ]] ||
      fail "$target serves rank $rank, which should be on $expected_node at port 960$((rank % 2))"
  done
done
# The node to lose: one of the job's that runs neither its batch script nor slurmctld.
batch_host=$(job_field BatchHost)
lost=
for node in $(on0 scontrol show hostnames "$(job_field NodeList)"); do
  [[ $node != "$batch_host" && $node != "${CLUSTER_NODES[0]}" ]] && lost=$node
done
[[ -n $lost ]] || fail "no node of the job to lose besides the batch host $batch_host"
echo "the job runs on $(job_field NodeList) (batch script on $batch_host); taking $lost down"
lost_index=$(cluster_node_of "$lost")
ip -n "$lost" link set eth0 down
for pid in $(ip netns pids "$lost"); do kill -9 "$pid" 2>/dev/null || true; done
requeued() { [[ $(job_field JobState) == PENDING && $(job_field Restarts) == 1 ]]; }
wait_for 900 "the job to requeue itself" requeued
echo "requeued: $(on0 sinfo -h -n "$lost" -o '%n %t') ($(job_field Reason))"
if [[ $launcher == srun ]]; then
  grep -q "the collective watchdog ended the run: requeueing (failure 1 of" "$dir/job.out" ||
    fail "the batch script did not requeue the job after the watchdog"
fi
# A requeued job becomes eligible again after a delay (about two minutes): release it once the
# lost node is down, so that the restart cannot be placed on it.
lost_down() { [[ $(on0 sinfo -h -n "$lost" -o %t) == down* ]]; }
wait_for 900 "Slurm to mark $lost down" lost_down
slurm_release_requeued "$job" on0
finished() { [[ $(job_field JobState) == COMPLETED ]]; }
wait_for 900 "the job to complete" finished
cat "$dir/job.out"
grep -q "(restart 1) on" "$dir/job.out" || fail "the job did not restart"
[[ -z $(ls -A "$dir/targets") ]] || fail "Prometheus targets left behind: $(ls -A "$dir/targets" | tr '\n' ' ')"
grep -q "resumed from" "$dir/job.out" || fail "the restart did not resume from a checkpoint"
grep -F "(restart 1) on" "$dir/job.out" | grep -qF "$lost" && fail "the restart ran on the lost node $lost"
"$repo/tests/scripts/compare_losses.py" "$dir/reference/log.jsonl" "$dir/run/log.jsonl" "$steps" ||
  fail "the losses differ from the uninterrupted run's"
if [[ $launcher == srun ]]; then by="the batch script, after the watchdog"; else by="Slurm, for the node failure"; fi
echo "slurm_across_nodes: $launcher: lost $lost at step $(grep -o 'at step [0-9]*;' "$dir/job.out" | head -1 | grep -o '[0-9]*'), requeued by $by, resumed on the nodes left"
