#include "launcher/train_loop.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/jsonl_log.h"
#include "launcher/trainer.h"
#include "parallel/watchdog.h"

namespace nf::launcher {
namespace {

absl::Status WriteFileAtomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", temporary.string()));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", temporary.string(), " to ",
                                               path.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

// Continues from RUN/checkpoints/latest when the run has one (and checkpoint.resume), else from
// checkpoint.load when set; a fresh start otherwise.
absl::Status Resume(const TrainConfig& config, const std::filesystem::path& checkpoints,
                    Trainer& trainer, std::ostream* console) {
  std::filesystem::path source;
  absl::StatusOr<std::filesystem::path> latest = checkpoint::LatestCheckpoint(checkpoints);
  if (config.checkpoint().resume() && latest.ok()) {
    source = *latest;
  } else if (!latest.ok() && !absl::IsNotFound(latest.status())) {
    return latest.status();
  } else if (!config.checkpoint().load().empty()) {
    source = config.checkpoint().load();
  } else {
    return absl::OkStatus();
  }
  NF_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, checkpoint::ReadManifest(source));
  NF_RETURN_IF_ERROR(checkpoint::CheckSameModel(source, manifest, config.model()));
  NF_ASSIGN_OR_RETURN(const checkpoint::RunProgress progress,
                      checkpoint::LoadCheckpoint(source, manifest, trainer.CheckpointState()));
  NF_RETURN_IF_ERROR(trainer.Restore(progress));
  if (console != nullptr) {
    *console << "resumed from " << source.string() << " at step " << progress.step << "\n";
  }
  return absl::OkStatus();
}

JsonObject StepRecord(const StepStats& s) {
  return JsonObject()
      .AddInt("step", s.step)
      .AddDouble("loss", s.loss)
      .AddDouble("ppl", std::exp(s.loss))
      .AddDouble("lr", s.lr)
      .AddDouble("loss_scale", s.loss_scale)
      .AddDouble("grad_norm", s.grad_norm)
      .AddBool("skipped", s.skipped)
      .AddInt("skipped_total", s.skipped_total)
      .AddInt("tokens", s.tokens)
      .AddDouble("seconds", s.seconds);
}

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

}  // namespace

absl::Status RunTraining(const TrainConfig& config, const std::string& run_dir,
                         std::ostream& console, parallel::ProcessGroups* groups) {
  std::unique_ptr<Trainer> trainer;
  if (groups != nullptr) {
    NF_ASSIGN_OR_RETURN(trainer, Trainer::Create(config, *groups));
  } else {
    NF_ASSIGN_OR_RETURN(trainer, Trainer::Create(config));
  }
  const parallel::Topology& topology = trainer->groups().topology;
  const bool writes = topology.world_rank() == 0;
  const std::filesystem::path dir(run_dir);
  std::optional<JsonlLog> log;
  if (writes) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot create run directory ", run_dir, ": ", error.message()));
    }
    NF_RETURN_IF_ERROR(WriteFileAtomically(dir / "config.pbtxt", ResolvedConfigText(config)));
    NF_ASSIGN_OR_RETURN(log, JsonlLog::Open((dir / "log.jsonl").string()));
  }

  const std::filesystem::path checkpoints = dir / "checkpoints";
  const checkpoint::CheckpointConfig& saving = config.checkpoint();
  const checkpoint::RetentionPolicy retention{.keep_last = saving.keep_last(),
                                              .keep_every = saving.keep_every()};
  const auto announce = [&](const std::filesystem::path& saved) {
    if (writes) console << "saved checkpoint " << saved.string() << "\n";
  };
  checkpoint::AsyncCheckpointer checkpointer(checkpoints, retention, announce);
  const auto save = [&]() -> absl::Status {
    if (saving.async_save()) {
      return checkpointer.Start(trainer->CheckpointState(), trainer->Progress(), *trainer->world());
    }
    NF_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(checkpoints, trainer->CheckpointState(),
                                                  trainer->Progress(), *trainer->world(),
                                                  retention));
    announce(checkpoints / checkpoint::IterationDirName(trainer->step()));
    return absl::OkStatus();
  };

  const int64_t total = config.train().train_iters();
  const int64_t log_interval = std::max(1, config.train().log_interval());
  if (writes) {
    console << absl::StrFormat("normformer: %d parameters, %s, training %d steps on %s into %s\n",
                               trainer->num_global_params(),
                               TrainOptions::Precision_Name(config.train().precision()), total,
                               trainer->batches().Describe(), run_dir);
    if (topology.world_size() > 1) {
      console << absl::StrFormat(
          "layout: %d ranks = tensor_parallel %d x pipeline_parallel %d x data_parallel %d, %s%s\n",
          topology.world_size(), topology.tp(), topology.pp(), topology.dp(),
          ParallelConfig::Schedule_Name(config.parallel().pipeline_schedule()),
          config.parallel().distributed_optimizer() ? ", distributed optimizer" : "");
    }
  }
  NF_RETURN_IF_ERROR(Resume(config, checkpoints, *trainer, writes ? &console : nullptr));
  const int64_t first_step = trainer->step();
  double elapsed = 0.0;
  int64_t window_tokens = 0;
  double window_seconds = 0.0;
  while (trainer->step() < total) {
    parallel::SetCurrentStep(trainer->step() + 1);
    NF_ASSIGN_OR_RETURN(const StepStats stats, trainer->TrainStep());
    NF_RETURN_IF_ERROR(checkpointer.Poll(*trainer->world()));
    if (writes) {
      NF_RETURN_IF_ERROR(log->Write(StepRecord(stats)));
      elapsed += stats.seconds;
      window_tokens += stats.tokens;
      window_seconds += stats.seconds;
      if (stats.step % log_interval == 0 || stats.step == total) {
        const double eta = elapsed / static_cast<double>(stats.step - first_step) *
                           static_cast<double>(total - stats.step);
        console << absl::StrFormat(
            "step %d/%d | loss %.4f | ppl %.2f | lr %.3e | scale %g | grad_norm %.3f%s | "
            "%.0f tok/s | ETA %s\n",
            stats.step, total, stats.loss, std::exp(stats.loss), stats.lr, stats.loss_scale,
            stats.grad_norm, stats.skipped ? " (skipped)" : "", window_tokens / window_seconds,
            Duration(eta));
        console.flush();
        window_tokens = 0;
        window_seconds = 0.0;
      }
    }
    const bool on_interval = saving.save_interval() > 0 && stats.step % saving.save_interval() == 0;
    if (on_interval || (stats.step == total && saving.save_at_end())) {
      NF_RETURN_IF_ERROR(save());
    }
  }
  // The last save, if still being written, completes before the run ends.
  return checkpointer.Finish(*trainer->world());
}

}  // namespace nf::launcher
