#!/usr/bin/env python3
"""Checks the PromQL of deploy/grafana/normformer-run.json and deploy/prometheus/alerts.yml
against the exporter's metric list (expected_metrics.txt).

  check_monitoring_queries.py SOURCE_DIR RULES_OUT

Fails (exit 1, one line per problem) when the dashboard is not valid JSON, lacks the datasource
or job variable, has a panel without a Prometheus datasource or without queries, or when an
expression names a metric the exporter does not serve (only up and DCGM_* are allowed
besides), or when an exported metric is on no panel. Writes every dashboard expression, its
Grafana variables replaced by values, as a recording rule to RULES_OUT, for
`promtool check rules` to check their syntax.
"""
import json
import re
import sys

# Words of PromQL that look like metric names but are not.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan", "atan2"}


def metric_names(expr):
    """The metric names an expression selects (a small tokenizer, enough for our queries)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # string literals ("$job", regexes)
    expr = re.sub(r"\{[^}]*\}", " ", expr)                    # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)                   # ranges and subqueries
    # Label lists of by/without/on/ignoring/group_*.
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = m.group(0)
        following = expr[m.end():].lstrip()
        if following.startswith("("):                            # a function call
            continue
        if word.lower() in KEYWORDS or (m.start() > 0 and expr[m.start() - 1].isdigit()):
            continue                                              # keywords, 1e-3's e
        names.add(word)
    return names


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, rules_out = sys.argv[1], sys.argv[2]
    exported = set()
    histograms = set()
    with open(f"{source}/tests/monitoring/expected_metrics.txt") as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if fields:
                exported.add(fields[0])
                if fields[1] == "histogram":
                    histograms.add(fields[0])
    allowed = set(exported)
    for h in histograms:
        allowed |= {h + "_bucket", h + "_sum", h + "_count"}

    def unknown(names):
        return sorted(n for n in names
                      if n not in allowed and n != "up" and not n.startswith("DCGM_"))

    problems = []
    path = f"{source}/deploy/grafana/normformer-run.json"
    try:
        with open(path) as f:
            dashboard = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")

    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource" or \
            variables["datasource"].get("query") != "prometheus":
        problems.append(f"{path}: no Prometheus datasource variable named 'datasource'")
    if variables.get("job", {}).get("type") != "query":
        problems.append(f"{path}: no query variable named 'job'")
    else:
        used = metric_names(re.sub(r"label_values\((.*),\s*\w+\)", r"\1",
                                   variables["job"]["query"]["query"]))
        for name in unknown(used):
            problems.append(f"{path}: variable job: unknown metric {name}")

    seen = set()
    rules = []
    panels = [p for p in dashboard.get("panels", []) if p.get("type") != "row"]
    if not panels:
        problems.append(f"{path}: no panels")
    for panel in panels:
        where = f"{path}: panel {panel.get('id')} '{panel.get('title')}'"
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{where}: datasource is not ${{datasource}}")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{where}: no targets")
        for target in targets:
            expr = target.get("expr", "")
            if not expr.strip():
                problems.append(f"{where}: target {target.get('refId')} has no expr")
                continue
            if target.get("datasource", panel.get("datasource")) != panel.get("datasource"):
                problems.append(f"{where}: target {target.get('refId')} uses another datasource")
            if 'job="$job"' not in expr:
                problems.append(f"{where}: expression not restricted to job=\"$job\": {expr}")
            names = metric_names(expr)
            if not names:
                problems.append(f"{where}: expression selects no metric: {expr}")
            for name in unknown(names):
                problems.append(f"{where}: unknown metric {name} in {expr}")
            seen |= names
            concrete = expr.replace("$__rate_interval", "1m").replace("$job", "run")
            rules.append((f"dashboard:panel{panel.get('id')}:{target.get('refId')}", concrete))

    for name in sorted(exported):
        if not any(s == name or s.startswith(name + "_") and s[len(name) + 1:] in
                   ("bucket", "sum", "count") for s in seen):
            problems.append(f"{path}: exported metric {name} is on no panel")

    alerts_path = f"{source}/deploy/prometheus/alerts.yml"
    with open(alerts_path) as f:
        text = f.read()
    # The expressions are the `expr:` values, inline or as `|` blocks.
    for m in re.finditer(r"expr: (?:\|\n((?:\s{10}.*\n)+)|(.*)\n)", text):
        expr = m.group(1) or m.group(2)
        for name in unknown(metric_names(expr)):
            problems.append(f"{alerts_path}: unknown metric {name} in {expr.strip()}")

    with open(rules_out, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for record, expr in rules:
            f.write(f"      - record: {record}\n        expr: {json.dumps(expr)}\n")

    for p in problems:
        print(p)
    print(f"checked {len(panels)} panels, {len(rules)} dashboard expressions; "
          f"{len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
