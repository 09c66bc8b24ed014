#!/usr/bin/env bash
# A spike rollback on every rank of a tp 2 x pp 2 job: with a gradient spike injected at step 7
# (NF_INJECT_GRAD_SPIKE) and train.spike.action ROLLBACK, every rank reloads the step-4
# checkpoint and skips the samples of steps 5-7; steps 8-12 and the final checkpoint then equal,
# bit for bit, those of a job that skipped the same samples from the start (train.skip_samples).
#
#   spike_rollback_mpi.sh NF_LAUNCH MPIRUN...
set -euo pipefail
nf_launch=$1
shift
mpirun=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 4 layers, d_model 32, dropout on (its masks are keyed by sample index, so they must follow
# the skip too); 8 samples of 16 tokens per step. The detector watches the gradient norm with a
# limit of at least 26 x its median: only the injected x1000 is a spike.
config() {  # EXTRA_TRAIN_FIELDS
  cat <<CONFIG
model { num_layers: 4 d_model: 32 num_heads: 2 ffn_dim: 64 vocab_size: 64 max_seq_len: 16
        dropout: 0.1 }
train { seq_len: 16 micro_batch_size: 2 global_batch_size: 8 train_iters: 12 log_interval: 4
        optimizer { lr: 0.01 } lr_schedule { warmup_iters: 2 }
        spike { action: ROLLBACK window: 4 warmup_steps: 0 loss_threshold: 0
                grad_norm_threshold: 50 min_relative_spread: 0.5 }
        $1 }
parallel { tensor_parallel: 2 pipeline_parallel: 2 }
checkpoint { save_interval: 4 keep_last: 10 }
data { synthetic { branching: 2 } }
CONFIG
}
config "" >"$dir/rolled.pbtxt"
config "skip_samples { begin: 32 end: 56 }" >"$dir/skipping.pbtxt"

NF_INJECT_GRAD_SPIKE=7 "${mpirun[@]}" -x NF_INJECT_GRAD_SPIKE -np 4 "$nf_launch" \
  --config "$dir/rolled.pbtxt" --run-dir "$dir/rolled" >"$dir/rolled.out"
"${mpirun[@]}" -np 4 "$nf_launch" --config "$dir/skipping.pbtxt" --run-dir "$dir/skipping" \
  >"$dir/skipping.out"
cat "$dir/rolled.out"

fail() { echo "FAIL: $*" >&2; exit 1; }
grep -q "after the spike at step 7: samples \[32, 56) are skipped" "$dir/rolled.out" ||
  fail "the job did not roll back from step 7 to step 4"
(($(grep -c '"event":"rollback"' "$dir/rolled/log.jsonl") == 1)) || fail "not one rollback event"
# Steps 8-12: every field but the wall time.
steps() { grep '"loss"' "$1/log.jsonl" | tail -n 5 | sed 's/,"seconds":.*//'; }
diff <(steps "$dir/rolled") <(steps "$dir/skipping") || fail "steps 8-12 differ"
for shard in "$dir"/skipping/checkpoints/iter_0000012/*.shard; do
  cmp "$shard" "$dir/rolled/checkpoints/iter_0000012/${shard##*/}" ||
    fail "${shard##*/} of the final checkpoints differs"
done
echo "the rolled-back job's steps 8-12 and final checkpoint equal the skipping job's, bit for bit"
