#!/usr/bin/env bash
# deploy/slurm/run-requeued.sh's decisions after its launcher ends, with stand-ins for the
# launcher (it exits with a given status) and for scontrol (it records its arguments, and fails
# when told to): 3 (stopped with a checkpoint) requeues and ends with 0; 134 (the watchdog)
# and 137 (a rank killed: mpirun's status) requeue at most NF_FAILURE_REQUEUES times in a row; a requeue Slurm refuses ends with the
# launcher's status and says what to do, so that a job that stopped short never looks done;
# 0 is done only with RUN_DIR/finished.json written by this launch (srun can end with 0 for
# tasks it never launched): without it, 0 is a failure counted like 134 and ends with 1; any
# other status is passed on without a requeue. Hostile inputs: a finished.json the script cannot
# remove (a read-only run directory) stops it before the launch; a failure count file holding
# anything but a plain number is warned about and counts as 0 (never evaluated: `HOME[$(cmd)]`
# would run cmd), and is written through a new temporary, never through a link; a bad
# NF_FAILURE_REQUEUES is refused before the launch. With PROMETHEUS_TARGETS (stand-ins for srun
# and hostname publish two nodes), the targets directory is empty at the end, also after a lost
# node, a SIGTERM while the script waits for the publishers, and an earlier run's leftovers.
# The real Slurm runs are slurm_requeue.sh.
#
#   run_requeued_test.sh REPO_ROOT
set -uo pipefail
repo=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$dir/bin" "$dir/run"
cat >"$dir/bin/scontrol" <<'EOF2'
#!/usr/bin/env bash
if [[ "$1 ${2:-}" == "show hostnames" ]]; then tr , '\n' <<<"$3"; exit; fi
echo "$*" >>"$SCONTROL_LOG"
[[ -z ${SCONTROL_FAILS:-} ]] || { echo "scontrol: error: Requested operation is presently disabled" >&2; exit 1; }
EOF2
chmod +x "$dir/bin/scontrol"
export PATH=$dir/bin:$PATH SCONTROL_LOG=$dir/scontrol.log RUN_DIR=$dir/run
export SLURM_JOB_ID=42 SLURM_JOB_NODELIST=node0

# case STATUS [SCONTROL_FAILS]: runs the script with a launcher that exits STATUS, having
# written RUN_DIR/finished.json first when STATUS is 0 (nf-launch's finished run); sets $ended,
# $said (its output) and $calls (scontrol's arguments).
case_of() {
  local finishes=
  (($1 == 0)) && finishes="echo '{\"step\":3,\"train_iters\":3}' >'$RUN_DIR/finished.json';"
  launcher_case "$finishes exit $1" "${2:-}"
}
# launcher_case SCRIPT [SCONTROL_FAILS]: the same with a launcher that runs SCRIPT.
launcher_case() {
  rm -f "$SCONTROL_LOG"
  said=$(SCONTROL_FAILS=${2:-} bash "$repo/deploy/slurm/run-requeued.sh" bash -c "$1" 2>&1)
  ended=$?
  calls=$(cat "$SCONTROL_LOG" 2>/dev/null)
}

case_of 3
((ended == 0)) && [[ $calls == "requeue 42" ]] || fail "a checkpointed stop: ended $ended, scontrol '$calls'"
case_of 3 fails
((ended == 3)) || fail "a refused requeue ended with $ended, not the launcher's 3: $said"
grep -q "the ranks stopped with a checkpoint, but 'scontrol requeue 42' failed" <<<"$said" ||
  fail "a refused requeue is not explained: $said"
case_of 0
((ended == 0)) && [[ -z $calls ]] || fail "a finished run: ended $ended, scontrol '$calls'"
case_of 1
((ended == 1)) && [[ -z $calls ]] || fail "a failed run: ended $ended, scontrol '$calls'"
# The watchdog: requeued NF_FAILURE_REQUEUES (2) times in a row, then given up.
for attempt in 1 2; do
  NF_FAILURE_REQUEUES=2 case_of 134
  ((ended == 0)) && [[ $calls == "requeue 42" ]] ||
    fail "watchdog stop $attempt: ended $ended, scontrol '$calls': $said"
