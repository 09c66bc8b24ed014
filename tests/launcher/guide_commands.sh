#!/usr/bin/env bash
# Runs every ```bash block of a document (docs/guide.md by default, or docs/operations.md), in
# order, in a scratch folder that sees this build as build/ and the repository's deploy/ and
# scripts/, so the commands are known to work as written. A failing block fails the test,
# showing the block and its output.
#
#   guide_commands.sh REPO_ROOT BUILD_DIR [DOC MIN_BLOCKS]
set -euo pipefail
repo=$1 build=$2 doc=${3:-docs/guide.md} min_blocks=${4:-8}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ln -s "$build" "$dir/build"
ln -s "$repo/deploy" "$dir/deploy"
ln -s "$repo/scripts" "$dir/scripts"
ln -s "$repo/.venv" "$dir/.venv"  # transformers, for the Hugging Face section
mkdir -p "$dir/corpora/guide" "$dir/runs"
# The guide's mpirun lines are written for a user; CI containers run as root and without
# ptrace between processes.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# The multi-node section's nodes, node0 and node1: a test cluster of network namespaces
# (tests/cluster/cluster.sh). Its mpirun with a --hostfile starts on node0 and reaches node1
# through node-agent.sh, as it would through ssh; every other mpirun is Open MPI's own.
source "$repo/tests/cluster/cluster.sh"
cluster_up 2 node
trap 'cluster_down; rm -rf "$dir"' EXIT
export CLUSTER_DIR
mkdir -p "$dir/bin"
real_mpirun=$(command -v mpirun)
cat >"$dir/bin/mpirun" <<EOF
#!/usr/bin/env bash
case " \$* " in
  *" --hostfile "*)
    exec "$CLUSTER_SCRIPTS/in-node.sh" node0 "$real_mpirun" \\
      --mca plm_rsh_agent "$CLUSTER_SCRIPTS/node-agent.sh" "\$@" ;;
esac
exec "$real_mpirun" "\$@"
EOF
chmod +x "$dir/bin/mpirun"
export PATH=$dir/bin:$PATH

# Split the guide's bash blocks into block-N.sh files.
awk -v out="$dir/block" '
  /^```bash$/ { n++; inside = 1; file = sprintf("%s-%02d.sh", out, n); next }
  /^```/ && inside { inside = 0; close(file); next }
  inside { print > file }' "$repo/$doc"
blocks=("$dir"/block-*.sh)
((${#blocks[@]} >= min_blocks)) ||
  { echo "guide_commands: found only ${#blocks[@]} bash blocks in $doc" >&2; exit 1; }
for block in "${blocks[@]}"; do
  echo "== $(basename "$block")"
  sed 's/^/  $ /' "$block"
  if ! (cd "$dir" && bash -euo pipefail "$block") >"$block.out" 2>&1; then
    cat "$block.out"
    echo "guide_commands: $(basename "$block") of $doc failed" >&2
    exit 1
  fi
  tail -n 3 "$block.out"
done
echo "guide_commands: all ${#blocks[@]} blocks of $doc ran"
