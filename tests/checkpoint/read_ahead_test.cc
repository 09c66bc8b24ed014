// ReadAhead (checkpoint/read_ahead.h): every item made once and consumed in order, make(i + 1)
// allowed to run beside consume(i) but never beside another make, and the first error ends it.
#include "checkpoint/read_ahead.h"

#include <atomic>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nf::checkpoint {
namespace {

TEST(ReadAheadTest, ConsumesEveryItemInOrderWithOneMakeAtATime) {
  std::atomic<int> making{0};
  bool overlapped = false;
  std::vector<int> consumed;
  const absl::Status status = ReadAhead<int>(
      50,
      [&](size_t i) -> absl::StatusOr<int> {
        if (making.fetch_add(1) != 0) overlapped = true;
        const int value = static_cast<int>(i) * 3;
        making.fetch_sub(1);
        return value;
      },
      [&](size_t i, int& value) {
        EXPECT_EQ(value, static_cast<int>(i) * 3);
        consumed.push_back(value);
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_FALSE(overlapped);
  ASSERT_EQ(consumed.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(consumed[i], 3 * i);
}

TEST(ReadAheadTest, TheFirstErrorEndsItAndNothingAfterItIsConsumed) {
  std::vector<size_t> consumed;
  const absl::Status made = ReadAhead<int>(
      10,
      [&](size_t i) -> absl::StatusOr<int> {
        if (i == 4) return absl::DataLossError("tensor 4 is corrupt");
        return static_cast<int>(i);
      },
      [&](size_t i, int&) {
        consumed.push_back(i);
        return absl::OkStatus();
      });
  EXPECT_EQ(made.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(consumed, (std::vector<size_t>{0, 1, 2, 3}));

  std::atomic<size_t> made_up_to{0};
  const absl::Status written = ReadAhead<int>(
      10,
      [&](size_t i) -> absl::StatusOr<int> {
        made_up_to = i;
        return static_cast<int>(i);
      },
      [&](size_t i, int&) {
        return i == 2 ? absl::UnavailableError("disk full") : absl::OkStatus();
      });
  EXPECT_EQ(written.code(), absl::StatusCode::kUnavailable);
  EXPECT_LE(made_up_to.load(), 3u);  // at most the one after the failed write was started
}

TEST(ReadAheadTest, ZeroItemsMakeAndConsumeNothing) {
  bool called = false;
  EXPECT_TRUE(ReadAhead<int>(
                  0,
                  [&](size_t) -> absl::StatusOr<int> {
                    called = true;
                    return 0;
                  },
                  [&](size_t, int&) { return absl::OkStatus(); })
                  .ok());
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace nf::checkpoint
