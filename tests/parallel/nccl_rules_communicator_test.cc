// Tests of the NCCL-rules test double (nccl_rules_communicator.h): each rule, shown by a
// program that MPI would run and NCCL would not, or that NCCL runs only grouped; collectives'
// results and their order check; what NCCL leaves undefined reported. Ranks are threads.
#include "parallel/nccl_rules_communicator.h"

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::testing {
namespace {

using parallel::CommOp;
using parallel::ReduceOp;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs body(rank, comm) on one thread per rank; returns each rank's status.
std::vector<absl::Status> RunRanks(
    int n, const std::function<absl::Status(int, NcclRulesCommunicator&)>& body,
    NcclRulesFabric::Options options = NcclRulesFabric::Options{}) {
  NcclRulesFabric fabric(n, options);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<NcclRulesCommunicator> comm = fabric.Join(r, "pp");
      statuses[r] = body(r, *comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

Tensor F32(std::vector<double> values) {
  return TensorOf(DType::kF32, {static_cast<int64_t>(values.size())}, values);
}

// Each rank sends, then receives: MPI runs it; under NCCL the lone sends wait for receives
// that each rank posts only after its own send has completed.
TEST(NcclRulesCommunicatorTest, LoneSendsToEachOtherDeadlock) {
  const auto statuses = RunRanks(2, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    const Tensor out = F32({1, 2, 3, 4}), in = F32({0, 0, 0, 0});
    NF_RETURN_IF_ERROR(comm.Send(out, 1 - r));
    return comm.Recv(in, 1 - r);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kFailedPrecondition) << statuses[r];
    EXPECT_THAT(statuses[r].message(),
                AllOf(HasSubstr("deadlock under NCCL's rules"),
                      HasSubstr("rank 0 waits for its send f32[4] to rank 1, its communicator "
                                "runs [send f32[4] to rank 1], whose send to rank 1 waits for "
                                "rank 1 to start the receive"),
                      HasSubstr("rank 1 waits for its send f32[4] to rank 0")));
  }
}

// The same program with sends NCCL's buffers hold: it completes, with the data.
TEST(NcclRulesCommunicatorTest, SendsWithinTheEagerThresholdCompleteAlone) {
  const auto statuses =
      RunRanks(2,
               [](int r, NcclRulesCommunicator& comm) -> absl::Status {
                 const Tensor out = F32({1.0 + r, 2, 3, 4}), in = F32({0, 0, 0, 0});
                 NF_RETURN_IF_ERROR(comm.Send(out, 1 - r));
                 NF_RETURN_IF_ERROR(comm.Recv(in, 1 - r));
                 EXPECT_THAT(Values(in), ElementsAre(2.0 - r, 2, 3, 4));
                 return absl::OkStatus();
               },
               {.eager_bytes = 16});
  for (const absl::Status& s : statuses) NF_EXPECT_OK(s);
}

// Sending and receiving in one batch (one NCCL group) is how two ranks exchange.
TEST(NcclRulesCommunicatorTest, ABatchExchangesWithoutWaitingForEachOther) {
  const auto statuses = RunRanks(2, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    const Tensor out = F32({10.0 * r, 1}), in = F32({-1, -1});
    const parallel::Transfer batch[] = {{.op = CommOp::kSend, .tensor = out, .peer = 1 - r},
                                        {.op = CommOp::kRecv, .tensor = in, .peer = 1 - r}};
    NF_ASSIGN_OR_RETURN(auto handles, comm.StartBatch(batch));
    for (auto& h : handles) NF_RETURN_IF_ERROR(h->Wait());
    EXPECT_THAT(Values(in), ElementsAre(10.0 * (1 - r), 1));
    return absl::OkStatus();
  });
  for (const absl::Status& s : statuses) NF_EXPECT_OK(s);
}

// A group completes as a unit: rank 1 receives its message, yet rank 0's send to rank 1 does
// not complete while the same group's send to rank 2 has no receive.
TEST(NcclRulesCommunicatorTest, AGroupCompletesOnlyAsAWhole) {
  const auto statuses = RunRanks(3, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    const Tensor t = F32({7, 7});
    if (r == 0) {
      const parallel::Transfer batch[] = {{.op = CommOp::kSend, .tensor = t, .peer = 1},
                                          {.op = CommOp::kSend, .tensor = t, .peer = 2}};
      NF_ASSIGN_OR_RETURN(auto handles, comm.StartBatch(batch));
      return handles[0]->Wait();
    }
    if (r == 1) return comm.Recv(F32({0, 0}), 0);
    return absl::OkStatus();  // rank 2 never receives
  });
  NF_EXPECT_OK(statuses[1]);
  EXPECT_THAT(std::string(statuses[0].message()),
              AllOf(HasSubstr("rank 0 waits for its send f32[2] to rank 1"),
                    HasSubstr("whose send to rank 2 waits for rank 2 to start the receive"),
                    HasSubstr("rank 2 has finished")));
}

// Operations of one communicator run in issue order: receives posted first (non-blocking, as
// MPI allows) still block the sends behind them.
TEST(NcclRulesCommunicatorTest, OperationsRunInIssueOrder) {
  const auto statuses = RunRanks(2, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    const Tensor in = F32({0}), out = F32({1});
    NF_ASSIGN_OR_RETURN(auto recv, comm.RecvAsync(in, 1 - r));
    NF_RETURN_IF_ERROR(comm.Send(out, 1 - r));
    return recv->Wait();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s.message(), HasSubstr("its communicator runs [recv f32[1] from rank"));
  }
}

