#!/usr/bin/env bash
# in-node.sh HOST COMMAND...: runs COMMAND on HOST, a node of the test cluster
# (tests/cluster/cluster.sh) that CLUSTER_DIR names: inside its network namespace (and so with
# its /etc/hosts), in a UTS namespace of its own with HOST as hostname. With CLUSTER_NODE_LOCAL
# set to a path, the command sees there a folder of HOST's own (PATH.HOST, bind-mounted in the
# mount namespace `ip netns exec` makes): a node-local disk, where every other path is shared.
set -euo pipefail
host=$1
shift
ns=$(awk -v host="$host" '$1 == host || $2 == host { print $1 }' "${CLUSTER_DIR:?}/nodes")
[[ -n $ns ]] || { echo "in-node: $host is not a node of $CLUSTER_DIR/nodes" >&2; exit 1; }
exec ip netns exec "$ns" unshare --uts sh -c '
  hostname "$0" || exit 1
  if [ -n "${CLUSTER_NODE_LOCAL:-}" ]; then
    mkdir -p "$CLUSTER_NODE_LOCAL" "$CLUSTER_NODE_LOCAL.$0" &&
      mount --bind "$CLUSTER_NODE_LOCAL.$0" "$CLUSTER_NODE_LOCAL" || exit 1
  fi
  exec "$@"' "$ns" "$@"
