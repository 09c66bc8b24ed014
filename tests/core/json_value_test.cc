// eval/json_value: the task files' JSON reader.
#include "eval/json_value.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/assert_ok.h"

namespace nf::eval {
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

TEST(JsonValueTest, RefusesMalformedLinesNamingTheColumn) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a": 1,})", "column 9: expected a member name"},
      {R"({"a" 1})", "column 6: expected ':'"},
      {R"([1, 2)", "column 6: expected ',' or ']'"},
      {R"("abc)", "unterminated string"},
      {R"("\ud800x")", "a high surrogate without its low surrogate"},
      {R"("\udc00")", "a lone low surrogate"},
      {R"(01)", "unexpected text after the value"},
      {R"(-)", "expected digits"},
      {R"({"a": tru})", "unexpected character 't'"},
      {"\"a\tb\"", "control character"},
      {R"({} x)", "unexpected text after the value"},
  };
  for (const auto& [text, message] : cases) {
    const auto value = ParseJson(text);
    ASSERT_FALSE(value.ok()) << text;
    EXPECT_THAT(value.status().message(), HasSubstr(message)) << text;
  }
}

TEST(JsonValueTest, RefusesNestingDeeperThan64) {
  EXPECT_FALSE(ParseJson(std::string(100, '[') + std::string(100, ']')).ok());
  NF_EXPECT_OK(ParseJson(std::string(60, '[') + std::string(60, ']')));
}

}  // namespace
}  // namespace nf::eval
