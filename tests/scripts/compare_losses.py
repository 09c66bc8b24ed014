#!/usr/bin/env python3
"""Every step's loss of a run against a reference run's: compare_losses.py REFERENCE_LOG RUN_LOG
STEPS [TOLERANCE]. Both are log.jsonl files; a resumed run appends, so the last record of a step
counts. Fails unless both have steps 1..STEPS and every relative difference is within TOLERANCE
(default 1e-5, the layout-equivalence tolerance: docs/parallelism.md)."""
import json
import sys


def last_per_step(path):
    last = {}
    for line in open(path):
        record = json.loads(line)
        if "event" not in record:  # spikes and rollbacks are events, not steps
            last[record["step"]] = record["loss"]
    return last


def main():
    reference, run = last_per_step(sys.argv[1]), last_per_step(sys.argv[2])
    steps = int(sys.argv[3])
    tolerance = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
    want = list(range(1, steps + 1))
    if sorted(reference) != want or sorted(run) != want:
        sys.exit(f"expected steps 1..{steps}: the reference has {len(reference)}, the run {len(run)}")
    worst = max(abs(run[s] - reference[s]) / abs(reference[s]) for s in reference)
    print(f"{steps} steps compared with the reference, worst relative difference {worst:.1e}")
    sys.exit(1 if worst > tolerance else 0)


if __name__ == "__main__":
    main()
