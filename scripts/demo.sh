#!/usr/bin/env bash
# The README's first command: installs what is missing, builds normformer, and runs the main
# job on its embedded default: nf-launch training the tiny NormFormer
# (deploy/configs/tiny.pbtxt) on the CPU for 300 steps (about a minute on 2 cores) into
# runs/demo. Extra arguments go to nf-launch, e.g.
#   scripts/demo.sh --set train.train_iters=50 --set train.precision=BF16
# (Multi-rank training, checkpoints, resume and validation perplexity join as the parallel,
# checkpoint and launcher issues land.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${NF_JOBS:-2}" --target nf-launch

run_dir=runs/demo
rm -rf "$run_dir"
build/launcher/nf-launch --config deploy/configs/tiny.pbtxt --run-dir "$run_dir" "$@"
echo "demo: the run is in $run_dir (config.pbtxt, log.jsonl); the best possible loss on this"
echo "      synthetic chain is ln 2 = 0.693, and a uniform guess over 512 tokens is 6.24"
