#include "parallel/run_start.h"

#include "core/status.h"
#include "core/tensor.h"
#include "parallel/flight_recorder.h"

namespace nf::parallel {

absl::StatusOr<int64_t> AgreeOnRunStart(Communicator& world) {
  NF_ASSIGN_OR_RETURN(const Tensor start, Tensor::HostZeros(DType::kI64, {1}));
  if (world.rank() == 0) *start.data<int64_t>() = WallClockNanos();
  NF_RETURN_IF_ERROR(world.Broadcast(start, /*root=*/0));
  return *start.data<int64_t>();
}

}  // namespace nf::parallel
