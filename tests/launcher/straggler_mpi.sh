#!/usr/bin/env bash
# The straggler report end to end: a dp 2 job of the tiny config logs a "stragglers" event every
# log interval (5 steps). With rank 1 slowed by 400 ms of its own work per step
# (NF_INJECT_SLOW_RANK=1:400), the first two intervals name it as flagged; without, nothing is
# flagged. The test's threshold, 1.5, leaves room for a loaded CI machine; the slowed rank
# computes at least 2.5 times what the other does (a step computes for 0.06 s in a Release
# build, 0.26 s under AddressSanitizer).
#
#   straggler_mpi.sh NF_LAUNCH CONFIG MPIRUN...
set -uo pipefail
nf_launch=$1 config=$2
shift 2
mpirun=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run() {  # NAME [ENV...]
  local name=$1
  shift
  env "$@" "${mpirun[@]}" -x NF_INJECT_SLOW_RANK -np 2 "$nf_launch" --config "$config" \
    --set train.train_iters=20 --set train.lr_schedule.warmup_iters=5 --set train.log_interval=5 \
    --set train.straggler_ratio=1.5 \
    --set checkpoint.save_at_end=false --run-dir "$dir/$name" >"$dir/$name.out" 2>&1 ||
    fail "the $name job failed: $(tail -n 5 "$dir/$name.out")"
  grep '"event":"stragglers"' "$dir/$name/log.jsonl"
}

slowed=$(run slowed NF_INJECT_SLOW_RANK=1:400) || exit 1
echo "$slowed"
(($(wc -l <<<"$slowed") == 4)) || fail "expected 4 reports (steps 5, 10, 15, 20)"
head -n 2 <<<"$slowed" | grep -c '"slowest":{"rank":1,' | grep -qx 2 ||
  fail "the first two intervals did not name rank 1 as the slowest"
head -n 2 <<<"$slowed" | grep -c '"flagged":true' | grep -qx 2 ||
  fail "the first two intervals did not flag the slowed rank"
grep -q "^straggler: slowest rank 1 on " "$dir/slowed.out" || fail "no console line for rank 1"

quiet=$(run quiet NF_INJECT_SLOW_RANK=) || exit 1
echo "$quiet"
(($(wc -l <<<"$quiet") == 4)) || fail "expected 4 reports on the quiet run"
if grep -q '"flagged":true' <<<"$quiet"; then fail "the quiet run flagged a straggler"; fi
echo "straggler report: rank 1 named in both first intervals; nothing flagged on the quiet run"
