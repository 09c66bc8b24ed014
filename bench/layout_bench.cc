// nf-bench-layout: one (tensor, pipeline, data)-parallel layout of a real training run, under
// mpirun: the median step time over the timed steps, and the bytes each rank's communicators
// moved per step, by group, next to what the formulas below predict for that rank (the row
// fails loudly when they differ). bench/layouts.sh runs every layout and tabulates the step
// times relative to the single-rank run of the same config.
//
//   mpirun -np 4 build/bench/nf-bench-layout --config deploy/configs/tiny.pbtxt
//       --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2 [--steps N]
//       [--send-peaks 4,16,64] [--links] [--compare-overlap]
//
// --links: afterwards, for each group of rank 0 with more than one member (tp, pp, dp), a row
// saying whether it spans nodes, its bytes and communication wait per step in the run above,
// and what its links deliver (bench/group_links.h): all-reduce latency (8 bytes) and bus
// bandwidth (4 MiB), send/recv latency and bandwidth between its first two members. Across
// nodes this shows what the layout sends over the network and what that costs.
//
// --compare-overlap: afterwards, two fresh trainers of the same layout, one with the overlapped
// reductions off (parallel.overlap_tensor_parallel_comm, parallel.overlap_grad_reduce) and one
// with them on, step alternately (--steps each); rank 0 prints the median seconds per step its tp
// and dp groups waited for communication and the median step time of each, and the share of the
// wait that overlap hid: 1 - on / off ("before vs after, same run"; docs/parallelism.md).
//
// --send-peaks M1,M2,...: afterwards, for each M, one training step of a fresh trainer with M
// micro-batches per data-parallel rank (the global batch scaled to match) and one evaluation,
// printing every rank's peak of pipeline sends pending at once and their bytes
// (PipelineExecutor::Result) next to its send window: the bound that keeps them independent
// of M (docs/performance.md, "Pipeline send buffers").
//
// Bytes per step of one rank (T = micro_batch x seq_len tokens, d = d_model, s = bytes of the
// model dtype, m = micro-batches per data-parallel rank, n_c = chunk c's padded flat buffer,
// as the Communicator counts payloads: communicator.h):
//   tp         per micro-batch and chunk: embedding output T d s (first stage); per layer
//              2 T d s forward and 2 T d s backward (out_proj, fc2; q/k/v and fc1 input
//              gradients), plus LN_ffn_mid's statistics T 2 8 and sums T 2 4 with scale_fc
//              and tp > 1;
//              the loss's row max and sums 3 T 4 and the head's input gradient T d s (last);
//              with sequence parallelism (model/tensor_parallel.h) each [T, d] all-reduce
//              becomes a reduce-scatter or all-gather of the same count, and the backward
//              gathers again the inputs it needs (per layer the q/k/v and fc1 inputs, the
//              head's input on the last stage, the embedding's output gradient on the first):
//              per layer 4 T d s forward and 6 T d s backward, last stage + T d s forward and
//              2 T d s backward, first stage + T d s backward; plus once per step the sum of
//              the replicated gradients this rank holds after the dp reduction (4 bytes each)
//   pp         Ts d s per activation sent or received and per gradient sent or received
//              (Ts = T, or T / tp with sequence parallelism)
//   dp         replicated: all-reduce 4 n_c per chunk; ZeRO-1: reduce-scatter 4 n_c and
//              all-gather s n_c
//   embedding  4 x the tied embedding shard (V_pad / tp x d) on the first and last stages
//   mp, world  the squared norm 8 (mp; world with ZeRO-1), the non-finite flag 4, the
//              update-overflow and spike flags 8 (a step not skipped for non-finite gradients)
//              and the loss and token count 16 (world)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/group_links.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/trainer.h"
#include "model/vocab.h"
#include "parallel/mpi_runtime.h"
#include "parallel/placement.h"
#include "parallel/process_groups.h"