done
NF_FAILURE_REQUEUES=2 case_of 134
((ended == 134)) && [[ -z $calls ]] || fail "a third watchdog stop: ended $ended, scontrol '$calls'"
grep -q "2 requeues in a row did not help; giving up" <<<"$said" || fail "no giving up: $said"
case_of 3  # a checkpointed stop resets the count
[[ ! -f $RUN_DIR/.failure-requeues ]] || fail "the failure count survived a checkpointed stop"
rm -f "$RUN_DIR/.failure-requeues"
case_of 134 fails
((ended == 134)) || fail "a refused watchdog requeue ended with $ended: $said"
grep -q "the collective watchdog ended the run, but 'scontrol requeue 42' failed" <<<"$said" ||
  fail "a refused watchdog requeue is not explained: $said"
# A killed rank (mpirun ends with its 137 before the survivors' watchdogs end with 134): counted
# with the watchdog's stops, then given up with 137.
rm -f "$RUN_DIR/.failure-requeues"
NF_FAILURE_REQUEUES=2 case_of 134
NF_FAILURE_REQUEUES=2 case_of 137
((ended == 0)) && [[ $calls == "requeue 42" ]] && grep -q "a rank was killed (exit code 137" <<<"$said" ||
  fail "a killed rank: ended $ended, scontrol '$calls': $said"
NF_FAILURE_REQUEUES=2 case_of 137
((ended == 137)) && [[ -z $calls ]] || fail "a third failure in a row: ended $ended, scontrol '$calls'"
# 0 without finished.json (srun's "task 0 launch failed"), also when an earlier launch left one:
# a failure, requeued like the watchdog's, then given up with 1.
rm -f "$RUN_DIR/.failure-requeues"
echo '{"step":3,"train_iters":3}' >"$RUN_DIR/finished.json"  # from an earlier, shorter run
for attempt in 1 2; do
  NF_FAILURE_REQUEUES=2 launcher_case "exit 0"
  ((ended == 0)) && [[ $calls == "requeue 42" ]] ||
    fail "a launch that trained nothing, $attempt: ended $ended, scontrol '$calls': $said"
  grep -q "no rank finished training (.*finished.json is missing" <<<"$said" ||
    fail "an unfinished 0 is not explained: $said"
done
NF_FAILURE_REQUEUES=2 launcher_case "exit 0"
((ended == 1)) && [[ -z $calls ]] || fail "a third unfinished 0: ended $ended, scontrol '$calls'"
grep -q "2 requeues in a row did not help; giving up" <<<"$said" || fail "no giving up: $said"
case_of 0  # a finished run resets the count
((ended == 0)) && [[ ! -f $RUN_DIR/.failure-requeues ]] || fail "a finished run after failures: ended $ended"

# ---- hostile inputs ---------------------------------------------------------------------------
launched=$dir/launched
lines() { grep -c . <<<"$1"; }
# A stale finished.json that cannot be removed: in a read-only run directory (for root, whom
# permissions do not stop, a read-only bind mount in a mount namespace of its own), and a
# directory in its place. One line, exit 1, and the launcher never runs.
readonly_case() {
  rm -f "$SCONTROL_LOG" "$launched"
  if ((EUID == 0)); then
    said=$(unshare -m bash -c 'mount --bind -o ro "$RUN_DIR" "$RUN_DIR" && exec "$@"' _ \
      bash "$repo/deploy/slurm/run-requeued.sh" bash -c "touch '$launched'" 2>&1)
  else
    chmod a-w "$RUN_DIR"
    said=$(bash "$repo/deploy/slurm/run-requeued.sh" bash -c "touch '$launched'" 2>&1)
  fi
  ended=$?
  chmod u+w "$RUN_DIR"
}
if ((EUID == 0)) && ! unshare -m true 2>/dev/null; then
  fail "unshare -m is refused here: no way to make a read-only run directory for root"
fi
rm -f "$RUN_DIR/.failure-requeues"
echo '{"step":3,"train_iters":3}' >"$RUN_DIR/finished.json"
readonly_case
((ended == 1)) && [[ ! -e $launched ]] ||
  fail "a stale finished.json in a read-only run directory: ended $ended, launched: $([[ -e $launched ]] && echo yes || echo no): $said"
grep -q "cannot remove $RUN_DIR/finished.json before the launch (.*); .*not launching" <<<"$said" &&
  (($(lines "$said") == 1)) || fail "a finished.json that cannot be removed is not one clear line: $said"
rm -f "$RUN_DIR/finished.json"
mkdir -p "$RUN_DIR/finished.json/x"
launcher_case "touch '$launched'; exit 0"
((ended == 1)) && [[ ! -e $launched ]] && grep -q "cannot remove $RUN_DIR/finished.json" <<<"$said" ||
  fail "a directory at finished.json: ended $ended, launched: $([[ -e $launched ]] && echo yes || echo no): $said"
