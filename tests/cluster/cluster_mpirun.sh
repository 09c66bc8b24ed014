# mpirun across the test cluster (tests/cluster/cluster.sh, after cluster_up): sourced by the
# cluster tests. cluster_mpirun_command MAP_BY SLOTS sets the array CLUSTER_MPIRUN to an mpirun
# command line that starts on node 0 and reaches the other nodes through node-agent.sh (Open
# MPI's rsh launcher, as it would through ssh), SLOTS ranks per node placed by MAP_BY (slot:
# consecutive ranks on a node; node: round robin over the nodes). Transport: TCP only (`btl
# tcp,self`, no shared memory even within a node) on the cluster's subnet, for the launcher's
# own connections (oob) as for MPI's messages. TCP keepalive on the launcher's connections
# tells mpirun within ~15 s that a node is unreachable (Open MPI's default waits 300 s before the
# first probe, then 9 x 20 s): without it, a job whose ranks aborted would wait minutes for the
# daemon of a node that is gone.
cluster_mpirun_command() {
  local map_by=$1 slots=$2
  printf "%s slots=$slots\n" "${CLUSTER_NODES[@]}" >"$CLUSTER_DIR/hostfile"
  export CLUSTER_DIR
  CLUSTER_MPIRUN=("$CLUSTER_SCRIPTS/in-node.sh" "${CLUSTER_NODES[0]}"
    mpirun --allow-run-as-root --hostfile "$CLUSTER_DIR/hostfile" --map-by "$map_by"
    --mca plm_rsh_agent "$CLUSTER_SCRIPTS/node-agent.sh"
    --mca btl tcp,self --mca btl_tcp_if_include "$CLUSTER_SUBNET"
    --mca oob_tcp_if_include "$CLUSTER_SUBNET" --mca oob_tcp_keepalive_time 5
    --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 -x NF_NUM_THREADS)
}

# cluster_link_bytes NODE: bytes node NODE has sent and received on its network link (eth0).
cluster_link_bytes() {
  local ns=${CLUSTER_NODES[$1]}
  echo $(( $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes) +
           $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes) ))
}
