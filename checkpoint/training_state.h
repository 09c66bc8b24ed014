// What a checkpoint saves and restores of one rank's training, as views into the trainer's
// objects (the checkpoint module knows models and optimizers, not the launcher).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.pb.h"
#include "core/optim/loss_scaler.h"
#include "model/model_config.pb.h"
#include "model/param_table.h"
#include "parallel/data_parallel_optimizer.h"
#include "parallel/topology.h"

namespace nf::checkpoint {

// One model chunk of this rank: its parameters and their optimizer.
struct ChunkState {
  model::ParamTable* params = nullptr;
  parallel::DataParallelOptimizer* optimizer = nullptr;
  // Parameters this chunk holds as a copy of another stage's (the last stage's tied head):
  // written once, by the owner; loaded into both.
  std::vector<std::string> copies_of_other_stages;
};

// The optimizer state a checkpoint records per parameter, with the buffers that hold it
// (flat, indexed like DataParallelOptimizer::ForEachHeldPiece's state offsets).
struct OptimizerStateBuffer {
  TensorRecord::Kind kind;
  const Tensor* buffer;
};
inline std::array<OptimizerStateBuffer, 3> OptimizerStateBuffers(
    optim::MixedPrecisionAdamW& adamw) {
  return {{{TensorRecord::MASTER, &adamw.master()},
           {TensorRecord::EXP_AVG, &adamw.exp_avg()},
           {TensorRecord::EXP_AVG_SQ, &adamw.exp_avg_sq()}}};
}

// The scalars of a run's progress.
struct RunProgress {
  int64_t step = 0;                 // completed optimizer steps
  int64_t consumed_samples = 0;     // samples of the training stream read so far
  int64_t data_stream_samples = 0;  // the size of that stream (the data loader's shuffle)
  int64_t optimizer_updates = 0;
  int64_t skipped_total = 0;
  std::optional<optim::LossScalerState> loss_scaler;  // fp16 only
  std::vector<SampleWindow> skipped_samples;          // merged, sorted (Manifest)
  int64_t rollbacks = 0;
  std::vector<double> spike_losses, spike_grad_norms;  // the spike detector's windows
};

struct RankState {
  parallel::Topology topology;
  Layout layout;
  model::ModelConfig model;
  std::string train_config;  // resolved, text format
  std::vector<ChunkState> chunks;
};

}  // namespace nf::checkpoint
