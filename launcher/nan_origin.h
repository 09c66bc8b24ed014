// Where a NaN began (train.nan_origin). When a step's gradients are non-finite, every rank runs
// the step's micro-batches again through the same pipeline schedule: the same samples and the
// same dropout masks (both are functions of the sample index), so a persistent fault repeats.
// The re-run happens under ops::NonFiniteTrace, which searches the outputs of every op; each
// pass (one micro-batch's forward or backward on one model stage) keeps its first op that wrote
// a NaN or an infinity. The first finding in causal order wins: the lowest micro-batch of the
// global batch, its forward before its backward, the forward's stages in order and the
// backward's in reverse, then the op's place in its pass (tensor-parallel ranks run the same ops
// in the same order), then the lowest rank. Every rank agrees on it through one all-gather over
// the world.
//
// A re-run that finds nothing means the fault did not repeat (a transient hardware or
// communication fault), or the values overflowed only when summed over the data-parallel ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/ops/nonfinite_trace.h"
#include "launcher/pipeline_executor.h"
#include "parallel/communicator.h"

namespace nf::launcher {

struct NanOrigin {
  int world_rank = 0;
  std::string rank_label;   // "rank 3 (tp=1, dp=0, pp=1)"
  int64_t micro_batch = 0;  // in the global batch
  bool backward = false;    // in the micro-batch's backward, else its forward
  int stage = 0;            // model stage
  ops::NonFiniteOutput output;
};

// Before `b` in causal order (see above).
bool CausallyBefore(const NanOrigin& a, const NanOrigin& b, int num_stages);

// One rank's search: an open NonFiniteTrace and the first finding of its passes so far.
class NanOriginSearch : public PipelineExecutor::ComputeObserver {
 public:
  // `first_micro_batch`: this data-parallel rank's first in the global batch; `num_stages`: the
  // model's stages (pipeline size x virtual stages).
  NanOriginSearch(int world_rank, std::string rank_label, int64_t first_micro_batch,
                  int num_stages);

  void Started(const parallel::Action& compute, int stage) override;
  void Finished(const parallel::Action& compute, int stage) override;

  const std::optional<NanOrigin>& first() const { return first_; }
  // An error met while searching (a device copy that failed).
  const absl::Status& status() const { return trace_.status(); }

 private:
  ops::NonFiniteTrace trace_;
  int world_rank_;
  std::string rank_label_;
  int64_t first_micro_batch_;
  int num_stages_;
  std::optional<NanOrigin> first_;
};

struct NanOriginAgreement {
  std::optional<NanOrigin> first;  // none when no rank found one
  int ranks_found = 0;             // the ranks that found one (later ones see the first's NaN)
};
// The first of every rank's `mine` in causal order, the same on every rank. Collective over
// `world`.
absl::StatusOr<NanOriginAgreement> AgreeOnNanOrigin(const std::optional<NanOrigin>& mine,
                                                    int num_stages, parallel::Communicator& world);

// "rank 3 (tp=1, dp=0, pp=1), micro-batch 0, forward of stage 1: layer 2 / fc1: Gemm wrote nan
// into C (f32[64, 256] on cpu, element 0)".
std::string DescribeNanOrigin(const NanOrigin& origin);

// What a search found, as the console and the stop message say it: "the first non-finite value:
// " and DescribeNanOrigin, or that the re-run produced only finite values.
std::string SummarizeNanOrigin(const NanOriginAgreement& agreed);

}  // namespace nf::launcher
