#!/usr/bin/env python3
"""nf-launch's TensorBoard event files read back by TensorBoard's own reader (EventAccumulator,
in the project's venv: scripts/setup.sh installs tensorboard 2.18.0): a short run of the tiny
config with validation every 3 steps and a gradient spike injected at step 5 (RECORD) leaves
train/* scalars equal to log.jsonl's (to float32, what TensorBoard stores), validation/* at
steps 0, 3 and 6, spikes/grad_norm at step 5, and the resolved config as text.

    tensorboard_test.py NF_LAUNCH REPO_ROOT"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}")


def main():
    nf_launch, repo = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        result = subprocess.run(
            [nf_launch, "--config", os.path.join(repo, "deploy/configs/tiny.pbtxt"),
             "--set", "train.train_iters=6", "--set", "train.lr_schedule.warmup_iters=2",
             "--set", "train.eval_interval=3", "--set", "train.eval_iters=1",
             "--set", "train.spike.warmup_steps=0", "--set", "train.spike.window=4",
             "--set", "train.spike.min_relative_spread=0.5", "--set", "train.spike.loss_threshold=0",
             "--set", "train.spike.grad_norm_threshold=50", "--run-dir", run],
            capture_output=True, text=True, env={**os.environ, "NF_INJECT_GRAD_SPIKE": "5"})
        check(result.returncode == 0, f"nf-launch: exit {result.returncode}: {result.stderr}")
        files = os.listdir(os.path.join(run, "tensorboard"))
        check(len(files) == 1 and files[0].startswith("events.out.tfevents."),
              f"expected one event file, found {files}")

        events = EventAccumulator(os.path.join(run, "tensorboard"),
                                  size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        tags = events.Tags()
        for tag in ("train/loss", "train/lr", "train/grad_norm", "train/loss_scale",
                    "train/tokens_per_second", "train/skipped", "validation/loss",
                    "validation/ppl", "spikes/grad_norm"):
            check(tag in tags["scalars"], f"no scalar {tag} in {tags['scalars']}")

        steps = [json.loads(line) for line in open(os.path.join(run, "log.jsonl"))]
        steps = [r for r in steps if "event" not in r]
        losses = {e.step: e.value for e in events.Scalars("train/loss")}
        check(sorted(losses) == list(range(1, 7)), f"train/loss at steps {sorted(losses)}")
        for record in steps:
            want = float(np.float32(record["loss"]))
            check(losses[record["step"]] == want,
                  f"step {record['step']}: {losses[record['step']]} against log.jsonl's {want}")
        validation = [json.loads(line) for line in open(os.path.join(run, "validation.jsonl"))]
        read = {e.step: e.value for e in events.Scalars("validation/loss")}
        check(sorted(read) == [0, 3, 6], f"validation/loss at steps {sorted(read)}")
        for record in validation:
            check(read[record["step"]] == float(np.float32(record["loss"])),
                  f"validation at step {record['step']}")
        spikes = events.Scalars("spikes/grad_norm")
        check([e.step for e in spikes] == [5], f"spikes at steps {[e.step for e in spikes]}")

        check("config" in tags["tensors"], f"no config text in {tags['tensors']}")
        text = events.Tensors("config")[0].tensor_proto.string_val[0].decode()
        check("num_layers: 4" in text and "train_iters: 6" in text,
              f"the config text lacks the run's settings: {text[:200]!r}")
        print(f"tensorboard: {len(tags['scalars'])} scalar tags and the config read back by "
              f"EventAccumulator; train/loss equals log.jsonl's at all {len(losses)} steps")


if __name__ == "__main__":
    main()