rm -rf "$RUN_DIR/finished.json"

# The failure count file: anything but a plain number counts as 0 with one warning naming it.
count=$RUN_DIR/.failure-requeues
for content in abc 1/0 "3 4" -5 '' 99999999999999999999 $'2\n3' "HOME[\$(touch '$dir/injected')]"; do
  printf '%s' "$content" >"$count"
  NF_FAILURE_REQUEUES=3 launcher_case "exit 134"
  ((ended == 0)) && [[ $calls == "requeue 42" ]] ||
    fail "a count file holding ${content@Q}: ended $ended, scontrol '$calls': $said"
  warning=$(grep "warning: $count does not hold a count of failures" <<<"$said")
  [[ -n $warning ]] && (($(lines "$warning") == 1)) && grep -q "failure 1 of at most 3" <<<"$said" ||
    fail "a count file holding ${content@Q} is not warned about once and counted as 0: $said"
  [[ $(cat "$count") == 1 ]] || fail "a count file holding ${content@Q} became '$(cat "$count")', not 1"
  [[ ! -e $dir/injected ]] || fail "the count file's ${content@Q} ran a command"
done
# A count as this script writes it, with leading zeros: a number (decimal, not octal).
echo 010 >"$count"
NF_FAILURE_REQUEUES=11 launcher_case "exit 134"
grep -q "failure 11 of at most 11" <<<"$said" || fail "a count file holding 010: $said"
# A link at the count's name: read through, but the new count replaces the link, not its target.
echo 1 >"$dir/victim"
ln -sfn "$dir/victim" "$count"
NF_FAILURE_REQUEUES=3 launcher_case "exit 134"
((ended == 0)) && grep -q "failure 2 of at most 3" <<<"$said" || fail "a linked count: ended $ended: $said"
[[ $(cat "$dir/victim") == 1 && ! -L $count && $(cat "$count") == 2 ]] ||
  fail "the count was written through a link: the link's target holds '$(cat "$dir/victim")'"
# A count that cannot be written (a directory at its name) cannot stop a repeating failure: no
# requeue, the launcher's status.
rm -f "$count"
mkdir -p "$count/x"
NF_FAILURE_REQUEUES=3 launcher_case "exit 134"
((ended == 134)) && [[ -z $calls ]] && grep -q "could not be written to $count: not requeueing" <<<"$said" ||
  fail "an unwritable count: ended $ended, scontrol '$calls': $said"
rm -rf "$count"
[[ -z $(ls -A "$RUN_DIR" | grep '^\.failure-requeues\.') ]] || fail "count temporaries left: $(ls -A "$RUN_DIR")"

# NF_FAILURE_REQUEUES: a whole number from 0 to 100, else refused before the launch (exit 2).
for value in abc -1 1e3 "3 4" 0x10 101 "HOME[\$(touch '$dir/injected')]"; do
  rm -f "$launched"
  NF_FAILURE_REQUEUES=$value launcher_case "touch '$launched'; exit 134"
  ((ended == 2)) && [[ ! -e $launched && -z $calls ]] ||
    fail "NF_FAILURE_REQUEUES=${value@Q}: ended $ended, launched: $([[ -e $launched ]] && echo yes || echo no): $said"
  grep -q "NF_FAILURE_REQUEUES must be a whole number from 0 to 100" <<<"$said" && (($(lines "$said") == 1)) ||
    fail "NF_FAILURE_REQUEUES=${value@Q} is not refused in one line: $said"
  [[ ! -e $dir/injected ]] || fail "NF_FAILURE_REQUEUES=${value@Q} ran a command"
done
NF_FAILURE_REQUEUES=0 launcher_case "exit 134"
((ended == 134)) && [[ -z $calls ]] || fail "NF_FAILURE_REQUEUES=0: ended $ended, scontrol '$calls': $said"
rm -f "$count"
# A first launch that failed before nf-launch made the run directory: requeued, and counted.
rm -rf "$RUN_DIR"
launcher_case "exit 0"
((ended == 0)) && [[ $calls == "requeue 42" && $(cat "$count") == 1 ]] ||
  fail "a launch failure without a run directory: ended $ended, scontrol '$calls': $said"
rm -f "$count"

