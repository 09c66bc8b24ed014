// Shared by the tests that train small models through launcher::Trainer: make a trainer, run
// steps, compare buffers byte for byte. Failures abort: under MPI a rank that returned early
// would leave the others waiting in a collective.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "launcher/trainer.h"
#include "tests/assert_ok.h"

namespace nf::testing {

// The small model the single-process trainer tests train: 2 layers, d_model 32, 2 heads, ffn 64,
// vocab 64; 2 micro-batches of 4 samples of 16 tokens a step; lr 1e-2; a log line every 1000
// steps; the synthetic chain of branching 2. Each test sets what it varies on top.
inline launcher::TrainConfig TwoLayerTrainConfig(int64_t train_iters) {
  launcher::TrainConfig config;
  model::ModelConfig& model = *config.mutable_model();
  model.set_num_layers(2);
  model.set_d_model(32);
  model.set_num_heads(2);
  model.set_ffn_dim(64);
  model.set_vocab_size(64);
  model.set_max_seq_len(16);
  launcher::TrainOptions& train = *config.mutable_train();
  train.set_seq_len(16);
  train.set_micro_batch_size(4);
  train.set_global_batch_size(8);
  train.set_train_iters(train_iters);
  train.set_log_interval(1000);
  train.mutable_optimizer()->set_lr(1e-2f);
  config.mutable_data()->mutable_synthetic()->set_branching(2);
  return config;
}

// One process without `groups`, else a rank of the layout they describe.
inline std::unique_ptr<launcher::Trainer> MakeTrainer(const launcher::TrainConfig& config,
                                                      parallel::ProcessGroups* groups = nullptr) {
  auto trainer = groups != nullptr ? launcher::Trainer::Create(config, *groups)
                                   : launcher::Trainer::Create(config);
  NF_EXPECT_OK(trainer);
  if (!trainer.ok()) std::abort();
  return *std::move(trainer);
}

// Runs `steps` optimizer steps and returns their losses.
inline std::vector<double> TrainSteps(launcher::Trainer& trainer, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    auto stats = trainer.TrainStep();
    NF_EXPECT_OK(stats);
    if (!stats.ok()) std::abort();
    losses.push_back(stats->loss);
  }
  return losses;
}

inline std::vector<uint8_t> Bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return {p, p + t.nbytes()};
}

// A fresh directory under the test temp directory (named after the process and `name`),
// removed at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::path(::testing::TempDir()) /
              absl::StrCat("nf_test_", getpid(), "_", name)) {
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// An integer from the environment (how CTest passes a job its layout), or `fallback`.
inline int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

}  // namespace nf::testing
