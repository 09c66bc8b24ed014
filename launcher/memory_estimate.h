// The memory each pipeline rank of a layout needs: what nf-launch --dry-run prints, and what
// nf-launch compares with the host's (or GPU's) available memory before allocating anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/train_config.pb.h"

namespace nf::launcher {

// One pipeline rank, as its tensor-parallel and data-parallel rank 0 hold it (they also hold
// the replicated parameters and write them into checkpoints). The ops' temporaries and the
// process's own footprint (code, libraries, MPI and its buffers) are not counted;
// docs/memory.md compares the estimate with the allocator's counts and measured peaks.
struct PipelineRankMemory {
  std::string layers;          // the layer ranges of its chunks, e.g. "[0, 6) [12, 18)"
  std::string peak_in_flight;  // micro-batches in flight at the peak, per chunk, e.g. "4+3"
  int64_t parameters = 0;
  // On the training device:
  double parameter_bytes = 0;   // in the model dtype
  double gradient_bytes = 0;    // fp32
  double optimizer_bytes = 0;   // fp32 master weights (not for fp32 models) and two moments
  double activation_bytes = 0;  // kept for the backward pass of the micro-batches in flight
  // Allocated once per model chunk: the layers' scratch, the residual-stream gradients, one
  // layer's activations under full recompute (NormFormerModel::BufferBytes).
  double buffer_bytes = 0;
  // In host memory, from the first save on (0 when the run never saves): the snapshot a save
  // copies this rank's share of the checkpoint into, kept for the next save. On a GPU the
  // device buffers are first copied to the host whole, which doubles it during a save.
  double snapshot_bytes = 0;
  // In host memory, for a dataset (not the synthetic corpus): the sample and shuffle indices
  // (data/gpt_samples.h: 24 bytes a sample) of the training stream, train_iters x
  // global_batch_size samples, and of the validation stream when the run evaluates.
  double sample_index_bytes = 0;
  // In host memory, on every rank: the flight recorder's parallel.flight_recorder_entries
  // entries (parallel/flight_recorder.h).
  double flight_recorder_bytes = 0;

  double device_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + buffer_bytes;
  }
  // All of it, for a run on the CPU, where device and host memory are one.
  double cpu_total_bytes() const { return device_bytes() + host_bytes(); }
  // A GPU run's host memory: the snapshot and, during a save, the host copy of the buffers,
  // the sample index and the flight recorder.
  double gpu_host_bytes() const { return snapshot_bytes + host_bytes(); }

 private:
  double host_bytes() const { return snapshot_bytes + sample_index_bytes + flight_recorder_bytes; }
};

// One entry per pipeline rank of `config` on `world_size` ranks; InvalidArgument, naming what
// does not fit, for a layout that cannot run.
absl::StatusOr<std::vector<PipelineRankMemory>> EstimateMemory(const TrainConfig& config,
                                                               int world_size);

}  // namespace nf::launcher
