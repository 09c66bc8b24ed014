#!/usr/bin/env bash
# Publishes this node's normformer ranks to Prometheus (file-based service discovery) for as
# long as this script runs, and withdraws them when it ends.
#
#   normformer-targets.sh [options] -- COMMAND...   run COMMAND (e.g. nf-launch), publish meanwhile
#   normformer-targets.sh [options]                 publish until SIGTERM/SIGINT (a background
#                                                   Slurm step: srun --ntasks-per-node=1 --overlap)
#   normformer-targets.sh --withdraw [options]      remove what a publisher of JOB on HOST left
#                                                   (its file and temporaries; for a killed one)
# Options (defaults in brackets):
#   --dir DIR          where Prometheus reads targets [/etc/prometheus/normformer-targets]
#   --job NAME         the run's job label, = monitoring.job [basename of $RUN_DIR]
#   --port-base N      monitoring.port_base [9600]
#   --ranks N          ranks on this node [$SLURM_NTASKS_PER_NODE]
#   --host HOST        name Prometheus reaches this node by [$(hostname)]
#   --dcgm-port P      also publish this node's DCGM exporter (label exporter="dcgm") [none]
#
# Writes DIR/JOB-HOST.json: a target host:port_base+L for each local rank L = 0..ranks-1,
# labelled job, node and local_rank. The file is written to a temporary name (DIR/.JOB-HOST.XXXXXX,
# created new by mktemp) and renamed, so Prometheus never reads half of it; it is removed on exit
# (normal, error or signal). A SIGKILL can leave the file or a temporary: the next publisher of
# JOB on HOST and --withdraw remove both.
set -euo pipefail

# The comment above, less its '#'s.
usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit "$1"; }

dir=/etc/prometheus/normformer-targets
job=${RUN_DIR:+$(basename "$RUN_DIR")}
port_base=9600
ranks=${SLURM_NTASKS_PER_NODE:-}
ranks=${ranks%%(*}  # Slurm writes "8(x2)" for 8 tasks on each of 2 nodes
host=$(hostname)
dcgm_port=
withdraw_only=
while (($# > 0)); do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --port-base) port_base=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --dcgm-port) dcgm_port=$2; shift 2 ;;
    --withdraw) withdraw_only=1; shift ;;
    --) shift; break ;;
    -h|--help) usage 0 ;;
    *) echo "normformer-targets.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
[[ -n "$job" ]] || { echo "normformer-targets.sh: no job name: pass --job or set RUN_DIR" >&2; exit 2; }
[[ "$job$host" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "normformer-targets.sh: job and host may only hold [A-Za-z0-9._-] (got '$job', '$host')" >&2; exit 2; }

file="$dir/$job-$host.json"
# Removes the file and every temporary of it, by name pattern: a publisher killed inside mktemp
# leaves one whose name it never learnt. (rm removes a link, never what it points to.)
withdraw() {
  local temps
  shopt -s nullglob
  temps=("$dir/.$job-$host."??????)
  shopt -u nullglob
  rm -f -- "$file" "${temps[@]}"
}
if [[ -n $withdraw_only ]]; then
  withdraw
  exit
fi
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || { echo "normformer-targets.sh: --ranks must be a positive integer (got '$ranks')" >&2; exit 2; }
[[ "$port_base" =~ ^[0-9]+$ ]] || { echo "normformer-targets.sh: --port-base must be an integer (got '$port_base')" >&2; exit 2; }
# One group per target: each carries its own local_rank label (the alert on a rank's target
# being down selects rank targets by it).
groups=()
for ((local_rank = 0; local_rank < ranks; local_rank++)); do
  groups+=("{\"targets\": [\"$host:$((port_base + local_rank))\"], \"labels\": {\"job\": \"$job\", \"node\": \"$host\", \"local_rank\": \"$local_rank\"}}")
done
if [[ -n "$dcgm_port" ]]; then
  groups+=("{\"targets\": [\"$host:$dcgm_port\"], \"labels\": {\"job\": \"$job\", \"node\": \"$host\", \"exporter\": \"dcgm\"}}")
fi

# Signals before the command starts (or, without a command, at any time) end the script,
# through the EXIT trap that removes the file and temporaries; both trapped before either can
# exist. The EXIT trap ignores further signals: a second SIGTERM must not cut the removal short.
sleeper=
trap 'trap "" TERM INT HUP; withdraw; [[ -z "$sleeper" ]] || kill "$sleeper" 2>/dev/null' EXIT
if (($# == 0)); then
  trap 'exit 0' TERM INT HUP
else
  trap 'exit 143' TERM; trap 'exit 130' INT; trap 'exit 129' HUP
fi
mkdir -p "$dir"
withdraw  # what a killed publisher of this job on this node left
# The temporary name does not end in .json, so Prometheus ignores it until the rename; mktemp
# creates it new (O_EXCL), so nothing planted there is followed or truncated.
tmp=$(mktemp "$dir/.$job-$host.XXXXXX")
{
  echo "["
  for i in "${!groups[@]}"; do
    sep=,; ((i == ${#groups[@]} - 1)) && sep=
    echo "  ${groups[$i]}$sep"
  done
  echo "]"
} >"$tmp"
chmod 644 "$tmp"  # mktemp makes it 600; Prometheus may run as another user
mv -fT "$tmp" "$file"  # -T: a directory at $file is an error, not a place to move into

if (($# == 0)); then
  # Publish until told to stop; `wait` returns as soon as a trapped signal arrives.
  sleep infinity &
  sleeper=$!  # killed by the EXIT trap, not left behind
  wait "$sleeper" || true
  exit 0
fi

# Run the command, passing on the signals a batch script or Slurm sends (SIGUSR1 asks
# nf-launch to checkpoint and stop), and exit with its status.
"$@" &
child=$!
for sig in TERM INT HUP USR1 USR2; do
  trap "kill -$sig $child 2>/dev/null || true" "$sig"
done
status=0
wait "$child" || status=$?
# A trapped signal cuts `wait` short (status > 128) while the command runs on.
while kill -0 "$child" 2>/dev/null; do
  status=0
  wait "$child" || status=$?
done
exit "$status"
