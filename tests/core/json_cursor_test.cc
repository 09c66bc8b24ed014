// core/json_cursor: JSON's tokens, object and array loops, and how errors name their place.
#include "core/json_cursor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/assert_ok.h"

namespace nf {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(JsonCursorTest, ErrorsNameTheirPlaceAsTheReaderCountsPlaces) {
  const absl::string_view text = "{\n  \"a\": 1,\n  x";
  const size_t x = text.find('x');
  EXPECT_EQ(JsonCursor(text).ErrorAt(x, "what").message(), "column 15: what");
  EXPECT_EQ(JsonCursor(text, JsonPlaces::kLineAndColumn, "v.json").ErrorAt(x, "what").message(),
            "v.json:3:3: what");
  EXPECT_EQ(JsonCursor(text, JsonPlaces::kLineAndColumn, "v.json").ErrorAt(0, "what").message(),
            "v.json:1:1: what");
  EXPECT_EQ(JsonCursor(text, JsonPlaces::kByte, "header").ErrorAt(x, "what").message(),
            "header byte 14: what");
  EXPECT_EQ(JsonCursor(text).Error("what").code(), absl::StatusCode::kInvalidArgument);
}

TEST(JsonCursorTest, ReadsStringsIntoAStringOrOnlyChecksThem) {
  JsonCursor cursor(R"("plain \"run\" \u0041\ud83d\ude00" "x\u00e9")");
  std::string first = "kept:";
  NF_ASSERT_OK(cursor.ReadString(&first));
  EXPECT_EQ(first, "kept:plain \"run\" A\xF0\x9F\x98\x80");
  cursor.SkipSpace();
  NF_ASSERT_OK(cursor.ReadString(nullptr));
  EXPECT_TRUE(cursor.AtEnd());
  // Bytes outside ASCII are copied as they are (only a reader that must see UTF-8 checks them).
  JsonCursor raw("\"\xff\xC3\xA9\"");
  std::string bytes;
  NF_ASSERT_OK(raw.ReadString(&bytes));
  EXPECT_EQ(bytes, "\xff\xC3\xA9");
}

TEST(JsonCursorTest, ReadsNumbersAsWritten) {
  for (const absl::string_view number : {"0", "-0", "12", "-3.25", "1e5", "2.5E-3", "7e+2"}) {
    const std::string text = absl::StrCat(number, ",");  // the cursor views it: keep it alive
    JsonCursor cursor(text);
    const absl::StatusOr<absl::string_view> literal = cursor.ReadNumber();
    NF_ASSERT_OK(literal);
    EXPECT_EQ(*literal, number);
    EXPECT_EQ(cursor.Peek(), ',');
  }
}

TEST(JsonCursorTest, ObjectAndArrayLoopsHandTheValuesToTheReader) {
  JsonCursor cursor(R"({ "a" : [1, 2], "b\n": [] })");
  std::vector<std::pair<std::string, size_t>> names;
  std::vector<std::string> numbers;
  NF_ASSERT_OK(cursor.ReadObject([&](std::string name, size_t name_offset) {
    names.emplace_back(std::move(name), name_offset);
    return cursor.ReadArray([&]() -> absl::Status {
      absl::StatusOr<absl::string_view> number = cursor.ReadNumber();
      if (!number.ok()) return number.status();
      numbers.emplace_back(*number);
      return absl::OkStatus();
    });
  }));
  EXPECT_TRUE(cursor.AtEnd());
  EXPECT_THAT(names, ElementsAre(Pair("a", 2), Pair("b\n", 16)));
  EXPECT_THAT(numbers, ElementsAre("1", "2"));
}

}  // namespace
}  // namespace nf