namespace nf::bench {
namespace {

using parallel::Action;
using parallel::GroupKind;

struct Expected {
  int64_t bytes[static_cast<int>(GroupKind::kCount) + 1] = {};  // + world
};
constexpr int kWorld = static_cast<int>(GroupKind::kCount);

absl::StatusOr<Expected> Formulas(launcher::Trainer& trainer, const launcher::TrainConfig& config) {
  const model::ModelConfig& model = config.model();
  const launcher::TrainOptions& train = config.train();
  const parallel::Topology& topology = trainer.groups().topology;
  const int64_t t = int64_t{train.micro_batch_size()} * train.seq_len(), d = model.d_model();
  const int64_t s = static_cast<int64_t>(SizeOf(launcher::ModelDType(train.precision())));
  // LN_ffn_mid spans the ffn columns every tp rank holds a share of: its statistics are
  // all-reduced only when there is more than one share.
  const bool sharded_mid_norm = model.normformer().scale_fc() && topology.tp() > 1;
  const bool sequence_parallel = config.parallel().sequence_parallel() && topology.tp() > 1;
  const int64_t ts = sequence_parallel ? t / topology.tp() : t;
  // The [T, d] collectives of a layer's forward and backward, of the head's and the embedding's.
  const int64_t layer_forward = sequence_parallel ? 4 : 2,
                layer_backward = sequence_parallel ? 6 : 2;
  const int64_t head_forward = sequence_parallel ? 1 : 0, head_backward = sequence_parallel ? 2 : 1;
  const int64_t embedding_backward = sequence_parallel ? 1 : 0;
  Expected e;
  auto& tp = e.bytes[static_cast<int>(GroupKind::kTensor)];
  auto& pp = e.bytes[static_cast<int>(GroupKind::kPipeline)];
  for (const Action& a : trainer.executor().schedule()) {
    const model::NormFormerModel& chunk = *trainer.chunks()[a.model_chunk];
    const int64_t layers = chunk.placement().layer_end - chunk.placement().layer_begin;
    if (a.kind == Action::kForward) {
      if (chunk.placement().first()) tp += t * d * s;
      tp += layers * (layer_forward * t * d * s + (sharded_mid_norm ? t * 2 * 8 : 0));
      if (chunk.placement().last()) tp += head_forward * t * d * s + 3 * t * 4;
    } else if (a.kind == Action::kBackward) {
      tp += layers * (layer_backward * t * d * s + (sharded_mid_norm ? t * 2 * 4 : 0));
      if (chunk.placement().last()) tp += head_backward * t * d * s;
      if (chunk.placement().first()) tp += embedding_backward * t * d * s;
    } else {
      pp += ts * d * s;  // every send and receive moves one hidden state
    }
  }
  for (size_t c = 0; c < trainer.chunks().size(); ++c) {
    for (const optim::FlatRange& r : trainer.chunks()[c]->SequenceParallelGradRanges()) {
      NF_ASSIGN_OR_RETURN(const std::vector<Tensor> pieces,
                          trainer.optimizer(static_cast<int>(c)).ReducedGrads(r.offset, r.length));
      for (const Tensor& piece : pieces) tp += 4 * piece.numel();
    }
  }
  const bool zero = config.parallel().distributed_optimizer();
  for (const auto& chunk : trainer.chunks()) {
    const int64_t n = chunk->params().num_elements();
    e.bytes[static_cast<int>(GroupKind::kData)] += zero ? 4 * n + s * n : 4 * n;
    if (!chunk->embedding_group_params().empty()) {
      e.bytes[static_cast<int>(GroupKind::kEmbedding)] +=
          4 * model::PaddedVocabSize(model.vocab_size(), topology.tp()) / topology.tp() * d;
    }
  }
  e.bytes[zero ? kWorld : static_cast<int>(GroupKind::kModel)] += 8;
  e.bytes[kWorld] += 4 + 8 + 16;  // the timed steps are not skipped
  return e;
}

int64_t Measured(const parallel::Communicator* comm) {
  return comm == nullptr ? 0 : comm->stats().total_bytes();
}

// Prints `row` of every rank, in rank order.
absl::Status PrintInRankOrder(const parallel::ProcessGroups& groups, const std::string& row) {
  for (int r = 0; r < groups.topology.world_size(); ++r) {
    NF_RETURN_IF_ERROR(groups.world->Barrier());
    if (r == groups.topology.world_rank()) {
      std::printf("%s\n", row.c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

// Per M: a fresh trainer with M micro-batches per data-parallel rank, one training step and one
// evaluation; every rank's peak pending pipeline sends and bytes, and its window.
absl::Status SendPeaks(const launcher::TrainConfig& base, parallel::ProcessGroups& groups,
                       const std::vector<int>& micro_batches) {
  const parallel::Topology& topology = groups.topology;
  NF_RETURN_IF_ERROR(groups.world->Barrier());  // after every rank's row above
  if (topology.world_rank() == 0) {
    std::printf(
        "\n| m | rank | pp rank | window | train: peak sends | peak send bytes | eval: peak sends "
        "| peak send bytes |\n|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  for (const int m : micro_batches) {
    launcher::TrainConfig config = base;
    launcher::TrainOptions& train = *config.mutable_train();
    train.set_global_batch_size(m * topology.dp() * train.micro_batch_size());
    train.set_eval_iters(1);
    NF_ASSIGN_OR_RETURN(std::unique_ptr<launcher::Trainer> trainer,
                        launcher::Trainer::Create(config, groups));
    NF_ASSIGN_OR_RETURN(const launcher::StepStats stats, trainer->TrainStep());
    NF_RETURN_IF_ERROR(trainer->Evaluate().status());
    const launcher::PipelineExecutor::Result& eval = trainer->executor().last_result();
    NF_RETURN_IF_ERROR(PrintInRankOrder(
        groups,
        absl::StrFormat("| %d | %d | %d | %d | %d | %d | %d | %d |", m, topology.world_rank(),
                        topology.pp_rank(), trainer->executor().send_window(),
                        stats.peak_pipeline_sends, stats.peak_pipeline_send_bytes,
                        eval.peak_live_sends, eval.peak_send_bytes)));
  }
  return absl::OkStatus();
}

// --links: one row per group of rank 0 (every rank measures its own groups alike).
absl::Status Links(parallel::ProcessGroups& groups, int steps) {
  const parallel::Topology& topology = groups.topology;
  NF_RETURN_IF_ERROR(groups.world->Barrier());  // after every rank's row above
  if (topology.world_rank() == 0) {
    std::printf(
        "\n%s\n\n| group | ranks | across nodes | bytes / step | wait s / step | all-reduce 8 B "
        "µs | all-reduce 4 MiB bus GB/s | send/recv 8 B µs | send/recv 4 MiB GB/s |\n"
        "|---|---|---|---|---|---|---|---|---|\n",
        parallel::DescribePlacement(topology, groups.hosts).c_str());
    std::fflush(stdout);
  }
  for (const GroupKind kind : {GroupKind::kTensor, GroupKind::kPipeline, GroupKind::kData}) {
    parallel::Communicator& group = *groups.group(kind);
    if (group.size() < 2) continue;
    const parallel::CommStats& run = group.stats();  // the timed steps' traffic
    const int64_t bytes = run.total_bytes() / steps;
    double wait = 0;
    for (const double s : run.seconds) wait += s;
    NF_ASSIGN_OR_RETURN(const LinkFigures links, MeasureGroupLinks(group));
    if (topology.world_rank() != 0) continue;
    std::printf("| %s | %s | %s | %lld | %.4f | %.1f | %.2f | %.1f | %.2f |\n",
                std::string(parallel::GroupKindName(kind)).c_str(),
                absl::StrJoin(topology.group(kind), ", ").c_str(),
                parallel::GroupsSpanNodes(topology, kind, groups.hosts) ? "yes" : "no",
                static_cast<long long>(bytes), wait / steps, links.all_reduce_small_us,
                links.all_reduce_bus_gbytes, links.send_recv_small_us, links.send_recv_gbytes);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

double TotalSeconds(const parallel::CommStats& stats) {
  double seconds = 0;
  for (double s : stats.seconds) seconds += s;
  return seconds;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

absl::Status CompareOverlap(launcher::TrainConfig config, parallel::ProcessGroups& groups,
                            int steps) {
  std::unique_ptr<launcher::Trainer> trainers[2];
  for (const bool overlap : {false, true}) {
    config.mutable_parallel()->set_overlap_tensor_parallel_comm(overlap);
    config.mutable_parallel()->set_overlap_grad_reduce(overlap);
    NF_ASSIGN_OR_RETURN(trainers[overlap], launcher::Trainer::Create(config, groups));
    NF_RETURN_IF_ERROR(trainers[overlap]->TrainStep().status());  // warm-up
  }
  std::vector<double> tp_wait[2], dp_wait[2], step[2];
  for (int i = 0; i < steps; ++i) {
    for (const bool overlap : {false, true}) {
      const double tp_before = TotalSeconds(groups.tp->stats());
      const double dp_before = TotalSeconds(groups.dp->stats());
      NF_ASSIGN_OR_RETURN(const launcher::StepStats stats, trainers[overlap]->TrainStep());
      tp_wait[overlap].push_back(TotalSeconds(groups.tp->stats()) - tp_before);
      dp_wait[overlap].push_back(TotalSeconds(groups.dp->stats()) - dp_before);
      step[overlap].push_back(stats.seconds);
    }
  }
  if (groups.topology.world_rank() != 0) return absl::OkStatus();
  std::printf("| overlap | tp wait s/step | dp wait s/step | step s |\n|---|---|---|---|\n");
  for (const bool overlap : {false, true}) {
    std::printf("| %s | %.5f | %.5f | %.4f |\n", overlap ? "on" : "off", Median(tp_wait[overlap]),
                Median(dp_wait[overlap]), Median(step[overlap]));
  }
  const auto hidden = [](double off, double on) { return off > 0 ? 100 * (1 - on / off) : 0.0; };
  std::printf("communication wait hidden by overlap: tp %.0f%%, dp %.0f%%\n",
              hidden(Median(tp_wait[0]), Median(tp_wait[1])),
              hidden(Median(dp_wait[0]), Median(dp_wait[1])));
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  std::string config_path = "deploy/configs/tiny.pbtxt";
  std::vector<std::string> overrides;
  int steps = 10;
  std::vector<int> send_peaks;
  bool links = false, compare_overlap = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--links") {
      links = true;
      continue;
    }
    if (flag == "--compare-overlap") {
      compare_overlap = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--config") {
      config_path = value;
    } else if (flag == "--set") {
      overrides.push_back(value);
    } else if (flag == "--steps") {
      steps = std::atoi(value);
    } else if (flag == "--send-peaks") {
      for (absl::string_view m : absl::StrSplit(value, ',')) {
        int count = 0;
        if (!absl::SimpleAtoi(m, &count) || count < 1) {
          return absl::InvalidArgumentError(absl::StrCat("--send-peaks: bad count '", m, "'"));
        }
        send_peaks.push_back(count);
      }
    } else {
      return absl::InvalidArgumentError("unknown flag " + flag);
    }
  }
  NF_ASSIGN_OR_RETURN(launcher::TrainConfig config,
                      launcher::LoadTrainConfig(config_path, overrides));
  NF_ASSIGN_OR_RETURN(parallel::ProcessGroups groups,
                      parallel::CreateProcessGroups(launcher::ParallelSizesOf(config.parallel()),
                                                    {.watchdog = {.timeout = absl::Seconds(120)}}));
  NF_ASSIGN_OR_RETURN(std::unique_ptr<launcher::Trainer> trainer,
                      launcher::Trainer::Create(config, groups));
  NF_RETURN_IF_ERROR(trainer->TrainStep().status());  // warm-up: allocations, first touches

  parallel::Communicator* comms[] = {groups.tp.get(), groups.dp.get(),        groups.pp.get(),
                                     groups.mp.get(), groups.embedding.get(), groups.world.get()};
  for (parallel::Communicator* c : comms) {
    if (c != nullptr) c->ResetStats();
  }
  std::vector<double> seconds;
  for (int i = 0; i < steps; ++i) {
    NF_ASSIGN_OR_RETURN(const launcher::StepStats stats, trainer->TrainStep());
    seconds.push_back(stats.seconds);
  }
  std::sort(seconds.begin(), seconds.end());
  NF_ASSIGN_OR_RETURN(const Expected expected, Formulas(*trainer, config));
  std::vector<std::string> cells;
  bool all_match = true;
  for (int k = 0; k <= kWorld; ++k) {
    const int64_t measured = Measured(comms[k]) / steps;
    all_match = all_match && measured == expected.bytes[k];
    cells.push_back(absl::StrFormat("%d%s", measured, measured == expected.bytes[k] ? "" : "(!)"));
  }
  const parallel::Topology& topology = groups.topology;
  const std::string row = absl::StrFormat(
      "| %d | %d | %d | %s%s | %d | %.4f | %s |", topology.tp(), topology.pp(), topology.dp(),
      launcher::ParallelConfig::Schedule_Name(config.parallel().pipeline_schedule()),
      config.parallel().distributed_optimizer() ? " ZeRO-1" : "", topology.world_rank(),
      seconds[seconds.size() / 2], absl::StrJoin(cells, " | "));
  NF_RETURN_IF_ERROR(PrintInRankOrder(groups, row));
  if (!all_match) {
    return absl::InternalError(
        absl::StrCat(topology.ToString(), ": measured bytes differ from the formulas (!)"));
  }
  if (links) NF_RETURN_IF_ERROR(Links(groups, steps));
  if (!send_peaks.empty()) NF_RETURN_IF_ERROR(SendPeaks(config, groups, send_peaks));
  if (compare_overlap) NF_RETURN_IF_ERROR(CompareOverlap(config, groups, steps));
  return absl::OkStatus();
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) {
  const absl::Status status = nf::bench::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench-layout: %s\n", std::string(status.message()).c_str());
    nf::parallel::AbortJob(1);
  }
  return 0;
}
