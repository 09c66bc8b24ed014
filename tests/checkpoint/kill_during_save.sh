#!/usr/bin/env bash
# Fault test: a rank killed (SIGKILL) at random moments of a run that saves a checkpoint every
# step never leaves a broken `latest`. Each trial starts `mpirun -np 2 nf-launch` (pipeline
# parallel 2, checkpoint.save_interval=1), kills a random rank after a random delay, then checks
#   - `nf-ckpt verify RUN/checkpoints` passes: latest names a complete checkpoint whose every
#     piece reads back with its checksum (or no checkpoint exists yet, if the kill came first);
#   - a rerun of the same command resumes from it and trains one more step.
# The seed of every trial is printed, so a failing trial can be replayed with NF_FAULT_SEED.
#
#   kill_during_save.sh NF_LAUNCH NF_CKPT CONFIG TRIALS MPIRUN...
set -uo pipefail
nf_launch=$1 nf_ckpt=$2 config=$3 trials=$4
shift 4
mpirun=("$@")
base_seed=${NF_FAULT_SEED:-$(date +%s)}
echo "kill_during_save: base seed $base_seed ($trials trials)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

for ((trial = 1; trial <= trials; ++trial)); do
  seed=$((base_seed + trial))
  RANDOM=$seed
  rank=$((RANDOM % 2))
  delay_ms=$((600 + RANDOM % 2400))
  run="$work/run$trial"
  args=(--config "$config" --set parallel.pipeline_parallel=2 --set checkpoint.save_interval=1
        --set checkpoint.keep_last=2 --set train.lr_schedule.warmup_iters=1
        --set train.train_iters=100000 --run-dir "$run")
  "${mpirun[@]}" -np 2 "$nf_launch" "${args[@]}" >"$work/out$trial" 2>&1 &
  job=$!
  sleep "$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
  victim=
  for pid in $(pgrep -P "$job"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$rank" >/dev/null; then
      victim=$pid
    fi
  done
  [[ -n "$victim" ]] && kill -9 "$victim"
  wait "$job"
  latest="(none)"
  [[ -f "$run/checkpoints/latest" ]] && latest=$(cat "$run/checkpoints/latest")
  line="trial $trial seed $seed: SIGKILL to rank $rank after ${delay_ms} ms; latest $latest"
  # A staging directory left behind means the kill interrupted a save.
  compgen -G "$run/checkpoints/iter_*.tmp" >/dev/null && line="$line (a save was interrupted)"
  if [[ "$latest" == "(none)" ]]; then
    echo "$line (killed before the first save)"
    continue
  fi
  if ! verify=$("$nf_ckpt" verify "$run/checkpoints" 2>&1); then
    echo "$line: VERIFY FAILED: $verify"
    failures=$((failures + 1))
    continue
  fi
  step=$((10#${latest#iter_}))
  if ! "${mpirun[@]}" -np 2 "$nf_launch" "${args[@]}" --set train.train_iters=$((step + 1)) \
      >"$work/resume$trial" 2>&1 || ! grep -q "resumed from .*$latest at step $step" "$work/resume$trial"; then
    echo "$line: RESUME FAILED:"
    cat "$work/resume$trial"
    failures=$((failures + 1))
    continue
  fi
  echo "$line: verified, resumed to step $((step + 1))"
done
echo "kill_during_save: $failures of $trials trials failed"
((failures == 0))
