# A small cluster on one machine, for the multi-node tests: N "nodes", each a network namespace
# with its own loopback, one Ethernet link (a veth pair) to a bridge, an address 10.T.0.(i+1)/24
# and a hostname, the bridge itself in a namespace of its own, so nothing of the host's network
# is touched. Sourced by the tests (as root: it needs only `ip` and `unshare`).
#
#   source tests/cluster/cluster.sh
#   cluster_up 2            # nodes nf<tag>n0, nf<tag>n1; fails the test if it cannot
#   cluster_up 2 node       # nodes node0, node1 (names a user would write; one such cluster
#                           # at a time on the machine)
#   cluster_exec 0 hostname # runs a command on node 0: prints nf<tag>n0
#   cluster_down            # also run by the EXIT trap cluster_up installs
#
# After cluster_up: CLUSTER_DIR (scratch folder: the hostfile, the node map for the launcher's
# agent), CLUSTER_NODES (the hostnames, in order), CLUSTER_ADDRS (their addresses),
# CLUSTER_SUBNET (for Open MPI's *_if_include). Hostnames resolve on every node through its
# /etc/hosts (tests/cluster/in-node.sh mounts /etc/netns/NAME/hosts there). A hostname is set per
# process: `unshare --uts` gives each command entered into a node a UTS namespace of its own
# named after the node, which its children inherit.
#
# Namespaces, links and /etc/netns entries carry a tag made of the test's process id, so tests
# running at once do not collide, and cluster_down removes exactly what cluster_up made, also
# after a failure part-way (each piece is recorded as it is made).

CLUSTER_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cluster_up() {
  local nodes=$1
  CLUSTER_TAG=$(( $$ % 100000 ))
  local prefix=${2:-nf${CLUSTER_TAG}n}
  CLUSTER_DIR=$(mktemp -d)
  CLUSTER_NODES=() CLUSTER_ADDRS=()
  # Second octet from the tag: two clusters at once get different subnets (collisions need two
  # tests whose pids agree mod 200, and only matter if both clusters are up together).
  local octet=$(( 20 + CLUSTER_TAG % 200 ))
  CLUSTER_SUBNET=10.$octet.0.0/24
  trap cluster_down EXIT
  local switch=nf${CLUSTER_TAG}sw
  ip netns add "$switch" && echo "netns $switch" >>"$CLUSTER_DIR/made" ||
    { echo "cluster: cannot create network namespaces (root and iproute2 needed)" >&2; return 1; }
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  ip -n "$switch" link set lo up
  local i hosts=""
  for ((i = 0; i < nodes; i++)); do
    CLUSTER_NODES+=("$prefix$i")
    CLUSTER_ADDRS+=("10.$octet.0.$((i + 1))")
    hosts+="${CLUSTER_ADDRS[i]} ${CLUSTER_NODES[i]}"$'\n'
  done
  for ((i = 0; i < nodes; i++)); do
    local ns=${CLUSTER_NODES[i]}
    ip netns add "$ns" && echo "netns $ns" >>"$CLUSTER_DIR/made"
    mkdir -p "/etc/netns/$ns" && echo "etc $ns" >>"$CLUSTER_DIR/made"
    printf '127.0.0.1 localhost\n%s' "$hosts" >"/etc/netns/$ns/hosts"
    # The node's end is eth0 in its namespace; the bridge's end is named after the node.
    ip link add "v$ns" netns "$switch" type veth peer name eth0 netns "$ns"
    ip -n "$switch" link set "v$ns" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "${CLUSTER_ADDRS[i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    echo "${CLUSTER_NODES[i]} ${CLUSTER_ADDRS[i]}" >>"$CLUSTER_DIR/nodes"
  done
  # Node 0 reaches every other before the test starts, a broken setup failing here with a
  # clear message instead of as a launcher timeout: a TCP connection to a closed port is
  # refused at once by a reachable node (no ping on a minimal Debian).
  local answer
  for ((i = 1; i < nodes; i++)); do
    answer=$(cluster_exec 0 timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/9"' "${CLUSTER_NODES[i]}" 2>&1) || true
    [[ $answer == *refused* ]] ||
      { echo "cluster: node 0 cannot reach ${CLUSTER_NODES[i]}: $answer" >&2; return 1; }
  done
}

# cluster_exec NODE COMMAND...: runs COMMAND on node NODE (an index), hostname set.
cluster_exec() {
  local node=${CLUSTER_NODES[$1]}
  shift
  CLUSTER_DIR=$CLUSTER_DIR "$CLUSTER_SCRIPTS/in-node.sh" "$node" "$@"
}

# cluster_node_of HOST: the index of the node named HOST (or with address HOST).
cluster_node_of() {
  local i
  for ((i = 0; i < ${#CLUSTER_NODES[@]}; i++)); do
    if [[ $1 == "${CLUSTER_NODES[i]}" || $1 == "${CLUSTER_ADDRS[i]}" ]]; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

# Kills every process still in a node's network namespace, then removes what cluster_up made.
cluster_down() {
  [[ -n ${CLUSTER_DIR:-} && -f $CLUSTER_DIR/made ]] || return 0
  local kind name pid
  while read -r kind name; do
    [[ $kind == netns ]] || continue
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done <"$CLUSTER_DIR/made"
  while read -r kind name; do
    case $kind in
      netns) ip netns del "$name" 2>/dev/null || true ;;
      etc) rm -rf "/etc/netns/$name" ;;
    esac
  done <"$CLUSTER_DIR/made"
  rm -rf "$CLUSTER_DIR"
  CLUSTER_DIR=
}
