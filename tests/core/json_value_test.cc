// core/json_value: the general JSON reader (nf-eval's task files, nf-generate's prompts).
#include "core/json_value.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/assert_ok.h"

namespace nf {
namespace {

using ::testing::HasSubstr;

TEST(JsonValueTest, ReadsATaskLine) {
  const auto value = ParseJson(
      R"( {"ctx": "A man", "endings": ["a", "b\n\"c\""], "label": 3, "x": {"y": [null, true]},)"
      R"( "f": -1.5e2} )");
  NF_ASSERT_OK(value);
  ASSERT_EQ(value->kind, JsonValue::Kind::kObject);
  EXPECT_EQ(value->members.at("ctx").text, "A man");
  const JsonValue& endings = value->members.at("endings");
  ASSERT_EQ(endings.items.size(), 2u);
  EXPECT_EQ(endings.items[1].text, "b\n\"c\"");
  EXPECT_EQ(value->members.at("label").kind, JsonValue::Kind::kNumber);
  EXPECT_EQ(value->members.at("label").text, "3");
  EXPECT_EQ(value->members.at("f").number, -150.0);
  const JsonValue& nested = value->members.at("x").members.at("y");
  EXPECT_EQ(nested.items[0].kind, JsonValue::Kind::kNull);
  EXPECT_TRUE(nested.items[1].boolean);
}

TEST(JsonValueTest, DecodesEscapesToUtf8) {
  const auto value = ParseJson(R"("\u00e9\u20ac\ud83d\ude00\/\t")");
  NF_ASSERT_OK(value);
  EXPECT_EQ(value->text, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80/\t");
}

// A repeated key keeps its last value, whole: not merged with the first.
TEST(JsonValueTest, ARepeatedKeyKeepsItsLastValue) {
  const auto value = ParseJson(R"({"a": [1, 2], "a": [3]})");
  NF_ASSERT_OK(value);
  ASSERT_EQ(value->members.at("a").items.size(), 1u);
  EXPECT_EQ(value->members.at("a").items[0].text, "3");
}

TEST(JsonValueTest, RefusesMalformedLinesNamingTheColumn) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a": 1,})", "column 9: expected a string key"},
      {R"({"a" 1})", "column 6: expected ':'"},
      {R"([1, 2)", "column 6: expected ',' or ']'"},
      {R"({"a": 1 "b": 2})", "column 9: expected ',' or '}'"},
      {R"("abc)", "column 5: a string without its closing quote"},
      {R"("\ud800x")", "column 2: a lone surrogate: a high surrogate without its low surrogate"},
      {R"("\udc00")", "column 2: a lone surrogate: an unpaired low surrogate"},
      {R"("\q")", "column 2: unknown escape '\\q'"},
      {R"("\u12x4")", "column 6: a \\u escape needs four hex digits"},
      {R"(01)", "column 1: a leading zero in a number"},
      {R"(-)", "column 2: expected digits in a number"},
      {R"(1.)", "column 3: expected digits after '.'"},
      {R"(1e+)", "column 4: expected digits in a number's exponent"},
      {R"({"a": tru})", "column 7: unexpected character 't'"},
      {"\"a\tb\"", "column 3: a control character in a string"},
      {R"({} x)", "column 4: unexpected text after the value"},
      {"", "column 1: expected a value, found the end of the text"},
  };
  for (const auto& [text, message] : cases) {
    const auto value = ParseJson(text);
    ASSERT_FALSE(value.ok()) << text;
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(value.status().message(), HasSubstr(message)) << text;
  }
}

TEST(JsonValueTest, RefusesNestingDeeperThan64) {
  EXPECT_THAT(ParseJson(std::string(100, '[') + std::string(100, ']')).status().message(),
              HasSubstr("nested deeper than 64 levels"));
  NF_EXPECT_OK(ParseJson(std::string(60, '[') + std::string(60, ']')));
}

// With no tree to fill, a value is checked as strictly and passed over.
TEST(JsonValueTest, ReadJsonValueWithoutATreeChecksAndPassesOver) {
  JsonCursor cursor(R"({"a": [1, {"b": "\u00e9"}], "c": null} rest)");
  NF_ASSERT_OK(ReadJsonValue(cursor, nullptr));
  EXPECT_EQ(cursor.offset(), 38u);  // just after the object
  JsonCursor bad(R"({"a": [1, {"b": "\x"}]})");
  EXPECT_THAT(ReadJsonValue(bad, nullptr).message(), HasSubstr("column 18: unknown escape"));
}

}  // namespace
}  // namespace nf
