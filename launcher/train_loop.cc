#include "launcher/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "core/files/atomic_file.h"
#include "core/ops/op_timing.h"
#include "core/status.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/jsonl_log.h"
#include "launcher/nan_origin.h"
#include "launcher/step_metrics.h"
#include "launcher/stop_requests.h"
#include "launcher/straggler_report.h"
#include "launcher/tensorboard_writer.h"
#include "launcher/trainer.h"
#include "monitoring/rank_metrics.h"
#include "monitoring/socket_address.h"
#include "parallel/flight_dumps.h"
#include "parallel/flight_recorder.h"
#include "parallel/placement.h"
#include "parallel/run_start.h"
#include "parallel/watchdog.h"

namespace nf::launcher {
namespace {

// The settings that define the training data stream, as "field A -> B" for each that differs
// between the config the checkpoint was written with and this run's (both resolved: defaults
// filled in, as the checkpoint stores it).
std::vector<std::string> DataSettingsChanged(const checkpoint::Manifest& manifest,
                                             const TrainConfig& config) {
  // A checkpoint that read no sample (an imported one) has no stream for this run to continue.
  if (manifest.consumed_samples() == 0) return {};
  TrainConfig saved, now;
  if (!google::protobuf::TextFormat::ParseFromString(manifest.train_config(), &saved) ||
      !google::protobuf::TextFormat::ParseFromString(ResolvedConfigText(config), &now)) {
    return {"a train config that does not parse"};
  }
  std::vector<std::string> changed;
  const auto compare = [&](absl::string_view field, const google::protobuf::Message& before,
                           const google::protobuf::Message& after) {
    if (google::protobuf::util::MessageDifferencer::Equals(before, after)) return;
    changed.push_back(absl::StrCat(field, " {", before.ShortDebugString(), "} -> {",
                                   after.ShortDebugString(), "}"));
  };
  compare("data", saved.data(), now.data());
  if (saved.train().seed() != now.train().seed()) {
    changed.push_back(
        absl::StrCat("train.seed ", saved.train().seed(), " -> ", now.train().seed()));
  }
  if (saved.train().seq_len() != now.train().seq_len()) {
    changed.push_back(
        absl::StrCat("train.seq_len ", saved.train().seq_len(), " -> ", now.train().seq_len()));
  }
  return changed;
}

// The checkpoint this run continues from: the run's own (checkpoint.resume; `latest`, or the
// newest that verifies with a warning), else checkpoint.load when set; none for a fresh start.
absl::StatusOr<std::optional<checkpoint::ResumePoint>> ChooseCheckpoint(
    const TrainConfig& config, const std::filesystem::path& checkpoints) {
  if (config.checkpoint().resume()) {
    absl::StatusOr<checkpoint::ResumePoint> point = checkpoint::FindResumePoint(checkpoints);
    if (point.ok()) return *std::move(point);
    if (!absl::IsNotFound(point.status())) return point.status();
  }
  if (config.checkpoint().load().empty()) return std::nullopt;
  const std::filesystem::path source = config.checkpoint().load();
  NF_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(source));
  return checkpoint::ResumePoint{.dir = source, .manifest = std::move(manifest), .warning = ""};
}

// Loads `point` (none: nothing) into the trainer. Collective over the world: every rank loads
// its part, and it returns only once all have, from the same step; a rank that failed makes
// every rank fail, naming it.
absl::Status LoadOnEveryRank(const std::optional<checkpoint::ResumePoint>& point,
                             const TrainConfig& config, const std::filesystem::path& checkpoints,
                             Trainer& trainer) {
  const int64_t step = point ? point->manifest.step() : 0;
  absl::Status loaded = [&]() -> absl::Status {
    if (!point) return absl::OkStatus();
    NF_RETURN_IF_ERROR(checkpoint::CheckSameModel(point->dir, point->manifest, config.model()));
    NF_ASSIGN_OR_RETURN(
        const checkpoint::RunProgress progress,
        checkpoint::LoadCheckpoint(point->dir, point->manifest, trainer.CheckpointState()));
    return trainer.Restore(progress);
  }();
  // [a failed rank + 1 (0: none), step, -step], maximised over the world.
  parallel::Communicator& world = *trainer.world();
  NF_ASSIGN_OR_RETURN(const Tensor agreed, Tensor::HostZeros(DType::kI64, {3}));
  int64_t* values = agreed.data<int64_t>();
  values[0] = loaded.ok() ? 0 : world.rank() + 1;
  values[1] = step;
  values[2] = -step;
  NF_RETURN_IF_ERROR(world.AllReduce(agreed, parallel::ReduceOp::kMax));
  if (!loaded.ok()) return loaded;
  if (values[0] != 0) {
    return absl::AbortedError(absl::StrCat("rank ", values[0] - 1, " could not load its part of ",
                                           point->dir.string(), " (its error says why)"));
  }
  if (values[1] != -values[2]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ranks found different checkpoints to resume from (steps ", -values[2], " to ",
        values[1], "): is ", checkpoints.string(), " the same directory on every node?"));
  }
  return absl::OkStatus();
}