# ---- Prometheus targets -------------------------------------------------------------------------
# srun's stand-in runs the publisher step once per node of SLURM_JOB_NODELIST, hostname answering
# the node's name. LOST_NODE's publisher dies with everything on it (SIGKILL) once it has
# published, leaving its file (and, with LOST_TEMP, a temporary as one killed mid-update would);
# the step then never ends, as srun waits for a lost node.
cat >"$dir/bin/srun" <<'EOF2'
#!/usr/bin/env bash
while [[ $1 == --* ]]; do shift; done
IFS=, read -ra nodes <<<"$SLURM_JOB_NODELIST"
pids=()
for node in "${nodes[@]}"; do
  if [[ $node != "${LOST_NODE:-}" ]]; then FAKE_HOST=$node "$@" & pids+=($!); continue; fi
  FAKE_HOST=$node setsid "$@" &
  lost=$!
  file=$PROMETHEUS_TARGETS/$(basename "$RUN_DIR")-$node.json
  while kill -0 "$lost" 2>/dev/null && [[ ! -f $file ]]; do sleep 0.05; done
  kill -9 -- "-$lost"
  [[ -z ${LOST_TEMP:-} ]] || : >"$PROMETHEUS_TARGETS/.$(basename "$RUN_DIR")-$node.$LOST_TEMP"
done
wait "${pids[@]}"
[[ -z ${LOST_NODE:-} ]] || exec sleep 1000
EOF2
printf '#!/bin/sh\necho "${FAKE_HOST:-not-a-node}"\n' >"$dir/bin/hostname"
chmod +x "$dir/bin/srun" "$dir/bin/hostname"
targets_dir=$dir/targets
mkdir -p "$targets_dir"
# The launcher: once both nodes have published, the ranks finish (or exit with $1).
publishing_launcher() {
  echo "until [[ -f $targets_dir/run-node0.json && -f $targets_dir/run-node1.json ]]; do sleep 0.05; done
        echo '{\"step\":3,\"train_iters\":3}' >'$RUN_DIR/finished.json'; exit ${1:-0}"
}
# monitored_start LAUNCHER_SCRIPT [ENV...]: the script with monitoring on two nodes, in a process
# group of its own as Slurm runs a job; monitored_end waits for it, then kills what is left of
# the group (as Slurm ends a job) and sets $ended, $said and $left (the targets directory).
monitored_start() {
  local script=$1
  shift
  rm -f "$SCONTROL_LOG"
  env "$@" PROMETHEUS_TARGETS="$targets_dir" SLURM_JOB_NODELIST=node0,node1 SLURM_JOB_NUM_NODES=2 \
    SLURM_NTASKS_PER_NODE='2(x2)' setsid bash "$repo/deploy/slurm/run-requeued.sh" bash -c "$script" \
    >"$dir/said" 2>&1 &
  job_pid=$!
}
monitored_end() {
  wait "$job_pid"
  ended=$?
  kill -9 -- "-$job_pid" 2>/dev/null
  said=$(cat "$dir/said")
  left=$(ls -A "$targets_dir" | tr '\n' ' ')
}
# A plain finished run, the restart of a job that an earlier run left a stop marker for (a file,
# as an older script made): both withdrawn, a marker of another job left alone.
touch "$targets_dir/.run-42-0.stop" "$targets_dir/.other-7-0.stop"
monitored_start "$(publishing_launcher)" SLURM_RESTART_COUNT=1
monitored_end
((ended == 0)) || fail "a monitored finished run ended $ended: $said"
[[ $left == ".other-7-0.stop " ]] || fail "a monitored finished run left in the targets directory: '$left' (expected only .other-7-0.stop)"
rm -f "$targets_dir/.other-7-0.stop"
# A lost node and SIGTERM (Slurm requeueing the job for the node failure) while the script waits
# for the publishers after the launcher ended: the stop marker's state is what the test waits on.
# (Each case starts from an empty directory.)
rm -rf "$targets_dir" "$RUN_DIR/.failure-requeues" && mkdir "$targets_dir"
monitored_start "$(publishing_launcher 134)" LOST_NODE=node1
for ((i = 0; i < 1200; i++)); do
  compgen -G "$targets_dir/.run-42-0.stop" >/dev/null && break
  kill -0 "$job_pid" 2>/dev/null || break
  sleep 0.05
