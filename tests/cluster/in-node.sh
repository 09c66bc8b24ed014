#!/usr/bin/env bash
# in-node.sh HOST COMMAND...: runs COMMAND on HOST, a node of the test cluster
# (tests/cluster/cluster.sh) that CLUSTER_DIR names: inside its network namespace (and so with
# its /etc/hosts), in a UTS namespace of its own with HOST as hostname.
set -euo pipefail
host=$1
shift
ns=$(awk -v host="$host" '$1 == host || $2 == host { print $1 }' "${CLUSTER_DIR:?}/nodes")
[[ -n $ns ]] || { echo "in-node: $host is not a node of $CLUSTER_DIR/nodes" >&2; exit 1; }
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
