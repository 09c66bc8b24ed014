// The parameter registry: every parameter of the network as a ParamSpec row (fairseq-style
// global name, global shape, tensor-parallel sharding, weight decay, initialisation), laid out
// for one tensor-parallel rank in flat buffers: the model parameters in the model's dtype and
// the fp32 main gradients. Bucketed all-reduce, ZeRO-1 and checkpoint I/O work on ranges of
// these buffers; layers work on per-parameter views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/optim/mixed_precision_optimizer.h"
#include "core/tensor.h"

namespace nf::model {

// How a parameter is split over the tensor-parallel group.
enum class Sharding {
  kReplicated,  // every rank holds all of it (a "TP duplicate": counted once in grad norms)
  kSplitRows,   // dim 0 split: column-parallel weights, their biases, vocab slices, head scales
  kSplitCols,   // dim 1 split: row-parallel weights
};

enum class InitKind {
  kOnes,
  kZeros,
  kNormal,         // N(0, scale^2)
  kUniform,        // U(-scale, scale)
  kXavierUniform,  // U(-b, b), b = scale * sqrt(6 / (fan_in + fan_out)) of the global shape
};

struct ParamSpec {
  std::string name;  // e.g. "decoder.layers.3.fc1.weight"
  Shape global_shape;
  Sharding sharding = Sharding::kReplicated;
  bool weight_decay = false;
  InitKind init = InitKind::kZeros;
  float init_scale = 0.0f;
  // Laid out right after the previous parameter, unpadded: the two are viewed as one tensor
  // (k and v after q, so one GEMM computes all three). Otherwise a parameter starts aligned.
  bool follows_previous = false;
};

// Every parameter not marked follows_previous starts at a multiple of this many elements of
// the flat buffers, and the buffers' length is a multiple of it times the buffer multiple (so
// each data-parallel shard starts aligned too). 128 elements are 256 bytes at 2-byte dtypes and
// 512 at fp32: the alignment cuBLASLt's fastest kernels and vectorised loads want, in the
// parameters (model dtype) and in the fp32 gradients, master weights and moments laid out at
// the same offsets. Without it a parameter of a few elements (a layer's per-head scales, heads
// / tp of them) would leave every later one 8-byte aligned. The padding is zeros that no
// parameter, gradient norm or checkpoint ever reads.
inline constexpr int64_t kParamAlignment = 128;

// Global elements [begin, begin + count) of parameter `spec`'s initial value under `seed`
// (row-major in its global shape): what ParamTable::Initialize gives them in every layout.
std::vector<float> InitialValues(const ParamSpec& spec, uint32_t seed, int64_t begin,
                                 int64_t count);

// Where each parameter lies in the flat buffers, in elements.
struct FlatLayout {
  std::vector<int64_t> offsets;  // per spec
  int64_t padded_elements = 0;   // the buffers' length, padding included
};
// The layout of `specs` whose local (this tensor-parallel rank's) element counts are
// `local_numels`, padded at the end to a multiple of kParamAlignment x buffer_multiple. The one
// definition of the flat layout: ParamTable and checkpoint conversion both use it.
FlatLayout LayOutFlat(const std::vector<ParamSpec>& specs, const std::vector<int64_t>& local_numels,
                      int64_t buffer_multiple);

// A gradient bucket size (parallel::MakeGradBuckets) rounded up to a multiple of
// kParamAlignment x dp: every bucket then starts aligned, and so does each rank's slice of it,
// so ZeRO-1's shards of master weights and moments keep the parameters' alignment.
int64_t AlignedBucketElements(int64_t bucket_elements, int dp);

class ParamTable {
 public:
  struct Entry {
    ParamSpec spec;
    Shape local_shape;
    int64_t offset;  // into the flat buffers, in elements
    Tensor value;    // view of params(): [local_shape], model dtype
    Tensor grad;     // view of grads(): [local_shape], fp32; undefined without gradients
  };

  // Lays out `specs` for rank `tp_rank` of a tensor-parallel group of `tp_size` (LayOutFlat)
  // and allocates the buffers (gradients zeroed), padded with zeros at the end to a multiple of
  // kParamAlignment x `buffer_multiple` elements (data parallelism splits them into dp equal
  // parts). Fails, naming the parameter, when a split dimension does not divide by tp_size or
  // two parameters share a name. The buffers live on `device`.
  // Without `gradients` (a model that only runs forwards) there is no gradient buffer: grads()
  // and every entry's grad are undefined, and what needs them is refused.
  static absl::StatusOr<ParamTable> Create(std::vector<ParamSpec> specs, DType dtype, int tp_rank,
                                           int tp_size, int64_t buffer_multiple = 1,
                                           Device device = Device::Cpu(), bool gradients = true);

  // fairseq's initialisation, a pure function of (seed, parameter name, global element index):
  // any tensor-parallel or pipeline layout draws the same global values for a parameter
  // (InitialValues below).
  absl::Status Initialize(uint32_t seed);

  const Entry& Get(absl::string_view name) const;  // aborts on an unknown name (a bug)
  bool Contains(absl::string_view name) const { return index_.contains(name); }
  const std::vector<Entry>& entries() const { return entries_; }
  // The lowest flat offset of the parameters whose names start with `name_prefix`; aborts when
  // there is none (a bug).
  int64_t LowestOffset(absl::string_view name_prefix) const;

  // [num_elements] including the padding, model dtype.
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }  // [num_elements], fp32; or undefined
  bool has_gradients() const { return grads_.defined(); }
  int64_t num_elements() const { return params_.numel(); }
  // Parameters of the whole (unsharded) model.
  int64_t num_global_elements() const;
  // The weight-decay flag of every parameter as ranges of the flat buffers.
  std::vector<optim::ParamRange> DecayRanges() const;
  absl::Status ZeroGrads() const;
  // The parameters this rank counts in the global gradient norm, as ranges of the flat
  // buffers: every tensor-parallel shard, and replicated parameters on tensor-parallel rank 0
  // only (their gradients are identical on every rank, so they count once). Parameters named
  // in `copies_of_other_stages` (a pipeline stage's copy of a parameter another stage owns, such
  // as the last stage's tied embedding) are skipped too.
  std::vector<optim::FlatRange> OwnedNormRanges(
      const std::vector<std::string>& copies_of_other_stages = {}) const;
  // The entries behind OwnedNormRanges, in the same order.
  std::vector<const Entry*> OwnedNormEntries(
      const std::vector<std::string>& copies_of_other_stages = {}) const;
  // Sum of squares of the gradients in OwnedNormRanges. Summed over the tensor- and
  // pipeline-parallel groups, it is the whole model's squared norm.
  absl::StatusOr<double> OwnedSquaredGradNorm(
      const std::vector<std::string>& copies_of_other_stages = {}) const;

 private:
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
  Tensor params_, grads_;
  int tp_rank_ = 0, tp_size_ = 1;
};

}  // namespace nf::model
