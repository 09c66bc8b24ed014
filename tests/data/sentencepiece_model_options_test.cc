// Tests of data/sentencepiece_model_options.h on hand-written ModelProto bytes: the defaults
// when a field is absent, the options read through the fields around them, the last of
// repeated values winning, and malformed bytes refused. (Models trained with each option are in
// chunked_encoding_test.cc.)
#include "data/sentencepiece_model_options.h"

#include <string>

#include "tests/assert_ok.h"
#include "tests/test_util.h"

namespace nf::data {
namespace {

using ::nf::testing::ExpectInvalidArgument;

// Protobuf wire format, written out: a tag is (field number << 3 | wire type).
std::string Varint(uint64_t value) {
  std::string bytes;
  do {
    bytes.push_back(static_cast<char>((value & 0x7F) | (value > 0x7F ? 0x80 : 0)));
    value >>= 7;
  } while (value != 0);
  return bytes;
}
std::string VarintField(int number, uint64_t value) {
  return Varint(number << 3 | 0) + Varint(value);
}
std::string BytesField(int number, const std::string& bytes) {
  return Varint(number << 3 | 2) + Varint(bytes.size()) + bytes;
}
std::string Fixed32Field(int number) { return Varint(number << 3 | 5) + std::string(4, '\x7f'); }

TEST(SentencePieceModelOptionsTest, AbsentFieldsTakeTheProtoDefaults) {
  absl::StatusOr<SentencePieceModelOptions> options = ReadModelOptions("");
  NF_ASSERT_OK(options);
  EXPECT_TRUE(options->add_dummy_prefix);
  EXPECT_FALSE(options->treat_whitespace_as_suffix);
  EXPECT_TRUE(options->unigram);
}

TEST(SentencePieceModelOptionsTest, ReadsTheOptionsAmongOtherFields) {
  // A piece (string 1, float score 2), a trainer spec with model_type 3 and
  // treat_whitespace_as_suffix 24, a normalizer spec with its name 1, add_dummy_prefix 3 and
  // remove_extra_whitespaces 4, and self-test data 4.
  const std::string piece = BytesField(1, "\xe2\x96\x81the") + Fixed32Field(2);
  const std::string trainer = VarintField(3, 1) + VarintField(24, 1) + VarintField(40, 0);
  const std::string normalizer = BytesField(1, "nmt_nfkc") + VarintField(3, 0) + VarintField(4, 1);
  const std::string model =
      BytesField(1, piece) + BytesField(2, trainer) + BytesField(3, normalizer) + BytesField(4, "");
  absl::StatusOr<SentencePieceModelOptions> options = ReadModelOptions(model);
  NF_ASSERT_OK(options);
  EXPECT_FALSE(options->add_dummy_prefix);
  EXPECT_TRUE(options->treat_whitespace_as_suffix);
  EXPECT_TRUE(options->unigram);
  // model_type BPE (2), given in a second trainer spec that protobuf merges into the first.
  options = ReadModelOptions(model + BytesField(2, VarintField(3, 2)));
  NF_ASSERT_OK(options);
  EXPECT_FALSE(options->unigram);
  EXPECT_TRUE(options->treat_whitespace_as_suffix);
  // A field given twice: the last value counts, as protobuf merges it.
  options = ReadModelOptions(model + BytesField(3, VarintField(3, 1)));
  NF_ASSERT_OK(options);
  EXPECT_TRUE(options->add_dummy_prefix);
}

TEST(SentencePieceModelOptionsTest, MalformedBytesAreRefused) {
  for (const std::string& bytes : {
           Varint(3 << 3 | 0),                          // a varint field without its value
           Varint(3 << 3 | 2) + Varint(5) + "ab",       // bytes past the end
           Varint(1 << 3 | 3),                          // a group, not in this schema
           BytesField(3, Varint(3 << 3 | 0) + "\xff"),  // inside the normalizer spec
           std::string(11, '\xff'),                     // a varint longer than 10 bytes
       }) {
    ExpectInvalidArgument(ReadModelOptions(bytes).status(), "not well-formed");
  }
}

}  // namespace
}  // namespace nf::data
