#!/usr/bin/env bash
# Runs a command that must fail and checks how: its exit status, texts its output (stdout and
# stderr together) must contain, and a limit on the seconds it may take. Used for MPI jobs
# that are meant to end badly (a refused topology, a watchdog abort), which GoogleTest cannot
# check from inside the job.
#
#   expect_failure.sh [--status N|nonzero] [--max-seconds S] [--expect TEXT]...
#                     [--expect-once TEXT]... -- COMMAND [ARG]...
#
# --expect TEXT       TEXT appears in the output (fixed string)
# --expect-once TEXT  TEXT appears on exactly one line
set -uo pipefail

status=nonzero
max_seconds=
expects=()
once=()
while (($# > 0)); do
  case "$1" in
    --status) status=$2; shift 2 ;;
    --max-seconds) max_seconds=$2; shift 2 ;;
    --expect) expects+=("$2"); shift 2 ;;
    --expect-once) once+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "expect_failure.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
(($# > 0)) || { echo "expect_failure.sh: no command after --" >&2; exit 2; }

output=$(mktemp)
trap 'rm -f "$output"' EXIT
start=$(date +%s.%N)
"$@" >"$output" 2>&1
code=$?
end=$(date +%s.%N)
elapsed=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }')

echo "---- output of: $*"
cat "$output"
echo "---- exit status $code after ${elapsed}s"

failed=0
if [[ "$status" == nonzero ]]; then
  ((code != 0)) || { echo "FAIL: expected a non-zero exit status, got 0"; failed=1; }
elif ((code != status)); then
  echo "FAIL: expected exit status $status, got $code"
  failed=1
fi
for text in "${expects[@]}"; do
  grep -qF -- "$text" "$output" || { echo "FAIL: output lacks: $text"; failed=1; }
done
for text in "${once[@]}"; do
  n=$(grep -cF -- "$text" "$output")
  ((n == 1)) || { echo "FAIL: expected exactly one line with: $text (found $n)"; failed=1; }
done
if [[ -n "$max_seconds" ]] &&
  awk -v e="$elapsed" -v m="$max_seconds" 'BEGIN { exit !(e > m) }'; then
  echo "FAIL: took ${elapsed}s, more than ${max_seconds}s"
  failed=1
fi
((failed == 0)) && echo "PASS"
exit "$failed"
