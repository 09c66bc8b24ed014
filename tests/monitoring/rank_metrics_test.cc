// RankMetrics: what a scrape returns after the training loop's records, and a real server.
#include "monitoring/rank_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "monitoring/scrape_client.h"
#include "tests/assert_ok.h"

namespace nf::monitoring {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kLabels[] = R"(dp_rank="1",job="run7",pp_rank="0",rank="3",tp_rank="1")";

RankIdentity Identity() {
  return {.job = "run7", .rank = 3, .tp_rank = 1, .pp_rank = 0, .dp_rank = 1};
}

// One series line of the text format; prometheus-cpp writes labels sorted by name.
std::string Series(const std::string& name, const std::string& value) {
  return name + "{" + kLabels + "} " + value;
}

TEST(RankMetricsTest, StepValidationAndCheckpointRecordsAppearWithTheRankLabels) {
  auto metrics = RankMetrics::Unserved(Identity());
  metrics->RecordStep({.step = 1,
                       .loss = 2.5,
                       .learning_rate = 1e-3,
                       .loss_scale = 4096,
                       .grad_norm = 0.75,
                       .skipped = false,
                       .tokens = 1024,
                       .seconds = 0.5,
                       .mfu = 0.25,
                       .unix_seconds = 1.7e9});
  metrics->RecordStep({.step = 2,
                       .loss = 2.0,
                       .learning_rate = 2e-3,
                       .loss_scale = 2048,
                       .grad_norm = 0.5,
                       .skipped = true,
                       .tokens = 1024,
                       .seconds = 0.25,
                       .mfu = 0.5,
                       .unix_seconds = 1.7e9 + 1});
  metrics->RecordValidation(2.25);
  metrics->RecordCheckpointSave(1.5, 2);
  const std::string text = metrics->Text();
  EXPECT_THAT(text, HasSubstr(Series("normformer_steps_total", "2")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_tokens_total", "2048")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_skipped_steps_total", "1")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_train_loss", "2")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_validation_loss", "2.25")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_loss_scale", "2048")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_tokens_per_second", "4096")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_mfu_ratio", "0.5")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_checkpoint_save_seconds", "1.5")));
  EXPECT_THAT(text, HasSubstr(Series("normformer_last_checkpoint_step", "2")));
  // The histogram: steps of 0.5 s and 0.25 s, both in the 0.5 s bucket, neither in 0.2 s.
  EXPECT_THAT(text, HasSubstr(Series("normformer_step_duration_seconds_count", "2")));
  // (prometheus-cpp writes a bucket's `le` after the other labels)
  const std::string bucket = std::string("normformer_step_duration_seconds_bucket{") + kLabels;
  EXPECT_THAT(text, HasSubstr(bucket + R"(,le="0.5"} 2)"));
  EXPECT_THAT(text, HasSubstr(bucket + R"(,le="0.2"} 0)"));
}

TEST(RankMetricsTest, LayerNormsCarryTheLayerLabel) {
  auto metrics = RankMetrics::Unserved(Identity());
  metrics->RecordLayerGradNorms({{"embedding", 0.5}, {"0", 1.25}, {"head", 2}});
  const std::string text = metrics->Text();
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(normformer_layer_grad_norm{dp_rank="1",job="run7",layer="embedding",pp_rank="0",rank="3",tp_rank="1"} 0.5)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(normformer_layer_grad_norm{dp_rank="1",job="run7",layer="0",pp_rank="0",rank="3",tp_rank="1"} 1.25)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(normformer_layer_grad_norm{dp_rank="1",job="run7",layer="head",pp_rank="0",rank="3",tp_rank="1"} 2)"));
}

TEST(RankMetricsTest, RunInfoCarriesTheConfigurationAsLabels) {
  auto metrics = RankMetrics::Unserved(Identity());
  metrics->RecordRunInfo({{"layers", "4"}, {"precision", "BF16"}});
  EXPECT_THAT(
      metrics->Text(),
      HasSubstr(
          R"(normformer_run_info{dp_rank="1",job="run7",layers="4",pp_rank="0",precision="BF16",rank="3",tp_rank="1"} 1)"));
}

TEST(RankMetricsTest, CommunicationCountersAdvanceByTheDifferenceOfTotals) {
  auto metrics = RankMetrics::Unserved(Identity());
  parallel::CommStats totals;
  const int all_reduce = static_cast<int>(parallel::CommOp::kAllReduce);
  totals.bytes[all_reduce] = 100;
  totals.calls[all_reduce] = 2;
  totals.seconds[all_reduce] = 0.5;
  metrics->RecordComm("tp", totals);
  totals.bytes[all_reduce] = 250;
  totals.calls[all_reduce] = 5;
  totals.seconds[all_reduce] = 1.25;
  metrics->RecordComm("tp", totals);
  const std::string text = metrics->Text();
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(normformer_comm_bytes_total{dp_rank="1",group="tp",job="run7",op="all_reduce",pp_rank="0",rank="3",tp_rank="1"} 250)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(normformer_comm_calls_total{dp_rank="1",group="tp",job="run7",op="all_reduce",pp_rank="0",rank="3",tp_rank="1"} 5)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(normformer_comm_seconds_total{dp_rank="1",group="tp",job="run7",op="all_reduce",pp_rank="0",rank="3",tp_rank="1"} 1.25)"));
  // Operations never used make no series.
  EXPECT_THAT(text, Not(HasSubstr(R"(op="send")")));
}

// A free TCP port on this machine (bound, read back, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// The response to GET `path` from 127.0.0.1:port ("" when the connection fails).
std::string HttpGet(int port, const std::string& path) {
  return FetchPage("127.0.0.1", port, path).value_or("");
}

TEST(RankMetricsTest, ServesMetricsOnBasePlusLocalRankAndNothingElse) {
  MonitoringConfig config;
  config.set_bind_address("127.0.0.1");
  config.set_port_base(FreePort() - 2);
  auto metrics = RankMetrics::Serve(config, Identity(), /*local_rank=*/2);
  NF_ASSERT_OK(metrics);
  EXPECT_EQ((*metrics)->port(), config.port_base() + 2);
  (*metrics)->RecordValidation(3.5);
  const std::string page = HttpGet((*metrics)->port(), "/metrics");
  EXPECT_THAT(page, HasSubstr("200 OK"));
  EXPECT_THAT(page, HasSubstr(Series("normformer_validation_loss", "3.5")));
  EXPECT_THAT(HttpGet((*metrics)->port(), "/"), Not(HasSubstr("200 OK")));

  // A second server on the same port is refused, naming the address and what to do.
  auto second = RankMetrics::Serve(config, Identity(), /*local_rank=*/2);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("monitoring: cannot serve metrics on 127.0.0.1:" +
                        std::to_string(config.port_base() + 2)));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("monitoring.port_base"));
}

}  // namespace
}  // namespace nf::monitoring
