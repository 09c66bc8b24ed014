#include "model/param_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/ops/ops.h"
#include "core/philox.h"
#include "core/status.h"

namespace nf::model {
namespace {

// Rows and columns of a parameter viewed as a matrix (a vector is [n, 1]).
int64_t Rows(const Shape& s) { return s.empty() ? 1 : s[0]; }
int64_t Cols(const Shape& s) { return s.size() < 2 ? 1 : NumElements(s) / s[0]; }

// A uniform double in (0, 1) from a 32-bit word.
double Unit(uint32_t word) { return (static_cast<double>(word) + 0.5) * 0x1p-32; }

// The second Philox key word of initialisation: one that no dropout site (1 + 4 layer + kind)
// reaches, so initial values and dropout masks never share a stream.
constexpr uint32_t kInitStream = 0xFFFFFFFFu;

// 64-bit FNV-1a of a parameter's name. The name, unlike the parameter's row in a table, is the
// same in every layout (whole model, tensor-parallel shard, pipeline stage), so values drawn
// under it are too. 64 bits make two names of one model sharing a stream (a collision)
// negligible: ~n^2 / 2^65 for n parameters.
uint64_t NameKey(absl::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// The initial value of global element `index` of the parameter whose name hashes to
// `name_key`: Philox keyed by (seed, kInitStream), counter = (element index, name key).
double InitialValue(const ParamSpec& spec, uint32_t seed, uint64_t name_key, int64_t index) {
  const PhiloxCounter words =
      Philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(name_key), static_cast<uint32_t>(name_key >> 32)},
                    {seed, kInitStream});
  switch (spec.init) {
    case InitKind::kOnes:
      return 1.0;
    case InitKind::kZeros:
      return 0.0;
    case InitKind::kNormal:  // Box-Muller
      return spec.init_scale * std::sqrt(-2.0 * std::log(Unit(words[0]))) *
             std::cos(2.0 * M_PI * Unit(words[1]));
    case InitKind::kUniform:
      return spec.init_scale * (2.0 * Unit(words[0]) - 1.0);
    case InitKind::kXavierUniform: {
      const double fan_out = Rows(spec.global_shape), fan_in = Cols(spec.global_shape);
      const double bound = spec.init_scale * std::sqrt(6.0 / (fan_in + fan_out));
      return bound * (2.0 * Unit(words[0]) - 1.0);
    }
  }
  return 0.0;
}

}  // namespace

std::vector<float> InitialValues(const ParamSpec& spec, uint32_t seed, int64_t begin,
                                 int64_t count) {
  const uint64_t name_key = NameKey(spec.name);
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    values[i] = static_cast<float>(InitialValue(spec, seed, name_key, begin + i));
  }
  return values;
}

FlatLayout LayOutFlat(const std::vector<ParamSpec>& specs, const std::vector<int64_t>& local_numels,
                      int64_t buffer_multiple) {
  FlatLayout layout;
  int64_t end = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t offset = specs[i].follows_previous
                               ? end
                               : (end + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
    layout.offsets.push_back(offset);
    end = offset + local_numels[i];
  }
  const int64_t multiple = kParamAlignment * std::max<int64_t>(buffer_multiple, 1);
  layout.padded_elements = (end + multiple - 1) / multiple * multiple;
  return layout;
}

int64_t AlignedBucketElements(int64_t bucket_elements, int dp) {
  const int64_t multiple = kParamAlignment * std::max(dp, 1);
  return (std::max<int64_t>(bucket_elements, 1) + multiple - 1) / multiple * multiple;
}

absl::StatusOr<ParamTable> ParamTable::Create(std::vector<ParamSpec> specs, DType dtype,
                                              int tp_rank, int tp_size, int64_t buffer_multiple,
                                              Device device, bool gradients) {
  if (buffer_multiple < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter buffer multiple must be >= 1, got ", buffer_multiple));
  }
  ParamTable table;
  table.tp_rank_ = tp_rank;
  table.tp_size_ = tp_size;
  std::vector<Shape> local_shapes;
  std::vector<int64_t> local_numels;
  for (const ParamSpec& spec : specs) {
    Shape local = spec.global_shape;
    const int split_dim = spec.sharding == Sharding::kSplitRows   ? 0
                          : spec.sharding == Sharding::kSplitCols ? 1
                                                                  : -1;
    if (split_dim >= static_cast<int>(local.size())) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", spec.name, " of shape ",
                                                     ShapeToString(local), " has no dimension ",
                                                     split_dim, " to split"));
    }
    if (split_dim >= 0) {
      if (local[split_dim] % tp_size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", spec.name, ": dimension ", split_dim, " (", local[split_dim],
                         ") does not divide by tensor_parallel = ", tp_size));
      }
      local[split_dim] /= tp_size;
    }
    if (!table.index_.emplace(spec.name, local_shapes.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", spec.name, " declared twice"));
    }
    local_numels.push_back(NumElements(local));
    local_shapes.push_back(std::move(local));
  }
  const FlatLayout layout = LayOutFlat(specs, local_numels, buffer_multiple);
  for (size_t i = 0; i < specs.size(); ++i) {
    table.entries_.push_back(
        {std::move(specs[i]), std::move(local_shapes[i]), layout.offsets[i], Tensor(), Tensor()});
  }
  const int64_t padded = layout.padded_elements;
  NF_ASSIGN_OR_RETURN(table.params_, ops::Zeros(dtype, {padded}, device));
  if (gradients) {
    NF_ASSIGN_OR_RETURN(table.grads_, ops::Zeros(DType::kF32, {padded}, device));
  }
  for (Entry& e : table.entries_) {
    NF_ASSIGN_OR_RETURN(e.value, table.params_.View(e.offset, e.local_shape));
    if (gradients) {
      NF_ASSIGN_OR_RETURN(e.grad, table.grads_.View(e.offset, e.local_shape));
    }
  }
  return table;
}