// Continues from ChooseCheckpoint's checkpoint, if any (collective: LoadOnEveryRank); returns it
// for AnnounceResume.
absl::StatusOr<std::optional<checkpoint::ResumePoint>> Resume(
    const TrainConfig& config, const std::filesystem::path& checkpoints, Trainer& trainer) {
  NF_ASSIGN_OR_RETURN(std::optional<checkpoint::ResumePoint> point,
                      ChooseCheckpoint(config, checkpoints));
  NF_RETURN_IF_ERROR(LoadOnEveryRank(point, config, checkpoints, trainer));
  return point;
}

// Says on `console` where the run resumed from, with the warnings of the choice.
void AnnounceResume(const std::optional<checkpoint::ResumePoint>& point, const TrainConfig& config,
                    std::ostream& console) {
  if (!point) return;
  if (!point->warning.empty()) console << "normformer: warning: " << point->warning << "\n";
  for (const std::string& change : DataSettingsChanged(point->manifest, config)) {
    console << "normformer: warning: resuming with " << change
            << ": the data stream does not continue the checkpoint's\n";
  }
  console << "resumed from " << point->dir.string() << " at step " << point->manifest.step() << " ("
          << point->manifest.consumed_samples() << " samples consumed)\n";
}

JsonObject WindowRecord(const SampleWindow& window) {
  return JsonObject().AddInt("begin", window.begin()).AddInt("end", window.end());
}

