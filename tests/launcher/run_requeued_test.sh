#!/usr/bin/env bash
# deploy/slurm/run-requeued.sh's decisions after its launcher ends, with stand-ins for the
# launcher (it exits with a given status) and for scontrol (it records its arguments, and fails
# when told to): 3 (stopped with a checkpoint) requeues and ends with 0; 134 (the watchdog)
# requeues at most NF_FAILURE_REQUEUES times in a row; a requeue Slurm refuses ends with the
# launcher's status and says what to do, so that a job that stopped short never looks done;
# 0 is done only with RUN_DIR/finished.json written by this launch (srun can end with 0 for
# tasks it never launched): without it, 0 is a failure counted like 134 and ends with 1; any
# other status is passed on without a requeue. The real Slurm runs are slurm_requeue.sh.
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
echo "run_requeued: requeues, refusals, launches that trained nothing and plain ends each end as they should"