absl::Status ParamTable::Initialize(uint32_t seed) {
  for (const Entry& e : entries_) {
    const int64_t rows = Rows(e.local_shape), cols = Cols(e.local_shape);
    const int64_t global_cols = Cols(e.spec.global_shape);
    // Where this rank's slice starts in the global [rows, cols] matrix: each local row is a
    // contiguous run of a global row.
    const int64_t row0 = e.spec.sharding == Sharding::kSplitRows ? tp_rank_ * rows : 0;
    const int64_t col0 = e.spec.sharding == Sharding::kSplitCols ? tp_rank_ * cols : 0;
    std::vector<float> values;
    values.reserve(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row =
          InitialValues(e.spec, seed, (row0 + r) * global_cols + col0, cols);
      values.insert(values.end(), row.begin(), row.end());
    }
    // Drawn on the host, then copied to the parameters' device.
    NF_ASSIGN_OR_RETURN(const Tensor drawn,
                        TensorFromFloats(e.value.dtype(), e.local_shape, values));
    NF_RETURN_IF_ERROR(ops::Copy(drawn, e.value));
  }
  return absl::OkStatus();
}

int64_t ParamTable::LowestOffset(absl::string_view name_prefix) const {
  int64_t lowest = -1;
  for (const Entry& e : entries_) {
    if (!absl::StartsWith(e.spec.name, name_prefix)) continue;
    if (lowest < 0 || e.offset < lowest) lowest = e.offset;
  }
  if (lowest < 0) {
    std::fprintf(stderr, "normformer: internal error: no parameter named %s...\n",
                 std::string(name_prefix).c_str());
    std::abort();
  }
  return lowest;
}

const ParamTable::Entry& ParamTable::Get(absl::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    std::fprintf(stderr, "normformer: internal error: no parameter named %s\n",
                 std::string(name).c_str());
    std::abort();
  }
  return entries_[it->second];
}

int64_t ParamTable::num_global_elements() const {
  int64_t n = 0;
  for (const Entry& e : entries_) n += NumElements(e.spec.global_shape);
  return n;
}

std::vector<optim::ParamRange> ParamTable::DecayRanges() const {
  std::vector<optim::ParamRange> ranges;
  for (const Entry& e : entries_) {
    ranges.push_back({.offset = e.offset,
                      .length = NumElements(e.local_shape),
                      .weight_decay = e.spec.weight_decay});
  }
  return ranges;
}

namespace {
absl::Status NoGradients(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": the parameters have no gradients (a model made to run forwards only)"));
}
}  // namespace

absl::Status ParamTable::ZeroGrads() const {
  if (!has_gradients()) return NoGradients("ZeroGrads");
  return ops::Fill(grads_, 0.0f);
}

std::vector<const ParamTable::Entry*> ParamTable::OwnedNormEntries(
    const std::vector<std::string>& copies_of_other_stages) const {
  std::vector<const Entry*> owned;
  for (const Entry& e : entries_) {
    if (e.spec.sharding == Sharding::kReplicated && tp_rank_ != 0) continue;
    if (std::find(copies_of_other_stages.begin(), copies_of_other_stages.end(), e.spec.name) !=
        copies_of_other_stages.end()) {
      continue;
    }
    owned.push_back(&e);
  }
  return owned;
}

std::vector<optim::FlatRange> ParamTable::OwnedNormRanges(
    const std::vector<std::string>& copies_of_other_stages) const {
  std::vector<optim::FlatRange> ranges;
  for (const Entry* e : OwnedNormEntries(copies_of_other_stages)) {
    ranges.push_back({.offset = e->offset, .length = NumElements(e->local_shape)});
  }
  return ranges;
}

absl::StatusOr<double> ParamTable::OwnedSquaredGradNorm(
    const std::vector<std::string>& copies_of_other_stages) const {
  if (!has_gradients()) return NoGradients("OwnedSquaredGradNorm");
  NF_ASSIGN_OR_RETURN(const Tensor sum, ops::Zeros(DType::kF32, {1}, grads_.device()));
  for (const optim::FlatRange& r : OwnedNormRanges(copies_of_other_stages)) {
    NF_ASSIGN_OR_RETURN(const Tensor part, grads_.Slice(r.offset, r.length));
    NF_RETURN_IF_ERROR(ops::SquaredNorm(part, sum));
  }
  NF_ASSIGN_OR_RETURN(const Tensor host, ops::OnHost(sum));
  return host.data<float>()[0];
}

}  // namespace nf::model
