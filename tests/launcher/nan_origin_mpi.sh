#!/usr/bin/env bash
# Where a NaN began, on a tp 2 x pp 2 job (launcher/nan_origin.h): a NaN injected into layer 2's
# fc1 weight on tensor-parallel rank 1 (NF_INJECT_NAN=3:2:1; layer 2 is the first of pipeline
# stage 1) makes step 3's gradients non-finite; with train.nan_origin every rank re-runs the
# step, and the job names world rank 3 (tp=1, pp=1), micro-batch 0, the forward of stage 1, and
# layer 2's fc1 GEMM: not rank 2, whose first NaN comes later (from rank 3's half through the
# sharded FFN LayerNorm's statistics), nor the ranks of stage 0, whose NaNs come in the backward:
# all four find one, and the causal order picks rank 3's.
#
#   nan_origin_mpi.sh NF_LAUNCH MPIRUN...
set -uo pipefail
nf_launch=$1
shift
mpirun=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$dir/job.out" >&2; exit 1; }

cat >"$dir/config.pbtxt" <<'CONFIG'
model { num_layers: 4 d_model: 32 num_heads: 2 ffn_dim: 64 vocab_size: 64 max_seq_len: 16
        dropout: 0.1 }
train { seq_len: 16 micro_batch_size: 2 global_batch_size: 8 train_iters: 6 log_interval: 1
        nan_origin: true optimizer { lr: 0.01 } lr_schedule { warmup_iters: 2 } }
parallel { tensor_parallel: 2 pipeline_parallel: 2 }
data { synthetic { branching: 2 } }
CONFIG

NF_INJECT_NAN=3:2:1 "${mpirun[@]}" -x NF_INJECT_NAN -np 4 "$nf_launch" \
  --config "$dir/config.pbtxt" --run-dir "$dir/run" >"$dir/job.out" 2>&1
status=$?
cat "$dir/job.out"
((status != 0)) || fail "the job ended with 0 after non-finite gradients in FP32"
origin="rank 3 (tp=1, dp=0, pp=1), micro-batch 0, forward of stage 1: layer 2 / fc1: Gemm wrote nan into C"
grep -qF "non-finite gradients at step 3: the first non-finite value: $origin" "$dir/job.out" ||
  fail "the console does not name the origin: $origin"
grep -qF "stopping (the first non-finite value: $origin" "$dir/job.out" ||
  fail "the stop message does not name the origin"
event=$(grep '"event":"nan_origin"' "$dir/run/log.jsonl") || fail "no nan_origin event in log.jsonl"
for field in '"step":3' '"found":true' '"rank":3' '"micro_batch":0' '"pass":"forward"' \
             '"stage":1' '"where":"layer 2 / fc1"' '"op":"Gemm"' '"value":"nan"' \
             '"ranks_found":4'; do
  grep -qF -- "$field" <<<"$event" || fail "the nan_origin event lacks $field: $event"
done
# The steps before the fault trained.
(($(grep -c '"loss"' "$dir/run/log.jsonl") >= 2)) || fail "steps 1 and 2 are not in log.jsonl"
echo "nan_origin_mpi: the injected NaN is named at rank 3, layer 2's fc1 GEMM, micro-batch 0"