done
compgen -G "$targets_dir/.run-42-0.stop" >/dev/null || fail "no stop marker while waiting for the publishers: $(cat "$dir/said")"
kill -TERM -- "-$job_pid"
monitored_end
((ended == 143)) || fail "SIGTERM while waiting for the publishers: ended $ended: $said"
[[ -z $left ]] || fail "SIGTERM while waiting for the publishers left in the targets directory: $left: $said"
# A lost node whose publisher was killed mid-update: after 10 s its step is killed, and its file
# and temporary are withdrawn.
rm -rf "$targets_dir" "$RUN_DIR/.failure-requeues" && mkdir "$targets_dir"
monitored_start "$(publishing_launcher 0)" LOST_NODE=node1 LOST_TEMP=Xy12Zw
monitored_end
((ended == 0)) && grep -q "a node's Prometheus publisher did not stop" <<<"$said" ||
  fail "a lost node's publisher: ended $ended: $said"
[[ -z $left ]] || fail "a lost node's publisher left in the targets directory: $left"

# The batch scripts' launch lines (stand-in mpirun and srun that record their arguments and
# finish the run). normformer-mpirun.sbatch binds each rank to its --cpus-per-task cores in
# blocks of the node (ppr:N:node:PE=C), never to one core each (`--map-by core --bind-to core`
# put a node's 8 ranks on 8 single cores of socket 0, their threads sharing each); neither
# script hides GPUs from the ranks (--gpus-per-task, a per-rank CUDA_VISIBLE_DEVICES), which
# would cost NCCL its P2P/NVLink paths.
cat >"$dir/bin/mpirun" <<'EOF2'
#!/usr/bin/env bash
printf '%s\n' "$@" >"$LAUNCH_ARGS"
echo '{"step":3,"train_iters":3}' >"$RUN_DIR/finished.json"
EOF2
cp "$dir/bin/mpirun" "$dir/bin/srun"
chmod +x "$dir/bin/mpirun" "$dir/bin/srun"
# launch_line SCRIPT [VAR=VALUE...]: runs the batch script from the repository root as sbatch
# would (its #SBATCH values as Slurm exports them, overridden by the arguments); sets $line to
# the launcher's arguments joined by spaces.
launch_line() {
  local script=$1
  shift
  rm -f "$dir/launch_args"
  said=$(cd "$repo" && env -u SLURM_NTASKS_PER_NODE -u SLURM_TASKS_PER_NODE -u SLURM_CPUS_PER_TASK \
    LAUNCH_ARGS="$dir/launch_args" SLURM_JOB_NAME=normformer-2.7b NF_LAUNCH=nf-launch "$@" \
    bash "deploy/slurm/$script" 2>&1)
  ended=$?
  line=$(paste -sd' ' "$dir/launch_args" 2>/dev/null)
}
launch_line normformer-mpirun.sbatch SLURM_NTASKS_PER_NODE=8 SLURM_CPUS_PER_TASK=12
((ended == 0)) || fail "normformer-mpirun.sbatch ended $ended: $said"
[[ $line == "--map-by ppr:8:node:PE=12 --bind-to core nf-launch --config "* ]] ||
  fail "normformer-mpirun.sbatch does not bind each rank to its 12 cores: mpirun $line"
[[ $line != *"--map-by core"* ]] || fail "normformer-mpirun.sbatch still maps by core: mpirun $line"
# sbatch --ntasks (no --ntasks-per-node): Slurm exports only SLURM_TASKS_PER_NODE, as "4(x2)".
launch_line normformer-mpirun.sbatch SLURM_TASKS_PER_NODE="4(x2)" SLURM_CPUS_PER_TASK=6
[[ $line == "--map-by ppr:4:node:PE=6 --bind-to core "* ]] ||
  fail "normformer-mpirun.sbatch from SLURM_TASKS_PER_NODE=4(x2): mpirun $line"
for script in normformer-mpirun.sbatch normformer-srun.sbatch; do
  if grep -nE "^[^#]*(--gpus-per-task|CUDA_VISIBLE_DEVICES|--gpu-bind)" "$repo/deploy/slurm/$script"; then
    fail "$script hides GPUs from the ranks (NCCL then loses P2P/NVLink between them)"
  fi
  grep -q "^#SBATCH --gpus-per-node=" "$repo/deploy/slurm/$script" ||
    fail "$script does not give the nodes' GPUs to the job with --gpus-per-node"
done

echo "run_requeued: requeues, refusals, launches that trained nothing, plain ends and hostile inputs each end as they should; the targets directory is left empty; the batch scripts bind each rank to its cores and leave every GPU visible"
