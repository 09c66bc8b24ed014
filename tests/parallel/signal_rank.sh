#!/usr/bin/env bash
# Runs an MPI job, and once its log file has `lines` step records (the job is well into training),
# sends `signal` to the process of world rank `rank`, as a hung (STOP) or crashed (KILL) node
# would behave; then waits for the job and exits with its status. The rank's process is found by
# the OMPI_COMM_WORLD_RANK in its environment. A stopped process is killed when the job is
# over, so that nothing outlives the test. LOG's directory (the run directory) is deleted
# first, so that every run starts fresh.
#
#   signal_rank.sh SIGNAL RANK LOG LINES -- COMMAND [ARG]...
set -uo pipefail

signal=$1 rank=$2 log=$3 lines=$4
shift 4
[[ "${1:-}" == "--" ]] && shift
rm -rf "$(dirname "$log")"

"$@" &
job=$!
victim=
for _ in $(seq 1 600); do
  if [[ -f "$log" ]] && (($(grep -c '"loss"' "$log") >= lines)); then
    for pid in $(pgrep -P "$job") $(pgrep -g "$(ps -o pgid= "$job" | tr -d ' ')"); do
      if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$rank" >/dev/null; then
        victim=$pid
      fi
    done
    break
  fi
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if [[ -z "$victim" ]]; then
  echo "signal_rank.sh: rank $rank never got going (no process, or $log stayed short)" >&2
  kill -9 "$job" 2>/dev/null
  exit 99
fi
echo "signal_rank.sh: sending SIG$signal to rank $rank (pid $victim)"
kill "-$signal" "$victim"
wait "$job"
code=$?
kill -9 "$victim" 2>/dev/null
exit "$code"
