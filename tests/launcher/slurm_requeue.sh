#!/usr/bin/env bash
# The Slurm contract end to end on a real one-node Slurm: this test starts munged, slurmctld
# and slurmd (Debian's, from scripts/setup.sh) on localhost in a scratch folder, submits the
# shipped batch script deploy/slurm/normformer-<launcher>.sbatch (mpirun, or srun --mpi=pmix) on
# the tiny config (CPU, two ranks),
# signals it mid-run, and checks that the job checkpointed, requeued itself, resumed from the
# checkpoint and finished with every step's loss equal to an uninterrupted run's. With
# PROMETHEUS_TARGETS set, the job also publishes its ranks for Prometheus while it runs (the
# targets file lists both ranks, which answer on /metrics) and withdraws them at its end.
#
# The signal: the script asks Slurm for `--signal=B:USR1@<lead>` before its time limit, which
# slurmctld delivers to the batch shell from a periodic check, up to a minute early. The test
# sends the very same signal to the same process (scancel --signal=USR1 --batch) at a chosen
# step instead, so that the stop lands mid-run on any machine; the time limit's own signal
# then has nothing left to do.
#
#   slurm_requeue.sh NF_LAUNCH REPO_ROOT mpirun|srun
set -euo pipefail
nf_launch=$1 repo=$2 launcher=$3
for tool in munged slurmctld slurmd sbatch scontrol scancel mpirun; do
  command -v "$tool" >/dev/null || { echo "slurm_requeue: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done

dir=$(mktemp -d)
export SLURM_CONF=$dir/slurm.conf
cleanup() {
  for pid_file in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [[ -f $pid_file ]] && kill "$(cat "$pid_file")" 2>/dev/null || true
  done
  sleep 1
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "slurm_requeue: $*" >&2
  for log in "$dir"/log/*.log "$dir/job.out"; do [[ -f $log ]] && { echo "== $log"; tail -n 30 "$log"; }; done
  exit 1
}
source "$repo/tests/scripts/lib.sh"  # wait_for, free_port_base

# ---- a one-node Slurm on localhost ------------------------------------------------------------
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
chmod 700 "$dir/munge"
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munge/seed" --log-file="$dir/log/munged.log"
node=$(hostname)  # addressed as 127.0.0.1: the name need not resolve
# slurmctld and slurmd on port and port + 1: away from a real Slurm's 6817/6818, free, and apart
# from the monitoring test's 20000-32000.
# The job's two ranks serve metrics on port + 10 and + 11 (the batch script's monitoring).
port=$(free_port_base 12000 20000 0 1 10 11)
metrics_base=$((port + 10))
mkdir -p "$dir/targets"
# The batch script asks for 8 GPUs per node: the node advertises 8 placeholder GPU files, which
# nothing opens (the test trains on the CPU).
for i in 0 1 2 3 4 5 6 7; do : >"$dir/gpu$i"; done
echo "Name=gpu File=$dir/gpu[0-7]" >"$dir/gres.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=normformer-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
GresTypes=gpu
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:8 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -i
slurmd
node_idle() { [[ $(sinfo -h -n "$node" -o %t 2>/dev/null) == idle ]]; }
wait_for 60 "the node to register" node_idle

# ---- the uninterrupted reference -----------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
steps=60
run_args=(--set train.train_iters=$steps --set train.log_interval=10)
mpirun --oversubscribe -np 2 "$nf_launch" --config "$repo/deploy/configs/tiny.pbtxt" \
  "${run_args[@]}" --run-dir "$dir/reference" >"$dir/reference.out"

# ---- the batch job: signalled at step 20, requeued, resumed ----------------------------------------
job=$(cd "$repo" && CONFIG=deploy/configs/tiny.pbtxt RUN_DIR="$dir/run" NF_LAUNCH="$nf_launch" \
  PROMETHEUS_TARGETS="$dir/targets" PROMETHEUS_PORT_BASE=$metrics_base \
  sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=30 \
  --output="$dir/job.out" --chdir="$repo" "deploy/slurm/normformer-$launcher.sbatch" "${run_args[@]}")
echo "submitted job $job"
# Step records only: a multi-rank job's log also has "stragglers" events.
steps_logged() { [[ -f $dir/run/log.jsonl ]] && (($(grep -c '"loss"' "$dir/run/log.jsonl") >= $1)); }
job_field() { scontrol show job "$job" 2>/dev/null | grep -o "$1=[^ ]*" | cut -d= -f2; }
# Every wait below depends on the machine's load: it ends when its state comes, or at once when
# the job has ended without it; the seconds only catch a wedged Slurm.
job_alive() { slurm_job_alive "$(job_field JobState)"; }
still_possible=job_alive
wait_for 900 "step 20 of the first run" steps_logged 20
# While it runs: the node's targets file lists both ranks, and they answer with their metrics.
targets_file=$(compgen -G "$dir/targets/*.json") || fail "no targets file in $dir/targets"
python3 - "$targets_file" "$metrics_base" <<'PY' || fail "targets file: $(cat "$targets_file")"
import json, sys
groups = json.load(open(sys.argv[1]))
base = int(sys.argv[2])
ports = sorted(int(t.split(":")[1]) for g in groups for t in g["targets"])
assert ports == [base, base + 1], ports
assert all(g["labels"]["job"] == "run" for g in groups), groups
PY
for port in $metrics_base $((metrics_base + 1)); do
  # grep reads all of the page (-q would stop early, and curl's SIGPIPE fail the pipeline)
  curl -sf "http://127.0.0.1:$port/metrics" | grep '^normformer_steps_total{.*job="run"' >/dev/null ||
    fail "no normformer_steps_total with job=\"run\" on port $port"
done
scancel --signal=USR1 --batch "$job"
requeued() { [[ $(job_field JobState) == PENDING && $(job_field Restarts) == 1 ]]; }
wait_for 900 "the job to requeue itself" requeued
# Released at once, but only once the first run has left the node: its slurmstepd processes
# (the batch step and srun's step, whose id the restart reuses) have ended, and the node is idle.
# Released before, the restart's srun fails to launch its tasks ("task 0 launch failed").
first_run_gone() { ! pgrep -f "slurmstepd: \[$job\." >/dev/null && node_idle; }
wait_for 900 "the first run to leave the node" first_run_gone
slurm_release_requeued "$job"
finished() { [[ $(job_field JobState) == COMPLETED ]]; }
wait_for 900 "the resumed job to complete" finished
cat "$dir/job.out"

# The publisher withdrew the node's targets when the last run ended.
[[ -z $(ls -A "$dir/targets") ]] || fail "targets left behind: $(ls -A "$dir/targets" | tr '\n' ' ')"
grep -q "SIGUSR1: asking the ranks to checkpoint and stop" "$dir/job.out" || fail "no SIGUSR1 in the job's output"
grep -q "nf-launch exited with 3" "$dir/job.out" || fail "the first run did not exit with 3"
grep -q "(restart 1)" "$dir/job.out" || fail "the job did not restart"
grep -q "resum" "$dir/job.out" || fail "the restart did not resume from a checkpoint"
# Every step's loss as the reference's: the last record per step (a resumed run appends).
losses() { python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    record = json.loads(line)
    if "event" not in record:  # spikes, rollbacks, stragglers: not steps
        last[record["step"]] = record["loss"]
for step in sorted(last):
    print(step, repr(last[step]))' "$1"; }
if ! diff <(losses "$dir/reference/log.jsonl") <(losses "$dir/run/log.jsonl") >"$dir/diff"; then
  cat "$dir/diff"
  fail "the requeued run's losses differ from the uninterrupted run's"
fi
echo "slurm_requeue: targets published and withdrawn, metrics served on ports $metrics_base+"
echo "slurm_requeue: job $job stopped at step $(grep -o 'stopping after step [0-9]*' "$dir/job.out" | grep -o '[0-9]*$'), requeued, resumed and matched all $steps steps"
