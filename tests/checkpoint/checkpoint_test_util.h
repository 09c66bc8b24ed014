// What the single-process checkpoint tests share: a tiny model's config, a scratch directory,
// and saving and loading on a world of one.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "launcher/trainer.h"
#include "parallel/local_communicator.h"

namespace nf::checkpoint {

namespace fs = std::filesystem;
using launcher::TrainConfig;
using launcher::Trainer;

// The names in `dir`, sorted.
inline std::vector<std::string> SortedNames(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline TrainConfig TinyConfig(launcher::TrainOptions::Precision precision) {
  TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(2);
  m.set_d_model(16);
  m.set_num_heads(2);
  m.set_ffn_dim(32);
  m.set_vocab_size(40);
  m.set_max_seq_len(8);
  m.set_dropout(0.1f);
  launcher::TrainOptions& t = *config.mutable_train();
  t.set_seq_len(8);
  t.set_micro_batch_size(2);
  t.set_global_batch_size(4);
  t.set_train_iters(8);
  t.set_precision(precision);
  t.mutable_lr_schedule()->set_warmup_iters(2);
  t.mutable_optimizer()->set_clip_grad(1.0f);
  t.mutable_loss_scale()->set_growth_interval(2);  // fp16: the scaler's state moves
  return config;
}

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() / absl::StrCat("nf_ckpt_test_", getpid(), "_", ++count_)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int count_ = 0;
  fs::path path_;
};

inline absl::Status Save(Trainer& trainer, const fs::path& dir, RetentionPolicy retention = {}) {
  parallel::LocalCommunicator world;
  return SaveCheckpoint(dir, trainer.CheckpointState(), trainer.Progress(), world, retention);
}

inline absl::Status Load(Trainer& trainer, const fs::path& dir) {
  absl::StatusOr<Manifest> manifest = ReadManifest(dir);
  if (!manifest.ok()) return manifest.status();
  absl::Status same = CheckSameModel(dir, *manifest, trainer.chunks().front()->config());
  if (!same.ok()) return same;
  absl::StatusOr<RunProgress> progress = LoadCheckpoint(dir, *manifest, trainer.CheckpointState());
  if (!progress.ok()) return progress.status();
  return trainer.Restore(*progress);
}

}  // namespace nf::checkpoint
