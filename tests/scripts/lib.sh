# Helpers for the shell tests that start servers and wait for them; sourced after the test has
# defined `fail MESSAGE` (prints MESSAGE and the test's logs, exits 1).

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every half second until it succeeds. It fails
# at once when what it waits for can no longer come: the process `watched_pid` (if set) has
# ended, or the command in `still_possible` (if set, e.g. "job_alive") fails. SECONDS only
# catches a wedged system: it is no guess at how long the state takes, which depends on the
# machine's load, so waits on a slow state (a Slurm requeue, a node marked down) give a generous
# one and say with still_possible when to stop waiting.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  for ((i = 0; i < seconds * 2; i++)); do
    if "$@"; then return 0; fi
    if [[ -n ${watched_pid:-} ]] && ! kill -0 "$watched_pid" 2>/dev/null; then
      fail "process $watched_pid ended while waiting for $what"
    fi
    if [[ -n ${still_possible:-} ]] && ! $still_possible; then
      # The state may have come between the two checks (a job completing just now).
      if "$@"; then return 0; fi
      fail "$what can no longer happen ($still_possible failed)"
    fi
    sleep 0.5
  done
  fail "timed out after ${seconds}s waiting for $what"
}

# slurm_job_alive JOB_STATE: whether a job in that state may still run, requeue or complete: any
# state but an end without a requeue (an unreadable state, from a loaded slurmctld, counts as
# alive). For still_possible: `job_alive() { slurm_job_alive "$(job_field JobState)"; }`.
slurm_job_alive() {
  case $1 in
    COMPLETED | CANCELLED | FAILED | TIMEOUT | OUT_OF_MEMORY | DEADLINE | BOOT_FAIL)
      echo "the job is $1" >&2
      return 1
      ;;
    *) return 0 ;;
  esac
}

# free_port_base LOW HIGH OFFSET... prints a base port
# in [LOW, HIGH) such that base + each OFFSET can be bound on 127.0.0.1 now, or fails after 50
# tries. Keep LOW..HIGH below Linux's ephemeral range (32768 and up), where any client socket on
# the machine may hold a port, and keep the ranges of tests that can run at once apart.
free_port_base() {
  local low=$1 high=$2
  shift 2
  local base attempt
  for attempt in {1..50}; do
    base=$((low + RANDOM % (high - low)))
    if python3 - "$base" "$@" <<'PY'
import socket, sys
base = int(sys.argv[1])
for offset in map(int, sys.argv[2:]):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", base + offset))
        except OSError:
            sys.exit(1)
PY
    then
      echo "$base"
      return 0
    fi
  done
  echo "free_port_base: no free ports found in $low-$high" >&2
  return 1
}

# slurm_release_requeued JOB [PREFIX...]: makes a requeued JOB eligible at once (Slurm's own delay
# is about two minutes), once the second it is called in has passed: slurmd revokes the ended
# run's job credential in whole seconds, and a restart whose credential is issued within that
# second is killed ("Killing non-startable batch JobId=...: Job credential revoked"). Call it once
# the first run has left its nodes. PREFIX runs scontrol elsewhere (a cluster node). A job that
# became eligible and started by itself meanwhile needs no release.
slurm_release_requeued() {
  local job=$1 called
  shift
  called=$(date +%s)
  next_second() { (($(date +%s) > called)); }
  wait_for 10 "the second after the first run ended" next_second
  "$@" scontrol update JobId="$job" StartTime=now 2>/dev/null ||
    [[ $("$@" scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[^ ]*') != JobState=PENDING ]] ||
    fail "cannot release the requeued job $job"
}
