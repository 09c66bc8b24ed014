#!/usr/bin/env bash
# deploy/prometheus/normformer-targets.sh killed at every point of its run, as Slurm kills a job
# step (its whole process group): before each of the script's commands in turn, from the first
# to the last of its EXIT trap, a SIGTERM must leave nothing in the targets directory (no file,
# no hidden temporary); after a SIGKILL at the same point, whatever it left (the file, a
# temporary) must go with the next publisher of the same job on the node, and with --withdraw
# (what run-requeued.sh runs for each node at the end). A leftover is named in the failure.
#
#   targets_interrupted_test.sh REPO_ROOT
set -uo pipefail
repo=$1
targets=$repo/deploy/prometheus/normformer-targets.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v setsid >/dev/null || fail "setsid (util-linux) is missing"
dir=$tmp/targets
# BASH_ENV is read by the script's bash before its first line: this DEBUG trap counts the
# script's commands and, at the KILL_AT-th, records it and signals the script's process group.
cat >"$tmp/hook.sh" <<'EOF'
if [[ $0 == */normformer-targets.sh ]]; then
  unset BASH_ENV  # not for the processes it starts
  hook_count=0
  trap 'if ((++hook_count == KILL_AT)); then echo "$BASH_COMMAND" >"$KILL_LOG"; kill -s "$KILL_SIGNAL" 0; fi' DEBUG
fi
EOF
# publish [ENV...]: one publisher of job "run" on node1, wrapping a command that ends at once, in
# a process group of its own (setsid) so that the kill reaches only it and its children.
publish() {
  env "$@" BASH_ENV="$tmp/hook.sh" KILL_LOG="$tmp/killed" setsid -w \
    "$targets" --dir "$dir" --job run --ranks 2 --host node1 -- true >/dev/null 2>&1
} 2>/dev/null  # and the shell's "Killed" notes
left() { ls -A "$dir" 2>/dev/null | tr '\n' ' '; }

term_points=0 kill_points=0 temporaries=0
for signal in TERM KILL; do
  for ((n = 1; ; n++)); do
    rm -rf "$dir" "$tmp/killed"
    publish KILL_AT=$n KILL_SIGNAL=$signal
    [[ -f $tmp/killed ]] || break  # it ran to its end before the n-th command
    at=$(head -c 80 "$tmp/killed")
    if [[ $signal == TERM ]]; then
      ((++term_points))
      [[ -z $(left) ]] || fail "SIGTERM before command $n ('$at') left in the targets directory: $(left)"
      continue
    fi
    ((++kill_points))
    [[ -n $(ls -A "$dir" 2>/dev/null | grep -v '\.json$') ]] && ((++temporaries))
    # The removal at the end of the job (run-requeued.sh: once per node).
    "$targets" --withdraw --dir "$dir" --job run --host node1 ||
      fail "--withdraw exited $? after a SIGKILL before command $n ('$at')"
    [[ -z $(left) ]] || fail "SIGKILL before command $n ('$at'), then --withdraw, left: $(left)"
    # The next update on the node, after the same kill.
    rm -rf "$dir" "$tmp/killed"
    publish KILL_AT=$n KILL_SIGNAL=$signal
    publish KILL_AT=0 KILL_SIGNAL=$signal || fail "a publisher after a killed one exited $?"
    [[ -z $(left) ]] || fail "SIGKILL before command $n ('$at'), then a new publisher, left: $(left)"
  done
done
# The kills must have reached the update itself: some SIGKILL came between mktemp and the rename.
((term_points > 10 && kill_points == term_points)) ||
  fail "killed at $term_points points with SIGTERM and $kill_points with SIGKILL (too few, or differing)"
((temporaries > 0)) || fail "no SIGKILL left a temporary: the kills missed the update"
echo "targets_interrupted: SIGTERM at each of $term_points points left nothing; SIGKILL left a temporary" \
  "at $temporaries of them, removed with the rest by --withdraw and by the next publisher"
