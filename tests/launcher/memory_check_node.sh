#!/usr/bin/env bash
# The memory check adds up the ranks of a node: two ranks whose estimates each fit in the
# host's available memory, but not together, are refused (exit 2, said once, no run
# directory), where one rank alone would pass. The model is sized from this machine's
# MemAvailable so that one rank's estimate is about 65% of it: a margin of 35% for one rank
# and 30% for two against other tests' memory coming and going meanwhile.
#
#   memory_check_node.sh NF_LAUNCH CONFIG RUN_DIR MPIRUN...
set -euo pipefail
nf_launch=$1 config=$2 run_dir=$3
shift 3
rm -rf "$run_dir"

# No checkpoint, so no snapshot: rank 1 (data-parallel rank 1) needs what rank 0 needs.
shape=(--set model.d_model=2048 --set model.ffn_dim=8192 --set model.num_heads=16
  --set checkpoint.save_at_end=false)
# The "total" column (GiB, the last) of --dry-run's row for pipeline rank 0.
estimate_gib() {
  "$nf_launch" --config "$config" --dry-run --world-size 2 "${shape[@]}" \
    --set "model.num_layers=$1" | awk -F'|' '$2 ~ /^ 0 $/ { sub(/ GiB/, "", $(NF - 1)); print $(NF - 1) + 0 }'
}
available_gib=$(awk '/^MemAvailable:/ { print $2 / 1048576 }' /proc/meminfo)
one=$(estimate_gib 1)
two=$(estimate_gib 2)
layers=$(awk -v a="$available_gib" -v one="$one" -v two="$two" \
  'BEGIN { per = two - one; n = int((0.65 * a - one) / per) + 1; print (n < 1 ? 1 : n) }')
estimate=$(estimate_gib "$layers")
echo "MemAvailable ${available_gib} GiB; ${layers} layers: ${estimate} GiB per rank"
awk -v e="$estimate" -v a="$available_gib" 'BEGIN { exit !(e < 0.8 * a && 2 * e > 1.2 * a) }' || {
  echo "memory_check_node.sh: could not size a model between 60% and 80% of MemAvailable" >&2
  exit 1
}

"$(dirname "$0")/../parallel/expect_failure.sh" --status 2 --max-seconds 60 \
  --expect-once "the 2 ranks of this run on it need an estimated" \
  --expect "(MemAvailable in /proc/meminfo)" \
  -- "$@" -np 2 "$nf_launch" --config "$config" --run-dir "$run_dir" "${shape[@]}" \
  --set "model.num_layers=$layers"
if [[ -e $run_dir ]]; then
  echo "memory_check_node.sh: the refused run left $run_dir behind" >&2
  exit 1
fi
echo "refused on two ranks as expected"
