#!/usr/bin/env bash
# The memory estimate against the CPU allocator's counts (nf-bench-memory) over a grid of layouts
# of one model: tensor, pipeline and data parallelism, sequence parallelism, each recompute mode,
# ZeRO-1 and two micro-batch sizes. The model is the tiny config widened to d 256, ffn 1024, 8
# heads, sequences of 128 (every rank's activations then outweigh its fixed scratch). Prints one
# Markdown row per rank; docs/memory.md keeps the table.
#
#   bench/memory_layouts.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
bench="$build/bench/nf-bench-memory"
mpirun=(mpirun --oversubscribe --allow-run-as-root)
model=(model.d_model=256 model.ffn_dim=1024 model.num_heads=8 model.max_seq_len=128
  train.seq_len=128)

run() {  # ranks overrides...
  local ranks=$1
  shift
  local sets=()
  for s in "${model[@]}" "$@"; do sets+=(--set "$s"); done
  NF_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    "${mpirun[@]}" -np "$ranks" "$bench" --config "$root/deploy/configs/tiny.pbtxt" "${sets[@]}"
}

echo "| tp | pp | dp | SP | recompute | micro-batch | in flight | rank | est. params + grads + optimizer + buffers MiB | after creation MiB | est. activations MiB | step's peak growth MiB | est. total MiB | peak MiB | error |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for recompute in NONE SELECTIVE FULL; do
  run 1 train.recompute=$recompute
done
run 1 train.micro_batch_size=2
for recompute in NONE SELECTIVE FULL; do
  run 2 parallel.tensor_parallel=2 train.recompute=$recompute
  run 2 parallel.tensor_parallel=2 parallel.sequence_parallel=true train.recompute=$recompute
done
run 4 parallel.tensor_parallel=4
run 4 parallel.tensor_parallel=4 parallel.sequence_parallel=true
run 2 parallel.pipeline_parallel=2
run 2 parallel.pipeline_parallel=2 train.recompute=FULL
run 2 parallel.pipeline_parallel=2 parallel.pipeline_schedule=GPIPE
run 2
run 2 parallel.distributed_optimizer=true
run 4 parallel.tensor_parallel=2 parallel.pipeline_parallel=2 parallel.sequence_parallel=true \
  parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B parallel.virtual_stages=2
