#include "launcher/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "launcher/config.h"
#include "launcher/gemm_ceiling.h"
#include "launcher/plan_compute.h"
#include "launcher/plan_options.h"
#include "launcher/trainer.h"
#include "model/normformer_params.h"
#include "model/vocab.h"

namespace nf::launcher {
namespace {

int64_t GlobalParameters(const model::ModelConfig& m, int tp) {
  int64_t n = 0;
  for (const model::ParamSpec& spec :
       model::NormFormerParamSpecs(m, model::PaddedVocabSize(m.vocab_size(), tp))) {
    n += NumElements(spec.global_shape);
  }
  return n;
}

// Seconds of a ring collective moving `factor` x (g - 1) / g of `bytes` per GPU, plus its
// latency.
double RingSeconds(double factor, int g, double bytes, double bytes_per_second, double latency) {
  return g > 1 ? latency + factor * (g - 1) / g * bytes / bytes_per_second : 0.0;
}

// The NVLink bandwidth NCCL reaches, bytes a second.
double NvlinkBytesPerSecond(const ClusterSpec& cluster) {
  return cluster.nvlink_bytes_per_second * cluster.nvlink_efficiency;
}

std::vector<int> Divisors(int n, int at_most) {
  std::vector<int> out;
  for (int k = 1; k <= std::min(n, at_most); ++k) {
    if (n % k == 0) out.push_back(k);
  }
  return out;
}

}  // namespace

absl::Status ApplyGpuPreset(const std::string& name, ClusterSpec& cluster) {
  struct Preset {
    const char* name;
    double memory, hbm, peak, gemm_efficiency;
    int sms;
    double nvlink, network;
  };
  static constexpr Preset kPresets[] = {
      {"h200", 141e9, 4.8e12, 989e12, 0.8, 132, 450e9, 50e9},
      {"h100", 80e9, 3.35e12, 989e12, 0.8, 132, 450e9, 50e9},
      {"a100", 80e9, 2.04e12, 312e12, 0.86, 108, 300e9, 25e9},
  };
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    cluster.gpu_memory_bytes = p.memory;
    cluster.hbm_bytes_per_second = p.hbm;
    cluster.peak_flops = p.peak;
    cluster.gemm_efficiency = p.gemm_efficiency;
    cluster.sm_count = p.sms;
    cluster.nvlink_bytes_per_second = p.nvlink;
    cluster.network_bytes_per_second = p.network;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--gpu: '", name, "' is not h200, h100 or a100"));
}

namespace {

// ModelStepTime with the model's parameter count given: the search counts it once per tensor-
// parallel size (a walk over every layer's parameters), not once per layout.
absl::StatusOr<StepTime> StepTimeOf(const TrainConfig& config, const ClusterSpec& cluster,
                                    int64_t params) {
  const model::ModelConfig& m = config.model();
  const TrainOptions& train = config.train();
  const ParallelConfig& parallel = config.parallel();
  const int world = cluster.world_size();
  const int tp = parallel.tensor_parallel(), pp = parallel.pipeline_parallel();
  const int v = parallel.virtual_stages(), dp = world / (tp * pp);
  NF_ASSIGN_OR_RETURN(const int micro_batches, MicroBatchesPerRank(train, dp));
  const double s = static_cast<double>(SizeOf(ModelDType(train.precision())));
  const double seq = train.seq_len(), d = m.d_model(), layers = m.num_layers();
  const double micro_tokens = static_cast<double>(train.micro_batch_size()) * seq;  // T
  const model::Recompute recompute = RecomputeOf(train);
  const MicroBatchWork work = EstimateMicroBatchWork(config, cluster);
  // The recomputed forward: a layer's whole forward, or its attention core's.
  double recomputed = 0;
  if (recompute == model::Recompute::kFull) recomputed = work.layer_forward;
  if (recompute == model::Recompute::kSelective) recomputed = work.attention_forward;
  const double layers_here = layers / pp;
  const double layer_backward = work.layer_backward + recomputed;
  // The slowest stage's: the last one's layers and the head (1F1B runs every stage at its pace;
  // the stages split the layers evenly and the first stage's embedding is a lookup).
  const double micro_batch =
      layers_here * (work.layer_forward + layer_backward) + work.head_forward + work.head_backward;
  StepTime time;
  time.compute = micro_batches * micro_batch;
  const double local_params = static_cast<double>(params) / (tp * pp);
  time.optimizer = OptimizerSeconds(
      parallel.distributed_optimizer() ? local_params / dp : local_params, s, cluster);
  if (pp > 1) time.bubble = time.compute * (pp - 1) / (v * micro_batches);

  // Per layer and micro-batch, the weight-gradient GEMMs the backward's tp reductions hide behind.
  const double weight_grads = work.layer_weight_grads;
  const bool sp = parallel.sequence_parallel() && tp > 1;
  if (tp > 1) {
    const double bytes = micro_tokens * d * s, link = NvlinkBytesPerSecond(cluster);
    const double latency = cluster.collective_latency_seconds;
    const double all_reduce = RingSeconds(2, tp, bytes, link, latency);
    const double half = RingSeconds(1, tp, bytes, link, latency);
    // Forward: two all-reduces, or two all-gathers and two reduce-scatters. Backward: the
    // column-parallel input-gradient reductions (and the input gathers) hide behind the weight
    // gradients; the row-parallel output-gradient gathers do not.
    const double forward = sp ? 4 * half : 2 * all_reduce;
    const double hideable = sp ? 4 * half : 2 * all_reduce, fixed = sp ? 2 * half : 0.0;
    const double exposed =
        cluster.overlap_communication ? std::max(0.0, hideable - weight_grads) : hideable;
    const double per_layer =
        forward * (recompute == model::Recompute::kFull ? 2 : 1) + fixed + exposed;
    time.tp = per_layer * layers_here * micro_batches;
  }
  if (dp > 1) {
    // The dp group of a pipeline rank is tp x dp consecutive ranks.
    const double link = tp * dp <= cluster.gpus_per_node ? NvlinkBytesPerSecond(cluster)
                                                         : cluster.network_bytes_per_second;
    const double local = local_params;
    const double buckets = std::ceil(local / static_cast<double>(parallel.grad_bucket_elements()));
    const double latency = buckets * cluster.collective_latency_seconds;
    double reduce = 0, after = 0;
    if (parallel.distributed_optimizer()) {
      reduce = RingSeconds(1, dp, 4 * local, link, latency);
      after = RingSeconds(1, dp, s * local, link, latency);
    } else {
      reduce = RingSeconds(2, dp, 4 * local, link, latency);
    }
    const double last_backward =
        cluster.overlap_communication ? layers_here * layer_backward + work.head_backward : 0.0;
    time.dp = std::max(0.0, reduce - last_backward) + after;
    time.dp_hidden = std::min(reduce, last_backward);
  }
  if (pp > 1) {
    const double link = world <= cluster.gpus_per_node ? NvlinkBytesPerSecond(cluster)
                                                       : cluster.network_bytes_per_second;
    const double bytes = (sp ? micro_tokens / tp : micro_tokens) * d * s;
    time.pp = 2.0 * micro_batches * v * (cluster.collective_latency_seconds + bytes / link);
  }
  return time;
}

}  // namespace

absl::StatusOr<StepTime> ModelStepTime(const TrainConfig& config, const ClusterSpec& cluster) {
  NF_RETURN_IF_ERROR(ValidateCluster(cluster));
  return StepTimeOf(config, cluster,
                    GlobalParameters(config.model(), config.parallel().tensor_parallel()));
}

absl::StatusOr<std::vector<PlannedLayout>> PlanLayouts(const TrainConfig& base,
                                                       const ClusterSpec& cluster) {
  NF_RETURN_IF_ERROR(ValidateTrainConfig(base));
  NF_RETURN_IF_ERROR(ValidateCluster(cluster));
  if (base.train().global_batch_size() > kMaxGlobalBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.global_batch_size (", base.train().global_batch_size(),
                     ") is beyond what nf-plan searches: at most ", kMaxGlobalBatch,
                     " sequences (published LM batches are a few thousand)"));
  }
  const model::ModelConfig& m = base.model();
  const int world = cluster.world_size();
  const int64_t global_batch = base.train().global_batch_size();
  const double budget = cluster.gpu_memory_bytes * cluster.memory_headroom;
  double smallest = std::numeric_limits<double>::infinity();
  // The most GPUs any (tp, pp) this search visits could share the global batch over (micro-batch
  // 1): for the refusal when the world is too large for the batch.
  int64_t most_gpus = 0;
  bool splits = false;           // some layout's data-parallel ranks share the batch evenly
  bool too_many_passes = false;  // some that split run over kMaxStepPasses passes a step
  absl::Status first_refusal;    // of a layout that splits, the first reason it was not estimated
  std::vector<PlannedLayout> layouts;
  // The search's cost does not grow with the world (plan_options.h): tp ranges over divisors of
  // at most kMaxGpusPerNode, pp over the layers' divisors, and a layout is only built and
  // estimated when its data-parallel size divides the batch (so dp <= the global batch; the
  // memory estimate's topology is linear in dp).
  for (const int tp : Divisors(cluster.gpus_per_node, m.num_heads())) {
    if (m.num_heads() % tp != 0 || m.ffn_dim() % tp != 0) continue;
    const int64_t params = GlobalParameters(m, tp);
    for (const int pp : Divisors(m.num_layers(), m.num_layers())) {
      most_gpus = std::max(most_gpus, global_batch * tp * pp);
      if (world % (tp * pp) != 0) continue;
      const int dp = world / (tp * pp);
      for (const int v : {1, 2, 4}) {
        if ((v > 1 && pp == 1) || m.num_layers() % (pp * v) != 0) continue;
        for (const bool zero : {false, true}) {
          if (zero && dp == 1) continue;
          for (const bool sp : {false, true}) {
            if (sp && tp == 1) continue;
            for (const char* recompute : {"NONE", "SELECTIVE", "FULL"}) {
              for (const int micro : {1, 2, 4, 8, 16}) {
                if (global_batch % (int64_t{dp} * micro) != 0) continue;  // does not split
                splits = true;
                const int64_t passes = int64_t{pp} * v * (global_batch / (int64_t{dp} * micro));
                if (passes > kMaxStepPasses) {  // a step of that many passes: skipped (its cost)
                  too_many_passes = true;
                  continue;
                }
                PlannedLayout layout;
                layout.overrides = {absl::StrCat("parallel.tensor_parallel=", tp),
                                    absl::StrCat("parallel.pipeline_parallel=", pp),
                                    absl::StrCat("train.micro_batch_size=", micro),
                                    absl::StrCat("train.recompute=", recompute)};
                if (v > 1) {
                  layout.overrides.push_back("parallel.pipeline_schedule=INTERLEAVED_ONE_F_ONE_B");
                  layout.overrides.push_back(absl::StrCat("parallel.virtual_stages=", v));
                }
                if (zero) layout.overrides.push_back("parallel.distributed_optimizer=true");
                if (sp) layout.overrides.push_back("parallel.sequence_parallel=true");
                layout.config = base;
                layout.config.mutable_train()->set_activation_recompute(false);
                absl::Status valid;
                for (const std::string& o : layout.overrides) {
                  if (valid.ok()) valid = ApplyOverride(o, &layout.config);
                }
                if (valid.ok()) valid = ValidateTrainConfig(layout.config);
                // Estimated as the GPU run it plans: with the CUDA runtime's own memory (the
                // cuBLASLt workspace, NCCL's buffers, cuDNN attention's backward workspace).
                TrainConfig on_gpus = layout.config;
                on_gpus.mutable_train()->set_device(TrainOptions::CUDA);
                absl::StatusOr<std::vector<PipelineRankMemory>> memory =
                    valid.ok() ? EstimateMemory(on_gpus, world)
                               : absl::StatusOr<std::vector<PipelineRankMemory>>(valid);
                if (!memory.ok()) {
                  if (first_refusal.ok()) first_refusal = memory.status();
                  continue;
                }
                for (const PipelineRankMemory& rank : *memory) {
                  layout.peak_device_bytes =
                      std::max(layout.peak_device_bytes, rank.device_bytes());
                }
                smallest = std::min(smallest, layout.peak_device_bytes);
                if (layout.peak_device_bytes > budget) continue;
                NF_ASSIGN_OR_RETURN(layout.time, StepTimeOf(layout.config, cluster, params));
                const TrainOptions& train = layout.config.train();
                const double model_flops = ModelFlopsPerToken(params, m, train.seq_len()) *
                                           train.global_batch_size() * train.seq_len();
                layout.mfu = model_flops / layout.time.total() / (world * cluster.peak_flops);
                layouts.push_back(std::move(layout));
              }
            }
          }
        }
      }
    }
  }
  if (layouts.empty() && !splits) {
    // No layout got as far as a memory estimate: the batch does not split over this many GPUs.
    return absl::NotFoundError(absl::StrFormat(
        "no layout of this model splits train.global_batch_size (%d) over %d GPUs: the "
        "data-parallel size (GPUs / (tp x pp)) x the micro-batch must divide it, with tp dividing "
        "--gpus-per-node and the heads and pp dividing the layers; this batch keeps at most %d "
        "GPUs busy: use fewer GPUs, or a global batch that %d / (tp x pp) divides",
        global_batch, world, most_gpus, world));
  }
  if (layouts.empty() && std::isinf(smallest) && too_many_passes) {
    return absl::NotFoundError(absl::StrCat(
        "every layout of this model that splits train.global_batch_size (", global_batch, ") over ",
        world, " GPUs runs more than ", kMaxStepPasses,
        " micro-batch passes a step over its stages (pp x virtual stages x micro-batches a rank), "
        "beyond what nf-plan models: use more GPUs or a smaller global batch"));
  }
  if (layouts.empty() && std::isinf(smallest)) {
    return absl::NotFoundError(absl::StrCat("no layout of this model could be estimated on ", world,
                                            " GPUs; the first: ", first_refusal.message()));
  }
  if (layouts.empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "no layout of this model fits %d GPUs of %.0f GB (%.0f%% usable): the smallest needs "
        "%.1f GB on its fullest GPU; add nodes or GPU memory, or shrink train.global_batch_size "
        "or train.seq_len",
        world, cluster.gpu_memory_bytes / 1e9, 100 * cluster.memory_headroom, smallest / 1e9));
  }
  std::stable_sort(layouts.begin(), layouts.end(),
                   [](const PlannedLayout& a, const PlannedLayout& b) {
                     // Equal times (the model does not see a micro-batch's size in GEMM
                     // efficiency): less memory
                     // first.
                     if (a.time.total() != b.time.total()) return a.time.total() < b.time.total();
                     return a.peak_device_bytes < b.peak_device_bytes;
                   });
  return layouts;
}

}  // namespace nf::launcher
