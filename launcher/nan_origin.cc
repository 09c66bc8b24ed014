#include "launcher/nan_origin.h"

#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "core/tensor.h"

namespace nf::launcher {
namespace {

// A rank's finding as it travels in the all-gather: tab-separated fields, zero-padded to a
// fixed size (every field is made by the project: none holds a tab).
constexpr int64_t kRecordBytes = 1024;
constexpr int kFields = 12;

std::string Encode(const NanOrigin& o) {
  return absl::StrJoin(
      std::make_tuple(o.world_rank, o.rank_label, o.micro_batch, o.backward ? 1 : 0, o.stage,
                      o.output.op_index, o.output.op, o.output.where, o.output.output,
                      o.output.tensor, o.output.element, absl::StrFormat("%.17g", o.output.value)),
      "\t");
}

absl::StatusOr<NanOrigin> Decode(absl::string_view text, int from_rank) {
  const std::vector<std::string> f = absl::StrSplit(text, '\t');
  NanOrigin o;
  int backward = 0;
  if (f.size() != kFields || !absl::SimpleAtoi(f[0], &o.world_rank) ||
      !absl::SimpleAtoi(f[2], &o.micro_batch) || !absl::SimpleAtoi(f[3], &backward) ||
      !absl::SimpleAtoi(f[4], &o.stage) || !absl::SimpleAtoi(f[5], &o.output.op_index) ||
      !absl::SimpleAtoi(f[10], &o.output.element) || !absl::SimpleAtod(f[11], &o.output.value)) {
    return absl::InternalError(
        absl::StrCat("rank ", from_rank, "'s NaN-origin finding does not read back: ", text));
  }
  o.rank_label = f[1];
  o.backward = backward != 0;
  o.output.op = f[6];
  o.output.where = f[7];
  o.output.output = f[8];
  o.output.tensor = f[9];
  return o;
}

}  // namespace

bool CausallyBefore(const NanOrigin& a, const NanOrigin& b, int num_stages) {
  // The backward runs the stages last to first.
  const auto key = [num_stages](const NanOrigin& o) {
    return std::make_tuple(o.micro_batch, o.backward,
                           o.backward ? num_stages - 1 - o.stage : o.stage, o.output.op_index,
                           o.world_rank);
  };
  return key(a) < key(b);
}

NanOriginSearch::NanOriginSearch(int world_rank, std::string rank_label, int64_t first_micro_batch,
                                 int num_stages)
    : world_rank_(world_rank),
      rank_label_(std::move(rank_label)),
      first_micro_batch_(first_micro_batch),
      num_stages_(num_stages) {}

void NanOriginSearch::Started(const parallel::Action& /*compute*/, int /*stage*/) {
  trace_.BeginPass();
}

void NanOriginSearch::Finished(const parallel::Action& compute, int stage) {
  if (!trace_.first()) return;
  NanOrigin found{.world_rank = world_rank_,
                  .rank_label = rank_label_,
                  .micro_batch = first_micro_batch_ + compute.micro_batch,
                  .backward = compute.kind == parallel::Action::kBackward,
                  .stage = stage,
                  .output = *trace_.first()};
  if (!first_ || CausallyBefore(found, *first_, num_stages_)) first_ = std::move(found);
}

absl::StatusOr<NanOriginAgreement> AgreeOnNanOrigin(const std::optional<NanOrigin>& mine,
                                                    int num_stages, parallel::Communicator& world) {
  NF_ASSIGN_OR_RETURN(const Tensor sent, Tensor::HostZeros(DType::kU8, {kRecordBytes}));
  if (mine) {
    const std::string text = Encode(*mine);
    std::memcpy(sent.raw_data(), text.data(),
                std::min<size_t>(text.size(), static_cast<size_t>(kRecordBytes - 1)));
  }
  NF_ASSIGN_OR_RETURN(const Tensor all,
                      Tensor::HostZeros(DType::kU8, {world.size() * kRecordBytes}));
  NF_RETURN_IF_ERROR(world.AllGather(sent, all));
  NanOriginAgreement agreed;
  for (int r = 0; r < world.size(); ++r) {
    const char* record = static_cast<const char*>(all.raw_data()) + r * kRecordBytes;
    const absl::string_view text(record, strnlen(record, kRecordBytes));
    if (text.empty()) continue;
    NF_ASSIGN_OR_RETURN(NanOrigin found, Decode(text, r));
    ++agreed.ranks_found;
    if (!agreed.first || CausallyBefore(found, *agreed.first, num_stages)) {
      agreed.first = std::move(found);
    }
  }
  return agreed;
}

std::string DescribeNanOrigin(const NanOrigin& o) {
  const ops::NonFiniteOutput& out = o.output;
  return absl::StrFormat(
      "%s, micro-batch %d, %s of stage %d: %s%s wrote %s into %s (%s, element %d)", o.rank_label,
      o.micro_batch, o.backward ? "backward" : "forward", o.stage,
      out.where.empty() ? "" : absl::StrCat(out.where, ": "), out.op, ops::NonFiniteName(out.value),
      out.output, out.tensor, out.element);
}

std::string SummarizeNanOrigin(const NanOriginAgreement& agreed) {
  if (agreed.first)
    return absl::StrCat("the first non-finite value: ", DescribeNanOrigin(*agreed.first));
  return "its re-run produced only finite values: the fault did not repeat (transient hardware or "
         "communication), or the sum over data-parallel ranks overflowed";
}

}  // namespace nf::launcher
