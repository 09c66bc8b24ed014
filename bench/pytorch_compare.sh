#!/usr/bin/env bash
# The project's training step against PyTorch's on issue 19's shapes (bench/pytorch_compare.py):
# installs PyTorch from PyPI into its own virtual environment (.venv-bench/, ignored by git; not
# scripts/setup.sh: this benchmark is not a test), builds nf-bench-step-peer in a Release build
# directory of its own (build-bench/), then runs the comparison. Arguments go to the .py
# (--steps N, --only tiny|125m, --no-compile, --check).
#
#   bench/pytorch_compare.sh --check        # about 20 minutes on a 2-core machine
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-bench
if [[ ! -x $venv/bin/python ]] || ! $venv/bin/python -c 'import torch, numpy' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch numpy
fi

if [[ ! -f build-bench/build.ninja ]]; then
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF_CUDA=OFF
fi
cmake --build build-bench -j"$(nproc)" --target nf-bench-step-peer

exec "$venv/bin/python" bench/pytorch_compare.py --nf-bin build-bench/bench/nf-bench-step-peer "$@"
