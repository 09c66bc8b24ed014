# Sourced by the tests that start servers: free_port_base LOW HIGH OFFSET... prints a base port
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
