#!/usr/bin/env bash
# Runs a GPU test program on the emulated GPU under each thread order (forward, reverse, a
# seeded shuffle: tests/emulation/kernel_threads.h) and requires the same bits of every result
# it compares (gpu_test_util.h's digests) from all three: a kernel whose results depend on the
# order its threads run in between barriers has a race.
#   thread_orders_agree.sh <test program> [gtest arguments...]
set -euo pipefail
program=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for order in forward reverse shuffle:20261205; do
  NF_EMU_THREAD_ORDER=$order NF_TEST_RESULT_DIGESTS="$work/$order" "$program" "$@" \
    >"$work/$order.log" 2>&1 || { tail -n 40 "$work/$order.log"; echo "failed under $order" >&2; exit 1; }
done
[[ -s "$work/forward" ]] || { echo "no result digests written by $program" >&2; exit 1; }
for order in reverse shuffle:20261205; do
  if ! diff "$work/forward" "$work/$order" >"$work/diff"; then
    echo "results differ between the forward and $order thread orders (a race):" >&2
    head -n 20 "$work/diff" >&2
    exit 1
  fi
done
echo "$(wc -l <"$work/forward") results identical under forward, reverse and shuffle:20261205"