JsonObject StepRecord(const StepStats& s) {
  JsonObject record;
  record.AddInt("step", s.step)
      .AddDouble("loss", s.loss)
      .AddDouble("ppl", std::exp(s.loss))
      .AddDouble("lr", s.lr)
      .AddDouble("loss_scale", s.loss_scale)
      .AddDouble("grad_norm", s.grad_norm)
      .AddBool("skipped", s.skipped)
      .AddInt("skipped_total", s.skipped_total)
      .AddInt("tokens", s.tokens)
      .AddDouble("seconds", s.seconds);
  // A skipped step says why: "nonfinite_grads" (fp16: the loss scale is too high) or
  // "update_overflow" (the update would have taken a weight past the model dtype: the lr).
  if (s.skipped) record.AddString("skip_reason", optim::SkipReasonName(s.skip_reason));
  if (s.skipped_window) record.AddObject("skipped_window", WindowRecord(*s.skipped_window));
  // Steps that measured per-block norms (log steps): embedding, head, and the layers in order.
  if (s.block_grad_norms.size() >= 2) {
    std::vector<double> layers;
    for (size_t i = 1; i + 1 < s.block_grad_norms.size(); ++i) {
      layers.push_back(s.block_grad_norms[i].second);
    }
    record.AddDouble("embedding_grad_norm", s.block_grad_norms.front().second)
        .AddDouble("head_grad_norm", s.block_grad_norms.back().second)
        .AddDoubleArray("layer_grad_norms", layers);
  }
  return record;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

// One run of the loop on one rank: rank 0 writes the run directory, log and console.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& config, const std::string& run_dir, std::ostream& console,
              std::unique_ptr<Trainer> trainer, AfterValidation after_validation, RunDirLock* lock)
      : after_validation_(std::move(after_validation)),
        lock_(lock),
        config_(config),
        dir_(run_dir),
        checkpoints_(dir_ / "checkpoints"),
        console_(console),
        trainer_(std::move(trainer)),
        writes_(trainer_->groups().topology.world_rank() == 0),
        checkpointer_(checkpoints_,
                      {.keep_last = config.checkpoint().keep_last(),
                       .keep_every = config.checkpoint().keep_every()},
                      [this](const std::filesystem::path& saved) { Announce(saved); }),
        stops_(config.train()) {}

  absl::StatusOr<RunEnd> Run() {
    // The resume first: it is the last check that can refuse the run (another model's
    // checkpoint, one that does not load), and a refused run leaves its directory as it was.
    // The flight recorder records its collectives; its dumps start with the directory.
    SetFlightRecorderCapacity();
    const auto load_start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(const std::optional<checkpoint::ResumePoint> resumed,
                        Resume(config_, checkpoints_, *trainer_));
    const double load_seconds = SecondsSince(load_start);
    NF_RETURN_IF_ERROR(PrepareRunDirectory());
    NF_RETURN_IF_ERROR(StartFlightDumps());
    NF_RETURN_IF_ERROR(MeasureCeiling());
    PrintHeader();
    if (writes_) AnnounceResume(resumed, config_, console_);
    NF_RETURN_IF_ERROR(StartMetrics());
    NF_RETURN_IF_ERROR(WriteResolvedConfig());
    if (config_.checkpoint().async_save()) checkpointer_.Reserve(trainer_->CheckpointState());
    first_step_ = trainer_->step();
    if (metrics_ && first_step_ > 0) metrics_->RecordCheckpointLoad(load_seconds, first_step_);
    const int64_t total = config_.train().train_iters();
    const int64_t eval_interval = config_.train().eval_interval();
    if (eval_interval > 0 && first_step_ == 0) NF_RETURN_IF_ERROR(Validate(0));
    parallel::Communicator& world = *trainer_->world();
    const int64_t log_interval = std::max(1, config_.train().log_interval());
    while (trainer_->step() < total) {
      const int64_t next = trainer_->step() + 1;
      parallel::SetCurrentStep(next);
      // Only a job of several ranks reports stragglers: one process skips the totals.
      const bool several = world.size() > 1;
      const double comm_wait_before = several ? CommWaitSeconds() : 0.0;
      NF_ASSIGN_OR_RETURN(const StepStats stats,
                          trainer_->TrainStep(next % log_interval == 0 || next == total));
      const double step_comm_wait = several ? CommWaitSeconds() - comm_wait_before : 0.0;
      RecordAsyncSaveWait();
      NF_RETURN_IF_ERROR(checkpointer_.Poll(world));
      RecordMetrics(stats);
      NF_RETURN_IF_ERROR(Report(stats));
      NF_RETURN_IF_ERROR(
          ReportStragglers(stats, step_comm_wait, next % log_interval == 0 || next == total));
      if (stats.spike) {
        NF_ASSIGN_OR_RETURN(const bool rolled_back, ActOnSpike(stats));
        if (rolled_back) continue;
      }
      NF_RETURN_IF_ERROR(ReportNanOrigin(stats));
      NF_RETURN_IF_ERROR(CheckHealth(stats));
      if (eval_interval > 0 && (stats.step % eval_interval == 0 || stats.step == total)) {
        NF_RETURN_IF_ERROR(Validate(stats.step));
      }
      const checkpoint::CheckpointConfig& saving = config_.checkpoint();
      interval_save_due_ = interval_save_due_ ||
                           (saving.save_interval() > 0 && stats.step % saving.save_interval() == 0);
      const bool last = stats.step == total;
      // A skipped step changed no parameter, and a run skipping steps may be failing: its
      // interval save waits for the next applied step, so that retention does not rotate the
      // checkpoints from before the trouble away. The end and a stop request save regardless.
      const bool saves = (interval_save_due_ && !stats.skipped) || (last && saving.save_at_end());
      if (interval_save_due_ && stats.skipped && !last && writes_) {
        console_ << absl::StrFormat("checkpoint of step %d deferred: the step was skipped\n",
                                    stats.step);
      }
      if (saves) {
        NF_RETURN_IF_ERROR(Save());
        interval_save_due_ = false;
      }
      if (last) break;
      NF_ASSIGN_OR_RETURN(const std::string reason, stops_.Check(stats.step, world));
      if (reason.empty()) continue;
      if (!saves) NF_RETURN_IF_ERROR(Save());
      NF_RETURN_IF_ERROR(checkpointer_.Finish(world));
      if (writes_) {
        console_ << absl::StrFormat(
            "stopping after step %d: %s; rerun the same command to resume (exit code %d)\n",
            stats.step, reason, kExitResume);
      }
      ReportOpTimes();
      return RunEnd::kStoppedToResume;
    }
    // The last save, if still being written, completes before the run ends.
    NF_RETURN_IF_ERROR(checkpointer_.Finish(world));
    NF_RETURN_IF_ERROR(MarkFinished(total));
    ReportOpTimes();
    return RunEnd::kFinished;
  }

 private:
  // With NF_OP_TIMING=1: rank 0's time per op over this run's steps (and validations).
  void ReportOpTimes() {
    if (!ops::OpTimingEnabled() || !writes_) return;
    console_ << absl::StrFormat("time per op on rank 0, steps %d-%d (NF_OP_TIMING=1):\n%s",
                                first_step_ + 1, trainer_->step(),
                                ops::FormatOpTimes(ops::TakeOpTimes()));
  }

  absl::Status PrepareRunDirectory() {
    if (!writes_) return absl::OkStatus();
    if (lock_ != nullptr) NF_RETURN_IF_ERROR(lock_->Take());
    std::error_code error;
    std::filesystem::create_directories(dir_, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot create run directory ", dir_.string(), ": ", error.message()));
    }
    // A run that starts has not finished, whatever an earlier one (with fewer train_iters) did.
    std::filesystem::remove(dir_ / kFinishedFile, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot remove ", (dir_ / kFinishedFile).string(), ": ", error.message()));
    }
    NF_ASSIGN_OR_RETURN(log_, JsonlLog::Open((dir_ / "log.jsonl").string()));
    NF_ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::Open(dir_ / "tensorboard"));
    if (config_.train().eval_interval() > 0) {
      NF_ASSIGN_OR_RETURN(validation_log_, JsonlLog::Open((dir_ / "validation.jsonl").string()));
    }
    return absl::OkStatus();
  }

  // Every rank records its communication ...
  void SetFlightRecorderCapacity() {
    parallel::FlightRecorder& recorder = parallel::FlightRecorder::Get();
    const int64_t entries = config_.parallel().flight_recorder_entries();
    if (recorder.capacity() != entries) recorder.SetCapacity(entries);
  }

  // ... and writes it to RUN/flight/ when asked or stuck (parallel/flight_dumps.h).
  absl::Status StartFlightDumps() {
    const parallel::Topology& t = trainer_->groups().topology;
    const std::vector<std::string>& hosts = trainer_->groups().hosts;
    NF_ASSIGN_OR_RETURN(const int64_t run_started_ns,
                        parallel::AgreeOnRunStart(*trainer_->world()));
    return parallel::StartFlightDumps(
        {.dir = dir_ / "flight",
         .world_rank = t.world_rank(),
         .world_size = t.world_size(),
         .run_started_ns = run_started_ns,
         .host = t.world_rank() < static_cast<int>(hosts.size()) ? hosts[t.world_rank()] : ""});
  }

  // RUN/finished.json once train_iters is reached and the last checkpoint is complete.
  absl::Status MarkFinished(int64_t train_iters) {
    if (!writes_) return absl::OkStatus();
    return ReplaceFileAtomically(dir_ / kFinishedFile, JsonObject()
                                                               .AddInt("step", trainer_->step())
                                                               .AddInt("train_iters", train_iters)
                                                               .ToString() +
                                                           "\n");
  }

  // RUN/config.pbtxt: the configuration this run trains with, every default spelt out.
  absl::Status WriteResolvedConfig() {
    if (!writes_) return absl::OkStatus();
    const std::string text = ResolvedConfigText(config_);
    // Indented four spaces: a code block in the text plugin's markdown.
    NF_RETURN_IF_ERROR(
        tensorboard_->Text(trainer_->step(), "config",
                           absl::StrCat("    ", absl::StrReplaceAll(text, {{"\n", "\n    "}}))));
    return ReplaceFileAtomically(dir_ / "config.pbtxt", text);
  }

  // Validation perplexity after `step` (0: the untrained model), into RUN/validation.jsonl and
  // the console.
  absl::Status Validate(int64_t step) {
    NF_ASSIGN_OR_RETURN(const double loss, trainer_->Evaluate());
    if (metrics_) metrics_->RecordValidation(loss);
    if (after_validation_) NF_RETURN_IF_ERROR(after_validation_(step, *trainer_));
    if (!writes_) return absl::OkStatus();
    NF_RETURN_IF_ERROR(tensorboard_->Scalars(
        step, {{"validation/loss", loss}, {"validation/ppl", std::exp(loss)}}));
    NF_RETURN_IF_ERROR(validation_log_->Write(JsonObject()
                                                  .AddInt("step", step)
                                                  .AddDouble("loss", loss)
                                                  .AddDouble("ppl", std::exp(loss))));
    console_ << absl::StrFormat("validation after step %d | loss %.4f | ppl %.2f\n", step, loss,
                                std::exp(loss));
    return absl::OkStatus();
  }

  void PrintHeader() {
    if (!writes_) return;
    const parallel::Topology& topology = trainer_->groups().topology;
    console_ << absl::StrFormat(
        "normformer: %d parameters, %s, training %d steps on %s into %s\n",
        trainer_->num_global_params(), TrainOptions::Precision_Name(config_.train().precision()),
        config_.train().train_iters(), trainer_->batches().Describe(), dir_.string());
    if (topology.world_size() > 1) {
      console_ << absl::StrFormat(
          "layout: %d ranks = tensor_parallel %d x pipeline_parallel %d x data_parallel %d, %s%s\n",
          topology.world_size(), topology.tp(), topology.pp(), topology.dp(),
          ParallelConfig::Schedule_Name(config_.parallel().pipeline_schedule()),
          config_.parallel().distributed_optimizer() ? ", distributed optimizer" : "");
      const std::vector<std::string>& hosts = trainer_->groups().hosts;
      console_ << parallel::DescribePlacement(topology, hosts) << "\n";
      if (topology.tp() > 1 &&
          parallel::GroupsSpanNodes(topology, parallel::GroupKind::kTensor, hosts)) {
        console_ << "normformer: warning: tensor-parallel groups span nodes: every layer's "
                    "all-reduces cross the network; give each node whole tp groups of "
                    "consecutive ranks (mpirun --map-by slot, srun --distribution=block)\n";
      }
    }
    console_ << absl::StrFormat(
        "MFU: model FLOPs (%s per token) against the GEMM ceiling measured now, %.4g TFLOP/s "
        "over %d rank(s) on %s\n",
        ModelFlopsFormula(config_.model()), job_ceiling_flops_ / 1e12, topology.world_size(),
        trainer_->device().ToString());
  }

  // Every rank measures its device's GEMM throughput at once (ranks sharing a machine share
  // it, as they share it while training); the job's ceiling is the sum.
  absl::Status MeasureCeiling() {
    NF_ASSIGN_OR_RETURN(
        const double flops,
        MeasureGemmFlops(trainer_->device(), ModelDType(config_.train().precision())));
    NF_ASSIGN_OR_RETURN(const Tensor sum, Tensor::HostZeros(DType::kF64, {1}));
    sum.data<double>()[0] = flops;
    NF_RETURN_IF_ERROR(trainer_->world()->AllReduce(sum, parallel::ReduceOp::kSum));
    job_ceiling_flops_ = sum.data<double>()[0];
    const model::ModelConfig& m = config_.model();
    flops_per_token_ =
        ModelFlopsPerToken(trainer_->num_global_params(), m, config_.train().seq_len());
    return absl::OkStatus();
  }

  void Announce(const std::filesystem::path& saved) {
    if (writes_) console_ << "saved checkpoint " << saved.string() << "\n";
  }

  // Saves (or, with async_save, starts saving) a checkpoint of the current step; the metrics
  // record how long training was blocked.
  absl::Status Save() {
    const auto start = std::chrono::steady_clock::now();
    parallel::Communicator& world = *trainer_->world();
    if (config_.checkpoint().async_save()) {
      NF_RETURN_IF_ERROR(
          checkpointer_.Start(trainer_->CheckpointState(), trainer_->Progress(), world));
      async_save_ = AsyncSaveBlock{.start_seconds = SecondsSince(start),
                                   .wait_before = trainer_->state_reader_wait_seconds(),
                                   .step = trainer_->step()};
    } else {
      NF_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(
          checkpoints_, trainer_->CheckpointState(), trainer_->Progress(), world,
          {.keep_last = config_.checkpoint().keep_last(),
           .keep_every = config_.checkpoint().keep_every()}));
      Announce(checkpoints_ / checkpoint::IterationDirName(trainer_->step()));
    }
    if (metrics_) metrics_->RecordCheckpointSave(SecondsSince(start), trainer_->step());
    return absl::OkStatus();
  }

  // An async save blocks training for its Start and for the wait of the next step's optimizer
  // update for the snapshot copy: once that step is done, the gauge gets both.
  void RecordAsyncSaveWait() {
    if (!async_save_) return;
    const double waited = trainer_->state_reader_wait_seconds() - async_save_->wait_before;
    if (metrics_) {
      metrics_->RecordCheckpointSave(async_save_->start_seconds + waited, async_save_->step);
    }
    async_save_.reset();
  }

  // Every rank serves its metrics when monitoring.enabled (monitoring/rank_metrics.h).
  absl::Status StartMetrics() {
    const monitoring::MonitoringConfig& config = config_.monitoring();
    if (!config.enabled()) return absl::OkStatus();
    const parallel::Topology& t = trainer_->groups().topology;
    int local_rank = 0;  // a job of one process needs no discovery (nor MPI)
    if (t.world_size() > 1) {
      NF_ASSIGN_OR_RETURN(local_rank, parallel::DiscoverLocalRank());
    }
    std::error_code error;  // absolute() needs the working directory, which may be gone
    const std::filesystem::path absolute = std::filesystem::absolute(dir_, error);
    const std::string job =
        config.job().empty() ? (error ? dir_ : absolute).filename().string() : config.job();
    NF_ASSIGN_OR_RETURN(metrics_, monitoring::RankMetrics::Serve(config,
                                                                 {.job = job,
                                                                  .rank = t.world_rank(),
                                                                  .tp_rank = t.tp_rank(),
                                                                  .pp_rank = t.pp_rank(),
                                                                  .dp_rank = t.dp_rank()},
                                                                 local_rank));
    RecordRunInfo(config_, *trainer_, *metrics_);
    if (writes_) {
      console_ << absl::StrFormat(
          "metrics: every rank serves /metrics on %s + its local rank (job label %s)\n",
          monitoring::HostAndPort(config.bind_address(), config.port_base()), job);
    }
    return absl::OkStatus();
  }

  void RecordMetrics(const StepStats& stats) {
    if (!metrics_) return;
    const double tokens_per_second =
        stats.seconds > 0 ? static_cast<double>(stats.tokens) / stats.seconds : 0.0;
    RecordStepMetrics(stats, *trainer_, tokens_per_second * flops_per_token_ / job_ceiling_flops_,
                      *metrics_);
  }

  // The log record of every step and, every log_interval steps, a progress line.
  absl::Status Report(const StepStats& stats) {
    if (!writes_) return absl::OkStatus();
    NF_RETURN_IF_ERROR(log_->Write(StepRecord(stats)));
    NF_RETURN_IF_ERROR(tensorboard_->Scalars(
        stats.step,
        {{"train/loss", stats.loss},
         {"train/ppl", std::exp(stats.loss)},
         {"train/lr", stats.lr},
         {"train/loss_scale", stats.loss_scale},
         {"train/grad_norm", stats.grad_norm},
         {"train/tokens_per_second", stats.seconds > 0 ? stats.tokens / stats.seconds : 0.0},
         {"train/skipped", stats.skipped ? 1.0 : 0.0},
         {"train/skipped_total", static_cast<double>(stats.skipped_total)}}));
    elapsed_ += stats.seconds;
    window_tokens_ += stats.tokens;
    window_seconds_ += stats.seconds;
    const int64_t total = config_.train().train_iters();
    if (stats.step % std::max(1, config_.train().log_interval()) != 0 && stats.step != total) {
      return absl::OkStatus();
    }
    const double eta = elapsed_ / static_cast<double>(stats.step - first_step_) *
                       static_cast<double>(total - stats.step);
    const double tokens_per_second = window_tokens_ / window_seconds_;
    console_ << absl::StrFormat(
        "step %d/%d | loss %.4f | ppl %.2f | lr %.3e | scale %g | grad_norm %.3f%s | "
        "%.0f tok/s | MFU %.1f%% | ETA %s\n",
        stats.step, total, stats.loss, std::exp(stats.loss), stats.lr, stats.loss_scale,
        stats.grad_norm, stats.skipped ? " (skipped)" : "", tokens_per_second,
        100.0 * tokens_per_second * flops_per_token_ / job_ceiling_flops_, Duration(eta));
    console_.flush();
    window_tokens_ = 0;
    window_seconds_ = 0.0;
    return absl::OkStatus();
  }

  // Seconds this rank has waited for communication so far, every group together.
  double CommWaitSeconds() const {
    double seconds = 0.0;
    for (const auto& [group, totals] : trainer_->CommTotals()) {
      for (double s : totals.seconds) seconds += s;
    }
    return seconds;
  }

  // Adds the step (and the communication wait within it) to this rank's interval and, at the
  // end of a log interval, gathers every
  // rank's (collective over the world; nothing in a job of one process): each rank's metrics
  // get its split, and rank 0 names the slowest and the fastest rank (straggler_report.h).
  absl::Status ReportStragglers(const StepStats& stats, double comm_wait, bool interval_ends) {
    parallel::Communicator& world = *trainer_->world();
    if (world.size() < 2) return absl::OkStatus();
    interval_.step += stats.seconds;
    interval_.comm_wait += comm_wait;
    interval_.data_wait += stats.data_seconds;
    interval_steps_ += 1;
    if (!interval_ends) return absl::OkStatus();
    NF_ASSIGN_OR_RETURN(const Tensor mine, Tensor::HostZeros(DType::kF64, {3}));
    NF_ASSIGN_OR_RETURN(const Tensor all, Tensor::HostZeros(DType::kF64, {3 * world.size()}));
    mine.data<double>()[0] = interval_.step;
    mine.data<double>()[1] = interval_.comm_wait;
    mine.data<double>()[2] = interval_.data_wait;
    NF_RETURN_IF_ERROR(world.AllGather(mine, all));
    const double steps = static_cast<double>(std::max<int64_t>(1, interval_steps_));
    if (metrics_) {
      metrics_->RecordStepSplit(interval_.compute() / steps, interval_.comm_wait / steps,
                                interval_.data_wait / steps);
    }
    interval_ = {};
    interval_steps_ = 0;
    if (!writes_) return absl::OkStatus();
    const parallel::Topology& topology = trainer_->groups().topology;
    std::vector<RankTimes> ranks(world.size());
    std::vector<int> stage(world.size());
    for (int r = 0; r < world.size(); ++r) {
      const double* t = all.data<double>() + 3 * r;
      ranks[r] = {.step = t[0], .comm_wait = t[1], .data_wait = t[2]};
      stage[r] = r / (topology.tp() * topology.dp());  // tp fastest, then dp, then pp
    }
    const StragglerReport report = FindStragglers(ranks, stage, config_.train().straggler_ratio());
    const std::vector<std::string>& hosts = trainer_->groups().hosts;
    const auto host_of = [&](int r) {
      return r < static_cast<int>(hosts.size()) ? hosts[r] : std::string();
    };
    const auto rank_record = [&](int r) {
      return JsonObject()
          .AddInt("rank", r)
          .AddString("host", host_of(r))
          .AddDouble("compute", ranks[r].compute() / steps)
          .AddDouble("comm_wait", ranks[r].comm_wait / steps)
          .AddDouble("data_wait", ranks[r].data_wait / steps);
    };
    NF_RETURN_IF_ERROR(tensorboard_->Scalars(
        stats.step, {{"stragglers/ratio", report.ratio},
                     {"stragglers/slowest_rank", static_cast<double>(report.slowest)}}));
    NF_RETURN_IF_ERROR(log_->Write(JsonObject()
                                       .AddString("event", "stragglers")
                                       .AddInt("step", stats.step)
                                       .AddObject("slowest", rank_record(report.slowest))
                                       .AddObject("fastest", rank_record(report.fastest))
                                       .AddDouble("ratio", report.ratio)
                                       .AddBool("flagged", report.flagged)));
    const auto describe = [&](int r) {
      return absl::StrFormat(
          "rank %d on %s (compute %.3g s, communication %.3g s, data %.3g s per step)", r,
          host_of(r), ranks[r].compute() / steps, ranks[r].comm_wait / steps,
          ranks[r].data_wait / steps);
    };
    console_ << absl::StrFormat("%s: slowest %s, fastest %s, ratio %.2f\n",
                                report.flagged ? "straggler" : "ranks", describe(report.slowest),
                                describe(report.fastest), report.ratio);
    return absl::OkStatus();
  }

  // What train.nan_origin's re-run of a step with non-finite gradients found: a log.jsonl event
  // and a console line (rank 0); CheckHealth's stop message says it too.
  absl::Status ReportNanOrigin(const StepStats& stats) {
    if (!stats.nan_origin || !writes_) return absl::OkStatus();
    const std::optional<NanOrigin>& origin = stats.nan_origin->first;
    JsonObject event = JsonObject()
                           .AddString("event", "nan_origin")
                           .AddInt("step", stats.step)
                           .AddBool("found", origin.has_value());
    if (origin) {
      const ops::NonFiniteOutput& out = origin->output;
      event.AddInt("rank", origin->world_rank)
          .AddString("rank_label", origin->rank_label)
          .AddInt("micro_batch", origin->micro_batch)
          .AddString("pass", origin->backward ? "backward" : "forward")
          .AddInt("stage", origin->stage)
          .AddString("where", out.where)
          .AddString("op", out.op)
          .AddString("output", out.output)
          .AddString("tensor", out.tensor)
          .AddInt("element", out.element)
          .AddString("value", ops::NonFiniteName(out.value))
          .AddInt("ranks_found", stats.nan_origin->ranks_found);
    }
    NF_RETURN_IF_ERROR(log_->Write(event));
    console_ << absl::StrFormat("non-finite gradients at step %d: %s\n", stats.step,
                                SummarizeNanOrigin(*stats.nan_origin));
    return absl::OkStatus();
  }

  // A spike (train.spike): a log.jsonl event, a console line and a metric on every action; under
  // ROLLBACK, the rollback. True when the trainer went back to an older step.
  absl::StatusOr<bool> ActOnSpike(const StepStats& stats) {
    const Spike& spike = *stats.spike;
    const SpikeConfig& config = config_.train().spike();
    if (metrics_) metrics_->RecordSpike(spike.metric);
    const std::string action = absl::AsciiStrToLower(SpikeConfig::Action_Name(config.action()));
    if (writes_) {
      NF_RETURN_IF_ERROR(tensorboard_->Scalars(
          stats.step, {{absl::StrCat("spikes/", spike.metric), spike.value}}));
      NF_RETURN_IF_ERROR(log_->Write(JsonObject()
                                         .AddString("event", "spike")
                                         .AddInt("step", stats.step)
                                         .AddString("metric", spike.metric)
                                         .AddDouble("value", spike.value)
                                         .AddDouble("median", spike.median)
                                         .AddDouble("limit", spike.limit)
                                         .AddString("action", action)));
      console_ << absl::StrFormat(
          "spike at step %d: %s %.6g above its limit %.6g (median %.6g of the last %d applied "
          "steps); action: %s\n",
          stats.step, spike.metric, spike.value, spike.limit, spike.median, config.window(),
          action);
    }
    if (config.action() != SpikeConfig::ROLLBACK) return false;
    return RollBack(stats);
  }

  // Every rank reloads the run's newest checkpoint, from before the spike (a spike step applies
  // nothing, so none is saved after it), and the run skips the samples from that checkpoint to
  // the end of the spike's batch: the steps in between replay as skipped. Without a checkpoint
  // of its own yet, the spike's update stays skipped and the run goes on.
  absl::StatusOr<bool> RollBack(const StepStats& stats) {
    parallel::Communicator& world = *trainer_->world();
    NF_RETURN_IF_ERROR(checkpointer_.Finish(world));
    absl::StatusOr<checkpoint::ResumePoint> point = checkpoint::FindResumePoint(checkpoints_);
    if (!point.ok() && !absl::IsNotFound(point.status())) return point.status();
    const int max_rollbacks = config_.train().spike().max_rollbacks();
    if (trainer_->rollbacks() >= max_rollbacks) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "a spike at step %d after %d rollbacks (train.spike.max_rollbacks %d): stopping; the "
          "last good checkpoint is %s; skip more data after it (train.skip_samples) or lower the "
          "learning rate, then rerun",
          stats.step, trainer_->rollbacks(), max_rollbacks,
          point.ok() ? point->dir.string() : "(none)"));
    }
    if (!point.ok()) {
      if (writes_) {
        console_ << absl::StrFormat(
            "no checkpoint to roll back to before step %d: its update stays skipped\n", stats.step);
      }
      return false;
    }
    if (point->manifest.step() >= stats.step) {
      return absl::InternalError(absl::StrCat("the newest checkpoint ", point->dir.string(),
                                              " is not from before the spike at step ",
                                              stats.step));
    }
    SampleWindow window;
    window.set_begin(point->manifest.consumed_samples());
    window.set_end(trainer_->consumed_samples());
    std::vector<SampleWindow> windows = trainer_->skipped_samples();
    windows.push_back(window);
    const int64_t rollbacks = trainer_->rollbacks() + 1;
    NF_RETURN_IF_ERROR(LoadOnEveryRank(*point, config_, checkpoints_, *trainer_));
    trainer_->SetSkippedSamples(std::move(windows), rollbacks);
    interval_save_due_ = false;
    if (metrics_) metrics_->RecordRollback();
    if (!writes_) return true;
    NF_RETURN_IF_ERROR(tensorboard_->Scalars(
        stats.step, {{"rollbacks/to_step", static_cast<double>(point->manifest.step())}}));
    NF_RETURN_IF_ERROR(log_->Write(JsonObject()
                                       .AddString("event", "rollback")
                                       .AddInt("step", stats.step)
                                       .AddString("checkpoint", point->dir.string())
                                       .AddInt("to_step", point->manifest.step())
                                       .AddObject("skipped_window", WindowRecord(window))
                                       .AddInt("rollbacks", rollbacks)));
    console_ << absl::StrFormat(
        "rolled back to %s (step %d) after the spike at step %d: samples [%d, %d) are skipped "
        "(rollback %d of at most %d)\n",
        point->dir.string(), point->manifest.step(), stats.step, window.begin(), window.end(),
        rollbacks, max_rollbacks);
    return true;
  }

  // Non-finite gradients (or an overflowing update) skip the step everywhere (the parameters
  // stay as they were); the run stops at the first with bf16 or fp32, where no loss scale can
  // make them finite again, and after max_consecutive_skipped with fp16, without saving: no
  // checkpoint is written during the skipped steps, so the newest that verifies holds the state
  // the trouble began in.
  absl::Status CheckHealth(const StepStats& stats) {
    const TrainOptions& train = config_.train();
    if (stats.skip_reason == optim::SkipReason::kSkippedData) return absl::OkStatus();
    consecutive_spikes_ =
        stats.skip_reason == optim::SkipReason::kSpike ? consecutive_spikes_ + 1 : 0;
    if (consecutive_spikes_ >= train.spike().max_consecutive()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%d spikes in a row up to step %d (train.spike.max_consecutive): the loss or gradient "
          "norm has moved, not spiked; stopping without saving; rerun with train.spike.action "
          "RECORD to train on, or ROLLBACK to skip the data",
          consecutive_spikes_, stats.step));
    }
    const bool troubled = stats.skip_reason == optim::SkipReason::kNonFiniteGradients ||
                          stats.skip_reason == optim::SkipReason::kUpdateOverflow;
    consecutive_skipped_ = troubled ? consecutive_skipped_ + 1 : 0;
    const bool fp16 = train.precision() == TrainOptions::FP16;
    const int64_t limit = fp16 ? std::max(1, train.max_consecutive_skipped()) : 1;
    if (consecutive_skipped_ < limit) return absl::OkStatus();
    // Every rank sees the same skipped steps, so all come here together and can commit the save
    // still in flight: it holds the state of an applied step, from before the trouble, and is
    // the checkpoint a rerun should resume from.
    NF_RETURN_IF_ERROR(checkpointer_.Finish(*trainer_->world()));
    // The checkpoint a rerun would resume from (every checkpoint holds finite state).
    const absl::StatusOr<checkpoint::ResumePoint> good = checkpoint::FindResumePoint(checkpoints_);
    std::string named = "(none: the run has not saved one)";
    if (good.ok()) named = good->dir.string();
    if (!good.ok() && !absl::IsNotFound(good.status())) {
      named = absl::StrCat("(none: ", good.status().message(), ")");
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s at step %d (%s%s): stopping%s; the last good checkpoint is %s",
        stats.skip_reason == optim::SkipReason::kUpdateOverflow
            ? "an update overflowing the model dtype"
            : "non-finite gradients",
        stats.step, TrainOptions::Precision_Name(train.precision()),
        fp16 ? absl::StrFormat(", %d consecutive skipped steps, loss scale %g",
                               consecutive_skipped_, stats.loss_scale)
             : "",
        stats.nan_origin ? absl::StrCat(" (", SummarizeNanOrigin(*stats.nan_origin), ")") : "",
        named));
  }

  AfterValidation after_validation_;
  RunDirLock* lock_;  // rank 0 of nf-launch: taken once the resume has loaded
  TrainConfig config_;
  std::filesystem::path dir_, checkpoints_;
  std::ostream& console_;
  std::unique_ptr<Trainer> trainer_;
  bool writes_;
  std::optional<JsonlLog> log_, validation_log_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0: RUN/tensorboard/
  checkpoint::AsyncCheckpointer checkpointer_;
  StopRequests stops_;
  int64_t first_step_ = 0;
  int64_t consecutive_skipped_ = 0;  // for non-finite gradients or an overflowing update
  int64_t consecutive_spikes_ = 0;   // skipped for a spike (SKIP)
  RankTimes interval_;               // this rank's seconds over the log interval so far
  int64_t interval_steps_ = 0;
  bool interval_save_due_ = false;  // deferred by skipped steps
  double elapsed_ = 0.0;
  double job_ceiling_flops_ = 0.0;  // the GEMM ceiling summed over ranks (MeasureCeiling)
  double flops_per_token_ = 0.0;
  std::unique_ptr<monitoring::RankMetrics> metrics_;  // when monitoring.enabled
  int64_t window_tokens_ = 0;
  double window_seconds_ = 0.0;

  struct AsyncSaveBlock {
    double start_seconds;  // AsyncCheckpointer::Start
    double wait_before;    // Trainer::state_reader_wait_seconds() when it returned
    int64_t step;
  };
  std::optional<AsyncSaveBlock> async_save_;  // until the step after the save is done
};

}  // namespace

absl::StatusOr<RunEnd> RunTraining(const TrainConfig& config, const std::string& run_dir,
                                   std::ostream& console, parallel::ProcessGroups* groups,
                                   AfterValidation after_validation, RunDirLock* lock) {
  std::unique_ptr<Trainer> trainer;
  if (groups != nullptr) {
    NF_ASSIGN_OR_RETURN(trainer, Trainer::Create(config, *groups));
  } else {
    NF_ASSIGN_OR_RETURN(trainer, Trainer::Create(config));
  }
  TrainingRun run(config, run_dir, console, std::move(trainer), std::move(after_validation), lock);
  return run.Run();
}

}  // namespace nf::launcher
