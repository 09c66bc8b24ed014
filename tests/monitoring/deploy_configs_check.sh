#!/usr/bin/env bash
# The monitoring deploy files, without a running Prometheus or Grafana:
#   - promtool accepts deploy/prometheus/prometheus.yml and alerts.yml, and the alert unit
#     tests (alerts_test.yml: each alert firing and not firing) pass;
#   - the Grafana dashboard is valid JSON whose every panel uses the datasource variable and
#     has queries naming only exported metrics (tests/monitoring/expected_metrics.txt), up or
#     DCGM_*, with every exported metric on some panel, and whose expressions parse
#     (promtool check rules on them as recording rules);
#   - normformer-targets.sh publishes one target per local rank, atomically named, and
#     removes its file when its command ends or when it is signalled.
# promtool comes from Debian's prometheus package (scripts/setup.sh); the Prometheus service
# itself is not used.
#
#   tests/monitoring/deploy_configs_check.sh SOURCE_DIR
set -euo pipefail
src=$(cd "${1:?usage: deploy_configs_check.sh SOURCE_DIR}" && pwd)
command -v promtool >/dev/null ||
  { echo "FAIL: promtool not found (Debian package prometheus; run scripts/setup.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== promtool check config / check rules / test rules"
promtool check config "$src/deploy/prometheus/prometheus.yml"
promtool check rules "$src/deploy/prometheus/alerts.yml"
(cd "$src/deploy/prometheus" && promtool test rules alerts_test.yml)

echo "== Grafana dashboard"
python3 "$src/tests/monitoring/check_monitoring_queries.py" "$src" "$tmp/dashboard_rules.yml"
promtool check rules "$tmp/dashboard_rules.yml"

echo "== normformer-targets.sh"
targets=$src/deploy/prometheus/normformer-targets.sh
dir=$tmp/targets
# Wrapper mode: while the command runs the file holds 3 rank targets and a DCGM one; the
# command's exit status comes back; the file is gone afterwards.
status=0
"$targets" --dir "$dir" --job run-a --ranks 3 --port-base 9600 --host node7 --dcgm-port 9400 \
  -- cp "$dir/run-a-node7.json" "$tmp/published.json" || status=$?
((status == 0)) || fail "targets wrapper exited $status"
[[ ! -e "$dir/run-a-node7.json" ]] || fail "targets file left behind after the command ended"
[[ -z "$(ls -A "$dir")" ]] || fail "temporary files left in $dir: $(ls -A "$dir")"
python3 - "$tmp/published.json" <<'PY'
import json, sys
groups = json.load(open(sys.argv[1]))
got = [(g["targets"], g["labels"]) for g in groups]
want = [([f"node7:{9600 + r}"], {"job": "run-a", "node": "node7", "local_rank": str(r)})
        for r in range(3)]
want.append((["node7:9400"], {"job": "run-a", "node": "node7", "exporter": "dcgm"}))
assert got == want, f"targets file: got {got}, want {want}"
PY
status=0
"$targets" --dir "$dir" --job run-a --ranks 1 --host node7 -- sh -c 'exit 5' || status=$?
((status == 5)) || fail "targets wrapper returned $status for a command that exited 5"
# Publishing mode: the file stays until SIGTERM, then goes, and no process is left behind
# (one would hold the pipe to `cat` open past its timeout).
publish_and_stop() {
  "$targets" --dir "$dir" --job run-b --ranks 2 --host node8 &
  local publisher=$!
  for _ in $(seq 50); do [[ -e "$dir/run-b-node8.json" ]] && break; sleep 0.1; done
  [[ -e "$dir/run-b-node8.json" ]] || fail "publishing mode wrote no targets file"
  kill -TERM "$publisher"
  wait "$publisher" || fail "publishing mode exited $? on SIGTERM"
  [[ ! -e "$dir/run-b-node8.json" ]] || fail "targets file left behind after SIGTERM"
}
publish_and_stop | timeout 10 cat || fail "publishing mode failed or left a process behind"
# Bad arguments are refused with exit 2.
status=0
"$targets" --dir "$dir" --job run-c --ranks 0 2>/dev/null || status=$?
((status == 2)) || fail "--ranks 0 gave exit $status, not 2"

echo "PASS"
