#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and the CUDA toolkit only: runs the gpu-labelled
# tests (every CUDA op against its CPU twin, the fused kernels against their compositions bit
# for bit, dropout masks, a model step and 20 training steps against the CPU, fp16/bf16
# tracking fp32, cuDNN's fused attention against the CPU and the own kernel (with dropout,
# against the float64 reference with the mask cuDNN drew), a step's host
# synchronisations within their budget, every parameter 256-byte aligned on the device, the
# attention path of the 2.7B layer at tp 8 and cuDNN's backward with dropout at the 125M training
# shape, each asserting the path it took against NF_EXPECT_ATTENTION (cudnn here: a fallback to
# the own kernel fails the check), a GEMM with a misaligned bias, where an injected NaN began
# (train.nan_origin) and no false finding on a healthy step), NCCL on two GPUs as two threads of
# one process (collectives in fp32/fp16/bf16, a send/receive batch beyond NCCL's buffers, the
# priority stream; it skips, saying so, where nvidia-smi lists one GPU, the only skip accepted)
# and then nf-bench
# on one GPU with its per-op table, from gpu-bundle/ (made on a development machine by
# scripts/gpu-bundle.sh and carried over). About 8 minutes
# at most; logs and the benchmark table go to $OUT (the device tool's output folder) or
# gpu-check-out/.
#
#   scripts/gpu-bundle.sh            # here, on the development machine
#   scripts/gpu-check.sh             # there: run with carry gpu-bundle
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
if [[ ! -f gpu-bundle/bundle.tar.xz ]]; then
  echo "gpu-check: gpu-bundle/bundle.tar.xz is missing; make it with scripts/gpu-bundle.sh on a" \
    "machine with the build dependencies and carry gpu-bundle here" >&2
  exit 2
fi
bundle=$(mktemp -d)
tar -C "$bundle" -xJf gpu-bundle/bundle.tar.xz
# The CUDA libraries: the toolkit's, and those Python wheels bring (nvidia-cudnn-cu13,
# nvidia-nccl-cu13, ... under site-packages/nvidia/*/lib) where the image has them that way.
cuda_libs=/usr/local/cuda/lib64
for dir in /usr/local/lib/python3*/dist-packages/nvidia/*/lib /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib; do
  [[ -d $dir ]] && cuda_libs+=":$dir"
done
export LD_LIBRARY_PATH="$bundle/lib:$cuda_libs:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"

# The attention path every attention test must see (tests/gpu/gpu_test_util.h): cuDNN, unless
# the caller asks for the own kernel (NF_ATTENTION=own) or states another expectation.
if [[ ${NF_ATTENTION:-} == own ]]; then
  export NF_EXPECT_ATTENTION=${NF_EXPECT_ATTENTION:-own}
else
  export NF_EXPECT_ATTENTION=${NF_EXPECT_ATTENTION:-cudnn}
fi
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
echo "GPUs: $gpus; attention expected on: $NF_EXPECT_ATTENTION" | tee -a "$out/summary.txt"

failed=0
allowed_skip=  # a test whose skip is expected on this machine
run() {  # run <name> <timeout-seconds> <command...>
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.log"
  [[ $rc == 0 ]] || failed=1
  # On the GPU machine nothing may skip: a skip means the device was not usable. The one
  # exception: the two-GPU NCCL test on a machine of one GPU, with its stated reason.
  if grep -q '\[  SKIPPED \]' "$out/$name.log"; then
    if [[ $name == "$allowed_skip" ]] && grep -q 'needs 2 GPUs, one per rank' "$out/$name.log"; then
      echo "$name: skipped as expected: one GPU here, two needed" | tee -a "$out/summary.txt"
    else
      echo "$name: tests skipped on the GPU machine (no usable device?)" | tee -a "$out/summary.txt"
      failed=1
    fi
  fi
}
for t in cuda_host_test cuda_ops_test fused_kernels_test cudnn_attention_test gpu_training_test; do
  run "$t" 150 "$bundle/bin/$t" --gtest_output="xml:$out/$t.xml"
done
((gpus < 2)) && allowed_skip=nccl_threads_test
run nccl_threads_test 150 "$bundle/bin/nccl_threads_test" --gtest_output="xml:$out/nccl_threads_test.xml"
allowed_skip=
# --op-times: where each NormFormer step goes, op by op (CUDA events), after the main table.
run nf-bench 300 "$bundle/bin/nf-bench" --steps "${NF_BENCH_STEPS:-5}" --op-times
cp "$out/nf-bench.log" "$out/nf-bench.txt" 2>/dev/null || true
exit $failed
