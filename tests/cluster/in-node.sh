#!/usr/bin/env bash
# in-node.sh HOST COMMAND...: runs COMMAND on HOST, a node of the test cluster
# (tests/cluster/cluster.sh) that CLUSTER_DIR names: in its network namespace, with HOST as
# hostname (a UTS namespace of its own) and the cluster's /etc/hosts (bind-mounted in a mount
# namespace of its own, so the machine's stays as it is). With CLUSTER_NODE_LOCAL set to a
# path, the command sees there a folder of HOST's own (PATH.HOST): a node-local disk, where
# every other path is shared. (`nsenter --net`, not `ip netns exec`: the latter mounts a /sys of
# the namespace's own, without the cgroup file systems slurmd needs.)
set -euo pipefail
host=$1
shift
ns=$(awk -v host="$host" '$1 == host || $2 == host { print $1 }' "${CLUSTER_DIR:?}/nodes")
[[ -n $ns ]] || { echo "in-node: $host is not a node of $CLUSTER_DIR/nodes" >&2; exit 1; }
exec nsenter --net="/run/netns/$ns" unshare --mount --uts sh -c '
  hostname "$0" && mount --bind "/etc/netns/$0/hosts" /etc/hosts || exit 1
  if [ -n "${CLUSTER_NODE_LOCAL:-}" ]; then
    mkdir -p "$CLUSTER_NODE_LOCAL" "$CLUSTER_NODE_LOCAL.$0" &&
      mount --bind "$CLUSTER_NODE_LOCAL.$0" "$CLUSTER_NODE_LOCAL" || exit 1
  fi
  exec "$@"' "$ns" "$@"
