#!/bin/bash
# What both batch scripts do once they have chosen a launcher: run it, pass Slurm's SIGUSR1 (ten
# minutes before the time limit) to it, and requeue the job when the ranks stopped with a checkpoint
# (exit code 3). A run the collective watchdog ended (exit code 134: a peer lost or hung, typically
# a node gone) is requeued as well, and so is one whose launcher reports a rank killed (137, SIGKILL:
# mpirun passes on the first rank's death, which comes ahead of the survivors' watchdogs when a
# rank is killed or its node lost), at most NF_FAILURE_REQUEUES times in a row (default 3; counted
# in RUN_DIR/.failure-requeues, reset by a run that finished or stopped with 3): srun returns about
# half a minute after its tasks end, long before Slurm marks a silent node down (SlurmdTimeout, 300
# s by default) and requeues the job itself, so without this a lost node would end the job. The
# restart resumes from the last complete checkpoint. Exit code 0 counts as done only with
# RUN_DIR/finished.json, which nf-launch writes on reaching train_iters (this script removes it
# before the launch): srun can report 0 for tasks it failed to launch ("task 0 launch failed"), and
# such a job used to end as if trained; it now counts as a failure like 134. A finished.json it
# cannot remove (a read-only run directory) stops it before the launch, and the failure count is
# read as a plain number or warned about and taken as 0, never evaluated. With PROMETHEUS_TARGETS
# set, it also turns monitoring on and publishes every node's ranks for Prometheus in that directory
# (one file per node, written atomically, removed once the launcher has ended or the job is
# signalled, with any temporary of it: deploy/prometheus/normformer-targets.sh).
#
#   exec deploy/slurm/run-requeued.sh LAUNCHER [ARGS...] NF_LAUNCH [NF_LAUNCH_ARGS...]
#
# `exec` from the batch script keeps its process, which is the one Slurm signals. The
# command's last arguments must be nf-launch's: monitoring's --set options are appended.
# Environment: RUN_DIR (required; its name is the run's Prometheus job label),
# PROMETHEUS_TARGETS (a directory the Prometheus host reads, on a shared file system; unset:
# no monitoring), PROMETHEUS_PORT_BASE (monitoring.port_base, default 9600), NF_FAILURE_REQUEUES
# (0 to 100, default 3).
set -uo pipefail

