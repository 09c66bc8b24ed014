#!/usr/bin/env bash
# Prepares gpu-bundle/ for scripts/gpu-check.sh on a GPU machine that has only the CUDA toolkit
# (no abseil, protobuf, OpenBLAS or MPI, and no network): the gpu test programs (NCCL's two
# ranks as two threads of one process, nccl_threads_test, since there is no mpirun) and nf-bench
# built here, stripped, with the shared libraries they load from outside glibc and the CUDA
# toolkit, packed as gpu-bundle/bundle.tar.xz: the device tool's `carry` takes the folder
# along, and must stay under 64 MiB (OpenBLAS alone is 36 MiB unpacked).
#
#   scripts/gpu-bundle.sh [build-dir]      # default build/, configured by scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
programs=(tests/cuda_host_test tests/cuda_ops_test tests/fused_kernels_test
          tests/cudnn_attention_test tests/gpu_training_test tests/nccl_threads_test
          bench/nf-bench)
targets=()
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
cmake --build "$build" -j "${NF_JOBS:-2}" --target "${targets[@]}"

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/bin" "$staging/lib"
for p in "${programs[@]}"; do
  strip --strip-debug -o "$staging/bin/$(basename "$p")" "$build/$p"
done
# Every library the loader resolves, except glibc's (the GPU machine has its own) and the
# CUDA toolkit's (cuBLASLt alone is larger than the carry limit; the machine has the toolkit).
ldd "$staging"/bin/* | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv)\.so|/ld-linux' |
  grep -v -E '/usr/local/cuda|libcuda\.so|libcudart|libcublas|libnccl|libcudnn' |
  while read -r lib; do
    strip --strip-debug -o "$staging/lib/$(basename "$lib")" "$lib"
  done
rm -rf gpu-bundle
mkdir gpu-bundle
tar -C "$staging" -cJf gpu-bundle/bundle.tar.xz bin lib
du -sh gpu-bundle/bundle.tar.xz
