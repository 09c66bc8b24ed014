#include "checkpoint/convert.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/assemble.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/output_path.h"
#include "checkpoint/read_ahead.h"
#include "checkpoint/save.h"
#include "checkpoint/shard_mapping.h"
#include "core/files/atomic_file.h"
#include "core/status.h"
#include "model/normformer_params.h"
#include "model/vocab.h"
#include "parallel/data_parallel_optimizer.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/topology.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

// What one target rank writes of one parameter: the whole local shard of the parameter values
// (dp rank 0), and these element ranges of the local shard of each optimizer state.
struct Assignment {
  int rank;
  model::ParamSpec spec;
  int64_t local_numel;
  int tp_rank, tp_size;
  bool writes_param;
  std::vector<std::pair<int64_t, int64_t>> state_ranges;  // [begin, end) of the local shard
};

// Every target rank's assignments, by parameter name, as SaveCheckpoint would make them.
absl::StatusOr<std::map<std::string, std::vector<Assignment>>> Plan(const Manifest& manifest,
                                                                    const TargetLayout& target) {
  const model::ModelConfig& model = manifest.model();
  const int tp = target.tensor_parallel, pp = target.pipeline_parallel;
  const int dp = target.data_parallel, v = target.virtual_stages;
  const std::vector<std::pair<int, int>> stages = parallel::StageLayers(model.num_layers(), pp, v);
  const int64_t padded_vocab = model::PaddedVocabSize(model.vocab_size(), tp);
  std::map<std::string, std::vector<Assignment>> plan;
  for (int rank = 0; rank < tp * pp * dp; ++rank) {
    NF_ASSIGN_OR_RETURN(
        const parallel::Topology t,
        parallel::Topology::Create(tp * pp * dp, rank, {.tp = tp, .pp = pp, .dp = dp}));
    for (int c = 0; c < v; ++c) {
      const int stage = c * pp + t.pp_rank();
      const model::PipelineStagePlacement placement{.stage = stage,
                                                    .num_stages = pp * v,
                                                    .layer_begin = stages[stage].first,
                                                    .layer_end = stages[stage].second};
      const std::vector<model::ParamSpec> specs =
          model::NormFormerParamSpecs(model, padded_vocab, placement);
      // The chunk's flat layout, as ParamTable lays it out.
      std::vector<int64_t> numels;
      for (const model::ParamSpec& spec : specs) {
        const ShardPlace place{.sharding = spec.sharding, .tp_rank = t.tp_rank(), .tp_size = tp};
        numels.push_back(NumElements(LocalShape(spec.global_shape, place)));
      }
      const model::FlatLayout layout = model::LayOutFlat(specs, numels, dp);
      const std::vector<int64_t>& offsets = layout.offsets;
      const int64_t total = layout.padded_elements;
      NF_ASSIGN_OR_RETURN(const std::vector<parallel::GradBucket> buckets,
                          parallel::MakeGradBuckets(
                              total, model::AlignedBucketElements(target.grad_bucket_elements, dp),
                              dp, t.dp_rank()));
      const bool tied_copy = model.tie_embeddings() && placement.last() && !placement.first();
      for (size_t i = 0; i < specs.size(); ++i) {
        const model::ParamSpec& spec = specs[i];
        if (tied_copy && spec.name == "decoder.embed_tokens.weight") continue;
        if (spec.sharding == model::Sharding::kReplicated && t.tp_rank() != 0) continue;
        Assignment a{.rank = rank,
                     .spec = spec,
                     .local_numel = numels[i],
                     .tp_rank = spec.sharding == model::Sharding::kReplicated ? 0 : t.tp_rank(),
                     .tp_size = spec.sharding == model::Sharding::kReplicated ? 1 : tp,
                     .writes_param = t.dp_rank() == 0,
                     .state_ranges = {}};
        if (target.distributed_optimizer) {
          for (const parallel::GradBucket& b : buckets) {
            const int64_t begin = std::max(offsets[i], b.slice_offset);
            const int64_t end = std::min(offsets[i] + numels[i], b.slice_offset + b.slice_length);
            if (begin < end) a.state_ranges.emplace_back(begin - offsets[i], end - offsets[i]);
          }
        } else if (t.dp_rank() == 0) {
          a.state_ranges.emplace_back(0, numels[i]);
        }
        if (a.writes_param || !a.state_ranges.empty()) plan[spec.name].push_back(std::move(a));
      }
    }
  }
  return plan;
}

}  // namespace

absl::Status ConvertCheckpoint(const fs::path& dir, const Manifest& manifest,
                               const TargetLayout& target, const fs::path& out) {
  return WriteCheckpointForLayout(
      dir, manifest,
      [&](const TensorRecord& record) { return AssembleTensor(dir, manifest, record); }, target,
      out);
}

