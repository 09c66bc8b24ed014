# Helpers for the shell tests that start servers and wait for them; sourced after the test has
# defined `fail MESSAGE` (prints MESSAGE and the test's logs, exits 1).

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every half second until it succeeds, or fails
# the test after SECONDS, or at once when the process `watched_pid` (if set) has ended.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  for ((i = 0; i < seconds * 2; i++)); do
    if "$@"; then return 0; fi
    if [[ -n ${watched_pid:-} ]] && ! kill -0 "$watched_pid" 2>/dev/null; then
      fail "process $watched_pid ended while waiting for $what"
    fi
    sleep 0.5
  done
  fail "timed out after ${seconds}s waiting for $what"
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
