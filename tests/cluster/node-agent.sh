#!/usr/bin/env bash
# Open MPI's rsh launcher runs this instead of ssh (--mca plm_rsh_agent) to start its daemon on
# a node of the test cluster: node-agent.sh HOST COMMAND... runs COMMAND, a shell command line
# as ssh would take it, on HOST (tests/cluster/in-node.sh).
#
# Like ssh with ServerAliveInterval=2 and ServerAliveCountMax=5, it gives up on a node that
# stops answering: every 2 s it checks that HOST still refuses a TCP connection on port 9 (an
# answer, through the network the nodes share), and after 5 checks in a row without one
# (~10-20 s) exits with ssh's 255, which is how mpirun learns that a node is lost. (The daemon is
# a process on this same machine, so without the check mpirun would wait for it through a dead
# link for the whole of TCP's retransmission timeout.) The tests keep the collective watchdog's
# deadline shorter, so the ranks report the lost peers first.
host=$1
shift
"$(dirname "$0")/in-node.sh" "$host" sh -c "$*" &
daemon=$!
answers() {
  local reply
  reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/9"' "$host" 2>&1) || true
  [[ $reply == *refused* ]]
}
silent=0
while kill -0 "$daemon" 2>/dev/null; do
  sleep 2
  if answers; then
    silent=0
  elif ((++silent == 5)); then
    echo "node-agent: $host stopped answering; giving up on it" >&2
    exit 255
  fi
done
wait "$daemon"
