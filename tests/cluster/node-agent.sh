#!/usr/bin/env bash
# Open MPI's rsh launcher runs this instead of ssh (--mca plm_rsh_agent) to start its daemon on
# a node of the test cluster: node-agent.sh HOST COMMAND... runs COMMAND, a shell command line
# as ssh would take it, on HOST (tests/cluster/in-node.sh).
host=$1
shift
exec "$(dirname "$0")/in-node.sh" "$host" sh -c "$*"
