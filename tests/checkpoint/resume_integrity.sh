#!/usr/bin/env bash
# nf-launch as a user meets it when something is wrong with the checkpoints of a run:
#   1. one rank's shard is corrupt: the job fails naming it, and no rank prints "resumed";
#   2. `latest` was deleted: the run resumes from the newest checkpoint that verifies, with a
#      warning naming both, instead of starting again from step 0; a changed data setting
#      (the seed) resumes with a warning naming it, an unchanged config without one;
#   3. an fp16 run blowing up (lr 1e6): no checkpoint is written while its steps are skipped,
#      every one left verifies, and the run's last word names one that does (or none).
#
#   resume_integrity.sh NF_LAUNCH NF_CKPT CONFIG MPIRUN...
set -uo pipefail
nf_launch=$1 nf_ckpt=$2 config=$3
shift 3
mpirun=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*" >&2
  for log in "$work"/*.log; do echo "---- $log"; cat "$log"; done >&2
  exit 1
}
# count TEXT FILE: lines of FILE containing TEXT (fixed string), reading all of it.
count() { grep -cF -- "$1" "$2" || true; }

run=$work/run
two_stages=(--config "$config" --set parallel.pipeline_parallel=2 --set train.train_iters=6
  --set train.lr_schedule.warmup_iters=2
  --set checkpoint.save_interval=3 --set train.eval_interval=0 --run-dir "$run")
"${mpirun[@]}" -np 2 "$nf_launch" "${two_stages[@]}" >"$work/first.log" 2>&1 ||
  fail "the first 2-stage run failed"
ckpt=$run/checkpoints/iter_0000006
[[ -f $ckpt/rank_00001.shard ]] || fail "no shard of rank 1 in $ckpt"

# 1. Flip one byte in the middle of pipeline rank 1's shard and extend the run.
cp "$ckpt/rank_00001.shard" "$work/shard.good"
size=$(stat -c %s "$ckpt/rank_00001.shard")
python3 - "$ckpt/rank_00001.shard" "$((size / 2))" <<'PY'
import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x40]))
PY
"${mpirun[@]}" -np 2 "$nf_launch" "${two_stages[@]}" --set train.train_iters=9 \
  >"$work/corrupt.log" 2>&1 && fail "a run over a corrupt shard succeeded"
[[ $(count "resumed from" "$work/corrupt.log") == 0 ]] || fail "'resumed' printed although a rank failed to load"
[[ $(count "fails its checksum" "$work/corrupt.log") -ge 1 ]] || fail "the corrupt shard was not named"
[[ $(count "rank 1 could not load its part" "$work/corrupt.log") -ge 1 ]] ||
  fail "rank 0 did not name the rank that failed"
cp "$work/shard.good" "$ckpt/rank_00001.shard"

# 2. Without `latest`: the newest checkpoint that verifies, with a warning naming both.
rm "$run/checkpoints/latest"
"${mpirun[@]}" -np 2 "$nf_launch" "${two_stages[@]}" --set train.train_iters=9 \
  >"$work/no_latest.log" 2>&1 || fail "the run without latest failed"
[[ $(count "$run/checkpoints/latest is missing; resuming from $ckpt" "$work/no_latest.log") == 1 ]] ||
  fail "no warning naming the missing latest and the checkpoint taken"
[[ $(count "resumed from $ckpt at step 6" "$work/no_latest.log") == 1 ]] ||
  fail "'resumed from ... at step 6' not printed exactly once"
grep -q '"step":7,' "$run/log.jsonl" || fail "the resumed run did not continue at step 7"
[[ $(count "warning: resuming with" "$work/no_latest.log") == 0 ]] ||
  fail "a warning about changed data settings although none changed"
# Another seed reshuffles the data: resumed, but not silently.
"${mpirun[@]}" -np 2 "$nf_launch" "${two_stages[@]}" --set train.train_iters=10 \
  --set train.seed=7 >"$work/seed.log" 2>&1 || fail "the run with another seed failed"
[[ $(count "warning: resuming with train.seed " "$work/seed.log") == 1 ]] ||
  fail "no warning naming the changed train.seed"

# 3. The finding's command: fp16 with lr 1e6. Step 1's update (lr 1e6 / 30 in warmup) is
# finite; from step 2 every step is skipped. No interval save happens during the skipped steps
# (retention would rotate the earlier ones away), every checkpoint left verifies, and the
# run's last word names one that does or none.
fp16=$work/fp16
"$nf_launch" --config "$config" --set train.precision=FP16 --set train.optimizer.lr=1e6 \
  --set train.train_iters=30 --set checkpoint.save_interval=5 --set train.eval_interval=0 \
  --run-dir "$fp16" >"$work/fp16.log" 2>&1
echo "fp16 run: exit status $?"
[[ $(count "checkpoint of step 5 deferred: the step was skipped" "$work/fp16.log") == 1 ]] ||
  fail "the interval save of a skipped step was not deferred"
checkpoints=$(find "$fp16/checkpoints" -maxdepth 1 -name 'iter_*' -type d 2>/dev/null | sort)
for dir in $checkpoints; do
  "$nf_ckpt" verify "$dir" >>"$work/verify.log" 2>&1 || fail "$dir does not verify"
done
named=$(grep -oE 'the last good checkpoint is [^ ]+' "$work/fp16.log" | tail -n 1 | awk '{print $NF}')
[[ -n $named ]] || fail "the fp16 run did not end naming its last good checkpoint"
if [[ $named != "(none:" ]]; then
  "$nf_ckpt" verify "$named" >>"$work/verify.log" 2>&1 || fail "the named checkpoint $named does not verify"
fi
echo "resume_integrity: all checks passed ($(echo $checkpoints | wc -w) fp16 checkpoints verified)"
