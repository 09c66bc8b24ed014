#!/usr/bin/env bash
# The README's first command: installs what is missing, builds normformer, and runs the main
# job available today: the op benchmarks of the CPU backend, measured against OpenBLAS sgemm and
# memcpy ceilings taken in the same run. (Training the tiny NormFormer on 4 MPI ranks replaces
# this as the model, parallel and launcher issues land.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${NF_JOBS:-2}" --target nf-bench-ops
exec build/bench/nf-bench-ops "$@"