TEST(NcclRulesCommunicatorTest, CollectivesIssuedInAnotherOrderNameBothOperations) {
  const auto statuses = RunRanks(2, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    const Tensor t = F32({1, 2, 3, 4});
    if (r == 0) return comm.AllReduce(t, ReduceOp::kSum);
    return comm.Broadcast(t, 0);
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(
        s.message(),
        AllOf(HasSubstr("collective 0 on group pp"), HasSubstr("all_reduce sum of f32[4]"),
              HasSubstr("broadcast of f32[4] from rank 0"), HasSubstr("in the same order")));
  }
}

TEST(NcclRulesCommunicatorTest, CollectivesComputeWhatTheInterfaceSays) {
  const auto statuses = RunRanks(4, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    const Tensor sum = F32({1.0 * r, 1}), max = F32({1.0 * r, -1.0 * r});
    NF_RETURN_IF_ERROR(comm.AllReduce(sum, ReduceOp::kSum));
    EXPECT_THAT(Values(sum), ElementsAre(6, 4));
    NF_RETURN_IF_ERROR(comm.AllReduce(max, ReduceOp::kMax));
    EXPECT_THAT(Values(max), ElementsAre(3, 0));
    const Tensor root = F32({r == 2 ? 5.0 : 0.0});
    NF_RETURN_IF_ERROR(comm.Broadcast(root, 2));
    EXPECT_THAT(Values(root), ElementsAre(5));
    const Tensor gathered = F32({0, 0, 0, 0});
    NF_RETURN_IF_ERROR(comm.AllGather(F32({10.0 + r}), gathered));
    EXPECT_THAT(Values(gathered), ElementsAre(10, 11, 12, 13));
    const Tensor scattered = F32({0});
    NF_RETURN_IF_ERROR(comm.ReduceScatter(F32({1, 2, 3, 4}), scattered));
    EXPECT_THAT(Values(scattered), ElementsAre(4.0 * (r + 1)));
    NF_RETURN_IF_ERROR(comm.Barrier());
    EXPECT_EQ(comm.stats().calls[static_cast<int>(CommOp::kAllReduce)], 2);
    return absl::OkStatus();
  });
  for (const absl::Status& s : statuses) NF_EXPECT_OK(s);
}

TEST(NcclRulesCommunicatorTest, ASendBufferChangedBeforeWaitIsReported) {
  const auto statuses = RunRanks(2, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    if (r == 1) return comm.Recv(F32({0, 0}), 0);
    const Tensor out = F32({1, 2});
    NF_ASSIGN_OR_RETURN(auto send, comm.SendAsync(out, 1));
    out.data<float>()[0] = 9;  // the GPU may be reading it now
    return send->Wait();
  });
  NF_EXPECT_OK(statuses[1]);
  EXPECT_THAT(statuses[0].message(), HasSubstr("rank 0's send f32[2] to rank 1: its buffer "
                                               "changed before Wait()"));
}

TEST(NcclRulesCommunicatorTest, AReceiveOfAnotherSizeIsReportedOnBothSides) {
  const auto statuses = RunRanks(2, [](int r, NcclRulesCommunicator& comm) -> absl::Status {
    if (r == 0) return comm.Send(F32({1, 2, 3, 4}), 1);
    return comm.Recv(F32({0, 0}), 0);
  });
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s.message(), HasSubstr("rank 1's recv f32[2] from rank 0 does not match rank 0's "
                                       "send f32[4] to rank 1"));
  }
}

}  // namespace
}  // namespace nf::testing