absl::Status WriteCheckpointForLayout(const fs::path& dir, const Manifest& manifest,
                                      const WholeTensorSource& read, const TargetLayout& target,
                                      const fs::path& out) {
  const model::ModelConfig& model = manifest.model();
  const int tp = target.tensor_parallel, pp = target.pipeline_parallel;
  const int dp = target.data_parallel, v = target.virtual_stages;
  if (tp < 1 || pp < 1 || dp < 1 || v < 1 || target.grad_bucket_elements < 1) {
    return absl::InvalidArgumentError("--tp, --pp, --dp and --virtual must be at least 1");
  }
  NF_RETURN_IF_ERROR(parallel::CheckModelDivisibility(model.num_heads(), model.ffn_dim(), tp));
  NF_RETURN_IF_ERROR(parallel::CheckLayerSplit(model.num_layers(), pp, v));
  NF_RETURN_IF_ERROR(CheckNewOutput(out, "--out", "convert writes a new directory"));
  NF_ASSIGN_OR_RETURN(const auto plan, Plan(manifest, target));

  // A directory of its own beside `out`, removed unless committed (a full disk must not be made
  // fuller by what failed to fit); declared before the writers, which close first.
  NF_ASSIGN_OR_RETURN(StagingDirectory staging_directory, StagingDirectory::Create(out));
  const fs::path& staging = staging_directory.path();
  const int world = tp * pp * dp;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<DurableWriter>> writers;
  for (int rank = 0; rank < world; ++rank) {
    names.push_back(absl::StrFormat("rank_%05d.shard", rank));
    NF_ASSIGN_OR_RETURN(DurableWriter w, DurableWriter::Create(staging / names.back()));
    writers.push_back(std::make_unique<DurableWriter>(std::move(w)));
  }

  Manifest converted = manifest;
  converted.clear_files();
  converted.clear_tensors();
  Layout* layout = converted.mutable_layout();
  layout->set_tensor_parallel(tp);
  layout->set_pipeline_parallel(pp);
  layout->set_data_parallel(dp);
  layout->set_virtual_stages(v);
  layout->set_distributed_optimizer(target.distributed_optimizer);
  for (const TensorRecord& source : manifest.tensors()) {
    if (!plan.contains(source.name())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir.string(), " holds ", source.name(), ", which the model has not"));
    }
  }
  // The next record's whole tensor is read while this one's shards are cut and written.
  const auto write_shards = [&](size_t i, const AssembledTensor& whole) -> absl::Status {
    const TensorRecord& source = manifest.tensors(static_cast<int>(i));
    TensorRecord* record = converted.add_tensors();
    *record = source;
    record->clear_pieces();
    const int64_t element = static_cast<int64_t>(SizeOf(whole.global.dtype()));
    for (const Assignment& a : plan.at(source.name())) {
      std::vector<std::pair<int64_t, int64_t>> ranges = a.state_ranges;
      if (source.kind() == TensorRecord::PARAM) {
        if (!a.writes_param) continue;
        ranges = {{0, a.local_numel}};
      }
      if (ranges.empty()) continue;
      NF_ASSIGN_OR_RETURN(const Tensor shard,
                          CutShard(dir, whole, a.spec, a.local_numel, a.tp_rank, a.tp_size));
      for (const auto& [begin, end] : ranges) {
        const char* data = static_cast<const char*>(shard.raw_data()) + begin * element;
        const int64_t length = (end - begin) * element;
        // The target layout's global shape (its vocabulary padding).
        record->clear_global_shape();
        for (int64_t dim : a.spec.global_shape) record->add_global_shape(dim);
        Piece* piece = record->add_pieces();
        piece->set_file(names[a.rank]);
        piece->set_offset(writers[a.rank]->size());
        piece->set_length(length);
        piece->set_crc32c(Crc32c(data, static_cast<size_t>(length)));
        piece->set_sharding(ShardingToProto(a.spec.sharding));
        piece->set_tp_rank(a.tp_rank);
        piece->set_tp_size(a.tp_size);
        piece->set_begin(begin);
        piece->set_end(end);
        NF_RETURN_IF_ERROR(writers[a.rank]->Append(data, length));
      }
    }
    return absl::OkStatus();
  };
  NF_RETURN_IF_ERROR(ReadAhead<AssembledTensor>(
      static_cast<size_t>(manifest.tensors_size()),
      [&](size_t i) { return read(manifest.tensors(static_cast<int>(i))); }, write_shards));
  for (int rank = 0; rank < world; ++rank) {
    ShardFile* file = converted.add_files();
    file->set_name(names[rank]);
    file->set_size(writers[rank]->size());
    file->set_world_rank(rank);
    NF_RETURN_IF_ERROR(writers[rank]->Close());
  }
  NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(staging / kManifestName));
  const std::string bytes = EncodeManifest(converted);
  NF_RETURN_IF_ERROR(writer.Append(bytes.data(), static_cast<int64_t>(bytes.size())));
  NF_RETURN_IF_ERROR(writer.Close());
  return staging_directory.Commit();
}

}  // namespace nf::checkpoint
