#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and the CUDA toolkit only: runs the gpu-labelled
# tests (every CUDA op against its CPU twin, the fused kernels against their compositions bit
# for bit, dropout masks, a model step and 20 training steps against the CPU, fp16/bf16
# tracking fp32, cuDNN's fused attention against the CPU and the own kernel (with dropout,
# against the float64 reference with the mask cuDNN drew), a step's host
# synchronisations within their budget, every parameter 256-byte aligned on the device, the
# attention path of the 2.7B layer at tp 8, a GEMM with a misaligned bias, where an injected NaN
# began (train.nan_origin) and no false finding on a healthy step) and then nf-bench
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

failed=0
run() {  # run <name> <timeout-seconds> <command...>
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.log"
  [[ $rc == 0 ]] || failed=1
  # On the GPU machine nothing may skip: a skip means the device was not usable.
  if grep -q '\[  SKIPPED \]' "$out/$name.log"; then
    echo "$name: tests skipped on the GPU machine (no usable device?)" | tee -a "$out/summary.txt"
    failed=1
  fi
}
for t in cuda_host_test cuda_ops_test fused_kernels_test cudnn_attention_test gpu_training_test; do
  run "$t" 150 "$bundle/bin/$t" --gtest_output="xml:$out/$t.xml"
done
# --op-times: where each NormFormer step goes, op by op (CUDA events), after the main table.
run nf-bench 300 "$bundle/bin/nf-bench" --steps "${NF_BENCH_STEPS:-5}" --op-times
cp "$out/nf-bench.log" "$out/nf-bench.txt" 2>/dev/null || true
exit $failed
