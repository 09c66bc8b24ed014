#!/usr/bin/python3
"""scripts/plot-run on synthetic run directories:
  - a long fp16-style run with per-layer (and embedding and head) gradient norms on every
    10th step, as the launcher logs them, skipped steps (grad_norm "inf"), a
    resumed stretch (steps logged twice) and validation.jsonl: all five PNGs;
  - an older run without layer_grad_norms nor validation.jsonl: the three basic PNGs only;
  - a run whose first records lack layer_grad_norms (added mid-run): all five;
and that each PNG starts with the PNG signature and is not trivially small. Bad input exits 2
with one line naming the file (and line): a missing log, a malformed line, a record without
"loss", a non-numeric value, a validation.jsonl line that is not an object.

  plot_run_test.py SOURCE_DIR
"""
import json
import math
import os
import subprocess
import sys
import tempfile

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A 1100 x 500 chart with axes, lines and text compresses to well over this; an empty or
# broken figure would not.
MIN_PNG_BYTES = 15_000
BASIC = ["loss.png", "lr_loss_scale.png", "grad_norm.png"]
LAYERS = ["layer_grad_norms.png", "layer_grad_norms_heatmap.png"]

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print(f"FAIL: {message}")


def write_jsonl(path, records, raw_lines=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in raw_lines:
            f.write(line + "\n")


def step_record(step, layers=None, skipped=False):
    loss = 7.0 * math.exp(-step / 120) + 2.0 + 0.05 * math.sin(step)
    r = {"step": step, "loss": loss, "ppl": math.exp(loss), "lr": 3e-4 * min(1, step / 30),
         "loss_scale": 65536.0 / (2 if step > 150 else 1), "grad_norm": "inf" if skipped else
         1.0 + 0.3 * math.cos(step / 7), "skipped": skipped, "skipped_total": 0,
         "tokens": 1024, "seconds": 0.2}
    if layers and step % 10 == 0:  # measured on log steps only, as the launcher does
        # Early layers larger at first, evening out with training.
        r["layer_grad_norms"] = [(0.1 + 2.0 * math.exp(-step / 80) / (1 + i)) for i in range(layers)]
        r["embedding_grad_norm"] = 3.0 * math.exp(-step / 80) + 0.1
        r["head_grad_norm"] = 0.5
    return r


def run_plot(source, run_dir, out_dir=None):
    cmd = [os.path.join(source, "scripts", "plot-run"), run_dir]
    if out_dir:
        cmd += ["-o", out_dir]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def check_pngs(out_dir, expected, absent, case):
    for name in expected:
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            check(False, f"{case}: {name} was not written")
            continue
        with open(path, "rb") as f:
            data = f.read()
        check(data.startswith(PNG_SIGNATURE), f"{case}: {name} is not a PNG")
        check(len(data) >= MIN_PNG_BYTES, f"{case}: {name} is only {len(data)} bytes")
    for name in absent:
        check(not os.path.exists(os.path.join(out_dir, name)),
              f"{case}: {name} written although the log has no layer_grad_norms")


def expect_error(source, run_dir, needle, case):
    result = run_plot(source, run_dir)
    lines = result.stderr.strip().splitlines()
    check(result.returncode == 2, f"{case}: exit {result.returncode}, expected 2 ({result.stderr.strip()})")
    check(len(lines) == 1, f"{case}: error is {len(lines)} lines, expected one: {result.stderr!r}")
    check(needle in result.stderr, f"{case}: error does not name {needle!r}: {result.stderr.strip()}")


def main():
    source = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    with tempfile.TemporaryDirectory() as tmp:
        # 1. Long run with everything; steps 201-220 logged twice (resumed from step 200).
        full = os.path.join(tmp, "full")
        os.mkdir(full)
        records = [step_record(s, layers=6, skipped=s in (40, 41, 150)) for s in range(1, 301)]
        records[219:219] = [step_record(s, layers=6) for s in range(201, 221)]
        # Events (a spike, a straggler report) are not steps: skipped, however they look.
        records[100:100] = [
            {"event": "spike", "step": 100, "metric": "loss", "value": 9.0, "median": 3.0,
             "limit": 4.0, "action": "record"},
            {"event": "stragglers", "step": 100, "slowest": {"rank": 1}, "fastest": {"rank": 0},
             "ratio": 1.1, "flagged": False}]
        write_jsonl(os.path.join(full, "log.jsonl"), records)
        write_jsonl(os.path.join(full, "validation.jsonl"),
                    [{"step": s, "loss": 7.0 * math.exp(-s / 120) + 1.9, "ppl": 1.0}
                     for s in range(0, 301, 50)])
        result = run_plot(source, full)
        check(result.returncode == 0, f"full run: exit {result.returncode}: {result.stderr}")
        check_pngs(os.path.join(full, "plots"), BASIC + LAYERS, [], "full run")
        check(len(result.stdout.split()) == 5, f"full run: printed {result.stdout!r}")

        # 2. An older run: no layer_grad_norms, no validation.jsonl; -o chooses the directory.
        old = os.path.join(tmp, "old")
        os.mkdir(old)
        write_jsonl(os.path.join(old, "log.jsonl"), [step_record(s) for s in range(1, 41)])
        out = os.path.join(tmp, "old-plots")
        result = run_plot(source, old, out)
        check(result.returncode == 0, f"old run: exit {result.returncode}: {result.stderr}")
        check_pngs(out, BASIC, LAYERS, "old run")

        # 3. layer_grad_norms appear mid-run (a run resumed with a newer binary).
        mixed = os.path.join(tmp, "mixed")
        os.mkdir(mixed)
        write_jsonl(os.path.join(mixed, "log.jsonl"),
                    [step_record(s, layers=4 if s > 20 else None) for s in range(1, 61)])
        result = run_plot(source, mixed)
        check(result.returncode == 0, f"mixed run: exit {result.returncode}: {result.stderr}")
        check_pngs(os.path.join(mixed, "plots"), BASIC + LAYERS, [], "mixed run")

        # 4. Bad input: one line naming the file and the line, exit 2.
        empty = os.path.join(tmp, "no-log")
        os.mkdir(empty)
        expect_error(source, empty, f"{empty}/log.jsonl", "missing log.jsonl")
        good = [step_record(s) for s in range(1, 6)]
        cases = [
            ("truncated line", "log.jsonl", good, ['{"step": 6, "loss": 2.'], "log.jsonl:6:"),
            ("no loss", "log.jsonl", good, ['{"step": 6, "lr": 0.1}'], "log.jsonl:6: no 'loss'"),
            ("text value", "log.jsonl", good, ['{"step": 6, "loss": "high"}'], "log.jsonl:6:"),
            ("bad layer norms", "log.jsonl", good, ['{"step": 6, "loss": 2, "layer_grad_norms": 3}'],
             "log.jsonl:6: 'layer_grad_norms' is not an array"),
        ]
        for case, name, records, raw, needle in cases:
            bad = os.path.join(tmp, case.replace(" ", "-"))
            os.mkdir(bad)
            write_jsonl(os.path.join(bad, name), records, raw)
            expect_error(source, bad, f"{bad}/{needle}", case)
        bad = os.path.join(tmp, "bad-validation")
        os.mkdir(bad)
        write_jsonl(os.path.join(bad, "log.jsonl"), good)
        write_jsonl(os.path.join(bad, "validation.jsonl"), [{"step": 0, "loss": 7.0}], ["[1, 2]"])
        expect_error(source, bad, f"{bad}/validation.jsonl:2: not a JSON object", "bad validation")

        # 5. No arguments: a usage message, exit 2.
        result = subprocess.run([os.path.join(source, "scripts", "plot-run")],
                                capture_output=True, text=True, timeout=60)
        check(result.returncode == 2 and "usage: plot-run" in result.stderr,
              f"no arguments: exit {result.returncode}, stderr {result.stderr!r}")

        if os.environ.get("PLOT_RUN_TEST_KEEP"):  # to look at the synthetic plots
            subprocess.run(["cp", "-r", full, os.environ["PLOT_RUN_TEST_KEEP"]], check=True)

    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
