#!/usr/bin/env bash
# The README's second command (and what .ci/run calls): installs what is missing, builds
# normformer (Release, the configuration users build, with warnings as errors) and runs every
# test; then the CUDA backend's tests on emulated GPUs (NF_TEST_EMULATION=0 skips them); then
# builds again with AddressSanitizer + UBSan and runs the tests there too (NF_TEST_SANITIZE=0
# skips that pass); last, short libFuzzer passes over the .idx, manifest.pb and flight-record
# readers in a clang build (NF_TEST_FUZZ=0 skips them, NF_FUZZ_RUNS sets their length).
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -L core         # extra arguments go to ctest (here: only the core label)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
jobs=${NF_JOBS:-2}
# ccache keys on paths relative to the checkout, so a clone elsewhere (CI's clean clone) reuses
# what an earlier build of the same sources compiled.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
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
# Release first: the configuration users build (a warning that only -O3 shows is caught here).
# Warnings are errors in every pass of this script, never in a user's build (NF_WERROR).
echo "== build and test (build/, Release)"
run_suite build -DCMAKE_BUILD_TYPE=Release -DNF_WERROR=ON

# The CUDA backend's own sources on emulated GPUs (tests/emulation, docs/design.md): the GPU
# tests, the emulator's rules, NCCL across processes and nf-launch itself. NF_TEST_EMULATION=0
# skips the pass.
if [[ "${NF_TEST_EMULATION:-1}" != 0 ]]; then
  echo "== build and test the CUDA backend on emulated GPUs (build-emu/)"
  cmake -S . -B build-emu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF_WERROR=ON \
    -DNF_CUDA_EMULATION=ON -DNF_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build build-emu -j "$jobs" --target emulated_tests
  ctest --test-dir build-emu --output-on-failure -j "$jobs" -L 'gpu|emulation' "${ctest_args[@]}"
fi

if [[ "${NF_TEST_SANITIZE:-1}" != 0 ]]; then
  echo "== build and test with AddressSanitizer + UBSan (build-asan/)"
  # The benchmarks are not tests; skip them in the sanitizer build to save compile time. The
  # CUDA backend too: the first pass compiles it, and its kernels run on GPUs, not here.
  # allocator_may_return_null: an allocation too large to satisfy fails as in a plain build
  # (null from malloc, std::bad_alloc from new), which the tests of those errors check, instead
  # of AddressSanitizer aborting the process.
  # intercept_tls_get_addr=0: the __tls_get_addr interceptor of GCC <= 13's runtime takes a
  # dynamic TLS block that happens to start 16 bytes into a page for a pre-2.25 glibc header
  # and reads the words before it as a block; LeakSanitizer's exit-time tracer then dies
  # ("Tracer caught signal 11"), seen now and then in the 8-rank MPI jobs (Open MPI's dlopen'd
  # components use dynamic TLS). Without the interceptor such blocks are not scanned as roots;
  # normformer's own thread_locals are static TLS and still are.
  # -O1 -g1 instead of RelWithDebInfo's -O2 -g: instrumented -O2 with full debug info compiles
  # 2-3x slower (gpt2_bpe.cc 27.8 s against 12.0 s, chunked_encoding_test.cc 35.4 s against
  # 18.6 s) and the pass would take CI past its cold-machine budget; -g1 keeps the line tables
  # the sanitizers' stack traces name files and lines from.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:intercept_tls_get_addr=0 \
    UBSAN_OPTIONS=print_stacktrace=1 \
    run_suite build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DNF_WERROR=ON -DNF_SANITIZE=ON \
    -DNF_BUILD_BENCHMARKS=OFF -DNF_CUDA=OFF
fi
# A short, reproducible (-seed) libFuzzer run of one target from valid seeds; any crash,
# sanitizer report or leak makes the fuzzer exit non-zero, failing the script, and leaves the
# input as build-fuzz/fuzz/crash-* for reproduction.
fuzz() {
  local target=$1 corpus=$2 runs=$3
  local log=build-fuzz/fuzz/$target.log
  if ! "build-fuzz/fuzz/$target" -runs="$runs" -seed=1 \
    -artifact_prefix=build-fuzz/fuzz/ "$corpus" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: $target failed; full log in $log" >&2
    exit 1
  fi
  echo "$target: $(tail -n 1 "$log")"
}
if [[ "${NF_TEST_FUZZ:-1}" != 0 ]]; then
  echo "== fuzz the .idx, manifest.pb and flight-record readers (build-fuzz/, clang + libFuzzer)"
  CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF_FUZZ=ON \
    -DNF_WERROR=ON -DNF_CUDA=OFF -DNF_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build build-fuzz -j "$jobs" --target idx_reader_fuzzer manifest_reader_fuzzer \
    make_manifest_seeds flight_reader_fuzzer make_flight_seeds
  rm -rf build-fuzz/fuzz/idx_reader_corpus build-fuzz/fuzz/manifest_reader_corpus \
    build-fuzz/fuzz/flight_reader_corpus
  python3 fuzz/make_idx_seeds.py build-fuzz/fuzz/idx_reader_corpus
  mkdir -p build-fuzz/fuzz/manifest_reader_corpus
  build-fuzz/fuzz/make_manifest_seeds build-fuzz/fuzz/manifest_reader_corpus
  mkdir -p build-fuzz/fuzz/flight_reader_corpus
  build-fuzz/fuzz/make_flight_seeds build-fuzz/fuzz/flight_reader_corpus
  fuzz idx_reader_fuzzer build-fuzz/fuzz/idx_reader_corpus "${NF_FUZZ_RUNS:-20000}"
  # About 30 µs a run (parse + checks, no files): ten times as many runs in a few seconds.
  fuzz manifest_reader_fuzzer build-fuzz/fuzz/manifest_reader_corpus "${NF_FUZZ_RUNS:-200000}"
  # About 0.3 ms a run (a run directory's records parsed, merged and analysed): 6 s.
  fuzz flight_reader_fuzzer build-fuzz/fuzz/flight_reader_corpus "${NF_FUZZ_RUNS:-20000}"
fi
echo "== all tests passed"
