// Tests of launcher/jsonl_log.h: JSON escaping (control characters, quotes, invalid UTF-8),
// number formatting that round-trips doubles, and appending whole lines to a file.
#include "launcher/jsonl_log.h"

#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace nf::launcher {
namespace {

using ::testing::HasSubstr;

std::string Quoted(const std::string& value) {
  return JsonObject().AddString("s", value).ToString();
}

std::string Number(double value) { return JsonObject().AddDouble("x", value).ToString(); }

TEST(JsonObjectTest, KeepsMembersInInsertionOrder) {
  EXPECT_EQ(JsonObject().ToString(), "{}");
  EXPECT_EQ(JsonObject()
                .AddString("event", "train")
                .AddInt("iter", 10)
                .AddDouble("loss", 2.5)
                .AddBool("skipped", false)
                .AddBool("ok", true)
                .ToString(),
            R"({"event":"train","iter":10,"loss":2.5,"skipped":false,"ok":true})");
}

TEST(JsonObjectTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(Quoted("say \"hi\" \\ there"), R"({"s":"say \"hi\" \\ there"})");
  EXPECT_EQ(Quoted("a\nb\tc\rd\be\ff/"), R"({"s":"a\nb\tc\rd\be\ff/"})");
  EXPECT_EQ(Quoted(std::string("nul\0\x01\x1f\x7f", 7)), R"({"s":"nul\u0000\u0001\u001f)"
                                                         "\x7f"
                                                         R"("})");
  EXPECT_EQ(JsonObject().AddInt("we\"ird\n", 1).ToString(), R"({"we\"ird\n":1})");
}

TEST(JsonObjectTest, PassesUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(Quoted("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "{\"s\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}");
  const struct {
    std::string in;
    std::string out;
  } kInvalid[] = {
      {"\xff", R"(\ufffd)"},                                // never valid
      {"a\x80z", R"(a\ufffdz)"},                            // stray continuation byte
      {"\xe2\x82", R"(\ufffd\ufffd)"},                      // truncated at the end
      {"\xe2\x82z", R"(\ufffd\ufffdz)"},                    // truncated before an ASCII byte
      {"\xc0\xaf", R"(\ufffd\ufffd)"},                      // overlong '/'
      {"\xed\xa0\x80", R"(\ufffd\ufffd\ufffd)"},            // UTF-16 surrogate
      {"\xf4\x90\x80\x80", R"(\ufffd\ufffd\ufffd\ufffd)"},  // beyond U+10FFFF
  };
  for (const auto& c : kInvalid) {
    EXPECT_EQ(Quoted(c.in), absl::StrCat(R"({"s":")", c.out, R"("})")) << c.out;
  }
}

TEST(JsonObjectTest, IntegersAreExact) {
  EXPECT_EQ(JsonObject()
                .AddInt("min", std::numeric_limits<int64_t>::min())
                .AddInt("max", std::numeric_limits<int64_t>::max())
                .ToString(),
            R"({"min":-9223372036854775808,"max":9223372036854775807})");
}

TEST(JsonObjectTest, DoublesRoundTripAsValidJsonNumbers) {
  EXPECT_EQ(Number(0.1), R"({"x":0.1})");
  EXPECT_EQ(Number(-2.0), R"({"x":-2})");
  EXPECT_EQ(Number(1e20), R"({"x":1e+20})");
  const std::regex json_number(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
  for (const double value :
       {0.0, -0.0, 1.0 / 3.0, double{2.3f}, double{6e-4f}, 1e-300, DBL_MIN, DBL_TRUE_MIN, DBL_MAX,
        -DBL_MAX, 123456789.125, 9007199254740993.0, std::nextafter(1.0, 2.0), 65504.0}) {
    const std::string object = Number(value);
    const std::string text = object.substr(5, object.size() - 6);  // between {"x": and }
    EXPECT_TRUE(std::regex_match(text, json_number)) << text;
    const double parsed = std::strtod(text.c_str(), nullptr);
    EXPECT_EQ(parsed, value) << text;
    EXPECT_EQ(std::signbit(parsed), std::signbit(value)) << text;
  }
}

TEST(JsonObjectTest, NonFiniteDoublesBecomeStrings) {
  EXPECT_EQ(JsonObject()
                .AddDouble("a", std::nan(""))
                .AddDouble("b", -std::nan(""))
                .AddDouble("c", INFINITY)
                .AddDouble("d", -INFINITY)
                .ToString(),
            R"({"a":"nan","b":"nan","c":"inf","d":"-inf"})");
}

TEST(JsonObjectTest, DoubleArraysWriteEachElementAsAddDoubleDoes) {
  const std::vector<double> values = {0.1, -2.0, 1e20, INFINITY};
  EXPECT_EQ(JsonObject().AddInt("step", 3).AddDoubleArray("norms", values).ToString(),
            R"({"step":3,"norms":[0.1,-2,1e+20,"inf"]})");
  EXPECT_EQ(JsonObject().AddDoubleArray("empty", {}).ToString(), R"({"empty":[]})");
}

// A path under the test temp directory, removed when the test ends.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_(absl::StrCat(::testing::TempDir(), "nf_jsonl_log_test_", getpid(), "_", name)) {
    std::remove(path_.c_str());
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

TEST(JsonlLogTest, AppendsOneFlushedLinePerRecord) {
  const TempPath file("append.jsonl");
  {
    absl::StatusOr<JsonlLog> log = JsonlLog::Open(file.path());
    NF_ASSERT_OK(log);
    EXPECT_EQ(log->path(), file.path());
    NF_ASSERT_OK(log->Write(JsonObject().AddInt("iter", 1)));
    // Visible before the log is closed: nothing waits in a buffer.
    EXPECT_EQ(Contents(file.path()), "{\"iter\":1}\n");
    NF_ASSERT_OK(log->Write(JsonObject().AddString("msg", "two\nlines")));
  }
  {
    absl::StatusOr<JsonlLog> reopened = JsonlLog::Open(file.path());
    NF_ASSERT_OK(reopened);
    JsonlLog moved = *std::move(reopened);
    NF_ASSERT_OK(moved.Write(JsonObject()));
  }
  EXPECT_EQ(Lines(file.path()),
            (std::vector<std::string>{R"({"iter":1})", R"({"msg":"two\nlines"})", "{}"}));
}

TEST(JsonlLogTest, OpenErrorNamesThePath) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "nf_jsonl_log_test_no_such_dir/metrics.jsonl");
  const absl::StatusOr<JsonlLog> log = JsonlLog::Open(path);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(log.status().message()), HasSubstr(path));
}

}  // namespace
}  // namespace nf::launcher