# Checked before anything runs; never put into an arithmetic context unchecked (bash evaluates
# what it holds there, and `a[$(cmd)]` runs cmd).
max_failures=${NF_FAILURE_REQUEUES:-3}
if [[ ! $max_failures =~ ^[0-9]{1,3}$ ]] || ((10#$max_failures > 100)); then
  echo "run-requeued.sh: NF_FAILURE_REQUEUES must be a whole number from 0 to 100 (got ${NF_FAILURE_REQUEUES@Q}); not launching" >&2
  exit 2
fi
max_failures=$((10#$max_failures))
# What a finished run leaves; removed before the launch, so that only this launch's ranks can
# write it. One still there (a read-only run directory, a directory in its place) would make the
# launcher's 0 look like a finished run whatever it did: stop before launching.
finished=$RUN_DIR/finished.json
if ! error=$(rm -f -- "$finished" 2>&1) || [[ -e $finished || -L $finished ]]; then
  error=${error//$'\n'/ }
  echo "run-requeued.sh: cannot remove $finished before the launch (${error:-it is still there}); a stale one would make an unfinished run look done: not launching" >&2
  exit 1
fi
failures_file=$RUN_DIR/.failure-requeues
rm -f -- "$RUN_DIR/.failure-requeues."?????? 2>/dev/null  # temporaries of a killed update

command=("$@")
targets=
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
targets_script=$here/../prometheus/normformer-targets.sh
if [[ -n ${PROMETHEUS_TARGETS:-} ]]; then
  job=$(basename "$RUN_DIR")
  port_base=${PROMETHEUS_PORT_BASE:-9600}
  command+=(--set monitoring.enabled=true --set "monitoring.job=$job"
            --set "monitoring.port_base=$port_base")
  # One publisher per node, alongside the ranks, until a stop marker appears in the (shared)
  # targets directory; Prometheus reads *.json only. (srun answers SIGTERM by killing its
  # tasks, which would leave their files behind.) The marker is a directory: mkdir creates it
  # new or fails, and never follows a link planted at its name.
  stop="$PROMETHEUS_TARGETS/.$job-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.stop"
  # Markers an earlier run of this job left when it was killed (or a file, from an older
  # version of this script): nobody else uses this job id's names.
  for old in "$PROMETHEUS_TARGETS/.$job-$SLURM_JOB_ID-"*.stop; do
    [[ -e $old || -L $old ]] && { rmdir -- "$old" 2>/dev/null || rm -f -- "$old"; }
  done
  # The job's targets files and their temporaries (a publisher killed mid-update leaves one),
  # removed whatever state their publishers are in; then the stop marker.
  withdraw_targets() {
    local node
    for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
      "$targets_script" --withdraw --dir "$PROMETHEUS_TARGETS" --job "$job" --host "$node"
    done
    rmdir -- "$stop" 2>/dev/null
  }
  # Slurm cancelling the job (scancel, the time limit, a node failure) sends SIGTERM first, and
  # SIGKILL KillWait seconds later: the publishers may not get to withdraw their files (one on a
  # failed node cannot), so do it here, also when the signal comes while waiting for them below
  # (a requeue for a node failure may: it once left the stop marker in the targets directory).
  trap 'trap "" TERM; echo "$(date -Is) SIGTERM: withdrawing the Prometheus targets"; withdraw_targets; exit 143' TERM
  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
    --overlap "$targets_script" --dir "$PROMETHEUS_TARGETS" \
    --job "$job" --port-base "$port_base" --ranks "${SLURM_NTASKS_PER_NODE%%(*}" \
    -- bash -c 'until [[ -e $0 ]]; do sleep 1; done' "$stop" &
  targets=$!
fi

echo "$(date -Is) job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"
"${command[@]}" &
launcher=$!
signalled=0
trap 'signalled=1; echo "$(date -Is) SIGUSR1: asking the ranks to checkpoint and stop"; kill -USR1 $launcher' USR1
# A trapped signal cuts `wait` short (status 128 + its number) while the launcher runs on:
# wait again for the launcher's own exit status. (A launcher that ended before the first wait
# still has its status collected by it.)
wait "$launcher"
status=$?
while ((signalled && status > 128)); do
  signalled=0
  wait "$launcher"
  status=$?
done
echo "$(date -Is) nf-launch exited with $status"
if [[ -n $targets ]]; then
  mkdir -- "$stop" || echo "$(date -Is) could not make the stop marker $stop: stopping the publishers by killing their srun"
  # The publishers see the marker within a second; one on a lost node never will, and must
  # not hold up the requeue: after 10 s its srun is killed. Then whatever a publisher left (one
  # killed, one lost) is removed, and the marker.
  for ((i = 0; i < 20; i++)); do kill -0 "$targets" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$targets" 2>/dev/null; then
    echo "$(date -Is) a node's Prometheus publisher did not stop: withdrawing its targets here"
    kill -9 "$targets" 2>/dev/null
  fi
  wait "$targets" 2>/dev/null
  withdraw_targets
fi
# Requeues the job and ends with 0; when Slurm refuses (a job submitted with --no-requeue, a
# cluster with JobRequeue=0), says so and ends with the launcher's status: the job must not look
# done when it stopped short of its steps.
requeue() {  # WHY
  if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi
  echo "$(date -Is) $1, but 'scontrol requeue $SLURM_JOB_ID' failed (submit with --requeue, on a" \
    "cluster with JobRequeue=1): resubmit the batch script to resume from the last checkpoint" >&2
  exit "$status"
}
# The count of failures requeued in a row. Anything may have written the file: a plain decimal
# number (as written below) counts, anything else is warned about and counts as 0.
read_failures() {
  local text=
  [[ -e $failures_file || -L $failures_file ]] || { echo 0; return; }
  [[ -f $failures_file ]] && LC_ALL=C IFS= read -r -N 12 text <"$failures_file" 2>/dev/null
  if [[ $text =~ ^[0-9]{1,9}$'\n'?$ ]]; then
    echo $((10#${text%$'\n'}))
  else
    echo "$(date -Is) warning: $failures_file does not hold a count of failures (a whole number): counting from 0" >&2
    echo 0
  fi
}
# Writes the count through a new temporary renamed into place: never into whatever a link or a
# file planted at the name reaches.
write_failures() {
  local tmp
  mkdir -p -- "$RUN_DIR" || return  # a launch that failed before nf-launch made it
  tmp=$(mktemp "$failures_file.XXXXXX") || return
  if echo "$1" >"$tmp" && mv -fT -- "$tmp" "$failures_file"; then return 0; fi
  rm -f -- "$tmp"
  return 1
}
# Why a failure may be worth a restart (a node lost or not started), or empty.
failure=
if ((status == 0)) && [[ ! -f $finished ]]; then
  failure="the launcher ended with 0 but no rank finished training ($finished is missing: did srun launch the tasks?)"
  echo "$(date -Is) $failure" >&2
  status=1
elif ((status == 134)); then
  failure="the collective watchdog ended the run"
elif ((status == 137)); then
  failure="a rank was killed (exit code 137, SIGKILL: a lost node, or the node's out-of-memory killer)"
fi
if ((status == 0 || status == 3)); then  # finished (an unfinished 0 is 1 by now), or stopped
  rm -f -- "$failures_file"
fi
if ((status == 3)); then
  requeue "the ranks stopped with a checkpoint"
fi
if [[ -n $failure ]]; then
  failures=$(($(read_failures) + 1))
  if ((failures <= max_failures)); then
    # Unrecorded, the count could not stop a failure that repeats: no requeue then.
    if ! write_failures "$failures"; then
      echo "$(date -Is) $failure, but the count of failures could not be written to $failures_file: not requeueing" >&2
      exit "$status"
    fi
    echo "$(date -Is) $failure: requeueing (failure $failures of at most $max_failures in a row)"
    requeue "$failure"
  fi
  echo "$(date -Is) $failure again: $((failures - 1)) requeues in a row did not help; giving up"
fi
exit "$status"
