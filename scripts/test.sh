#!/usr/bin/env bash
# The README's second command (and what .ci/run calls): installs what is missing, builds
# normformer, and runs every test; then builds again with AddressSanitizer + UBSan and runs
# the tests there too (NF_TEST_SANITIZE=0 skips that second pass).
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -L core         # extra arguments go to ctest (here: only the core label)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
jobs=${NF_JOBS:-2}
# Kernels and OpenBLAS share the machine's cores; tests stay deterministic for any count.
export NF_NUM_THREADS=${NF_NUM_THREADS:-2}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}

run_suite() {
  local build_dir=$1
  shift
  cmake -S . -B "$build_dir" -G Ninja "$@" >/dev/null
  cmake --build "$build_dir" -j "$jobs"
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "${ctest_args[@]}"
}

ctest_args=("$@")
echo "== build and test (build/)"
run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo

if [[ "${NF_TEST_SANITIZE:-1}" != 0 ]]; then
  echo "== build and test with AddressSanitizer + UBSan (build-asan/)"
  # The benchmarks are not tests; skip them in the sanitizer build to save compile time.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_suite build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF_SANITIZE=ON -DNF_BUILD_BENCHMARKS=OFF
fi
echo "== all tests passed"
