// nf-preprocess's input side: the JSONL field scanner and the three document formats.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/document_reader.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("nf_document_reader_" + std::to_string(getpid()) + name);
  std::ofstream(path, std::ios::binary) << contents;
  return path.string();
}

std::vector<std::string> ReadAll(const std::string& path, InputFormat format,
                                 const std::string& key = "text") {
  auto reader = DocumentReader::Open(path, format, key);
  NF_EXPECT_OK(reader);
  std::vector<std::string> documents;
  while (true) {
    auto next = (*reader)->Next();
    NF_EXPECT_OK(next);
    if (!next.ok() || !next->has_value()) break;
    documents.push_back(**next);
  }
  return documents;
}

TEST(JsonStringFieldTest, FindsTheFieldAndDecodesEscapes) {
  auto v = JsonStringField(
      R"({"id": 3, "meta": {"a": [1, 2.5e-3, null, true]}, "text": "a\"b\\c\n\u00e9\ud83d\ude00"})",
      "text");
  NF_ASSERT_OK(v);
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ(**v, "a\"b\\c\n\xC3\xA9\xF0\x9F\x98\x80");  // é, 😀 as UTF-8
  auto missing = JsonStringField(R"({"title": "x"})", "text");
  NF_ASSERT_OK(missing);
  EXPECT_FALSE(missing->has_value());
  auto other_key = JsonStringField(R"({"title": "x", "text": "y"})", "title");
  EXPECT_EQ(**other_key, "x");
}

TEST(JsonStringFieldTest, RejectsMalformedJsonWithoutReadingPastTheEnd) {
  for (const std::string bad :
       {"", "{", "[]", R"({"text": 3})", R"({"text": "unterminated)", R"({"text": "\q"})",
        R"({"text": "\ud800"})", R"({"text": "\u12"})", R"({"a" 1})", R"({"a": tru})",
        R"({"a": 1,})", R"({"text": "x"} trailing)", "{\"text\": \"tab\tinside\"}"}) {
    EXPECT_FALSE(JsonStringField(bad, "text").ok()) << bad;
  }
  std::string deep = "{\"a\": ";
  for (int i = 0; i < 100; ++i) deep += "[";
  EXPECT_FALSE(JsonStringField(deep, "text").ok());  // depth limit, no stack overflow
}

TEST(DocumentReaderTest, JsonlSkipsBlankLinesAndEmptyTextsAndNamesBadLines) {
  const std::string path = WriteTemp("a.jsonl",
                                     "{\"text\": \"first\"}\n\n{\"text\": \"\"}\r\n"
                                     "{\"body\": \"second\", \"text\": \"x\\ny\"}\n");
  EXPECT_EQ(ReadAll(path, InputFormat::kJsonl), (std::vector<std::string>{"first", "x\ny"}));

  const std::string bad = WriteTemp("b.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  auto reader = DocumentReader::Open(bad, InputFormat::kJsonl, "text");
  NF_ASSERT_OK(reader);
  NF_ASSERT_OK((*reader)->Next());
  auto error = (*reader)->Next();
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.status().message().find(bad + ":2:"), std::string::npos) << error.status();

  const std::string no_key = WriteTemp("c.jsonl", "{\"body\": \"x\"}\n");
  auto keyless = DocumentReader::Open(no_key, InputFormat::kJsonl, "text");
  ExpectInvalidArgument((*keyless)->Next().status(), "--json-key");
}

// With keep_empty, what is skipped above comes back as "": an empty JSONL text, a blank line of
// the lines format; a blank line of JSONL is still no document, and paragraphs are unchanged.
TEST(DocumentReaderTest, KeepEmptyReturnsEmptyDocuments) {
  const std::string jsonl = WriteTemp("k.jsonl",
                                      "{\"text\": \"\"}\n{\"text\": \"first\"}\n\n"
                                      "{\"text\": \"\"}\r\n{\"text\": \" \"}\n");
  const auto read_all = [](const std::string& path, InputFormat format) {
    auto reader = DocumentReader::Open(path, format, "text", /*keep_empty=*/true);
    NF_EXPECT_OK(reader);
    std::vector<std::string> documents;
    while (reader.ok()) {
      auto document = (*reader)->Next();
      NF_EXPECT_OK(document);
      if (!document.ok() || !document->has_value()) break;
      documents.push_back(**document);
    }
    return documents;
  };
  EXPECT_EQ(read_all(jsonl, InputFormat::kJsonl), (std::vector<std::string>{"", "first", "", " "}));
  const std::string text = WriteTemp("k.txt", "\none\n \t\ntwo\n\n\nthree\n");
  EXPECT_EQ(read_all(text, InputFormat::kLines),
            (std::vector<std::string>{"", "one", "", "two", "", "", "three"}));
  EXPECT_EQ(read_all(text, InputFormat::kParagraphs),
            (std::vector<std::string>{"one", "two", "three"}));
}

TEST(DocumentReaderTest, LinesAndParagraphs) {
  const std::string path = WriteTemp("t.txt", "one\ntwo\n\n\nthree a\nthree b\n\nfour");
  EXPECT_EQ(ReadAll(path, InputFormat::kLines),
            (std::vector<std::string>{"one", "two", "three a", "three b", "four"}));
  EXPECT_EQ(ReadAll(path, InputFormat::kParagraphs),
            (std::vector<std::string>{"one\ntwo", "three a\nthree b", "four"}));
}

// A read error is an error naming the file and the OS's reason, never the end of the input (it
// was: a directory as --input gave an empty dataset and exit 0).
TEST(DocumentReaderTest, ADirectoryOrAReadErrorIsNotTheEndOfTheInput) {
  const std::string dir = std::filesystem::path(WriteTemp("d.txt", "x")).parent_path().string();
  const auto directory = DocumentReader::Open(dir, InputFormat::kLines, "text");
  ExpectInvalidArgument(directory.status(), "input " + dir + " is a directory");
  // Reading /proc/self/mem from offset 0 fails with EIO: an unreadable file, deterministically.
  auto unreadable = DocumentReader::Open("/proc/self/mem", InputFormat::kLines, "text");
  NF_ASSERT_OK(unreadable);
  const auto next = (*unreadable)->Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable) << next.status();
  EXPECT_EQ(next.status().message(),
            "cannot read input /proc/self/mem after line 0: Input/output error");
}

TEST(DocumentReaderTest, MissingFileAndFormatNames) {
  auto missing = DocumentReader::Open("/nonexistent/corpus.jsonl", InputFormat::kJsonl, "text");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/corpus.jsonl"), std::string::npos);
  EXPECT_EQ(*ParseInputFormat("paragraphs"), InputFormat::kParagraphs);
  ExpectInvalidArgument(ParseInputFormat("csv").status(), "csv");
}

}  // namespace
}  // namespace nf::data
