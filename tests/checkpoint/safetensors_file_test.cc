// The safetensors reader and writer (checkpoint/safetensors_file.h): what is written reads back
// (tensors, dtypes, metadata in order), and a file that is not a well-formed safetensors file is
// refused with the file, the tensor and the problem named, never read past its bounds.
#include "checkpoint/safetensors_file.h"

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "core/files/durable_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::checkpoint {
namespace {

using ::testing::HasSubstr;

// The writer's temporaries beside `path` (PATH.tmp-PID-N, core/files/atomic_file.h).
int TemporariesOf(const fs::path& path) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(path.parent_path())) {
    count += entry.path().filename().string().starts_with(path.filename().string() + ".tmp");
  }
  return count;
}

NamedTensor Floats(const std::string& name, Shape shape, DType dtype, std::vector<float> values) {
  return {.name = name,
          .shape = shape,
          .data = *TensorFromFloats(dtype, {static_cast<int64_t>(values.size())}, values)};
}

TEST(SafetensorsFileTest, WhatIsWrittenReadsBack) {
  TempDir dir;
  const fs::path path = dir.path() / "t.safetensors";
  const SafetensorsMetadata metadata = {{"z", "last \"quoted\" \\ \n"}, {"a", "first"}};
  NF_ASSERT_OK(WriteSafetensors(
      path, metadata,
      {Floats("w", {2, 3}, DType::kF32, {1, 2, 3, 4, 5, 6}),
       Floats("h", {3}, DType::kF16, {0.5f, -2, 65504}), Floats("b", {1}, DType::kBF16, {3.0f}),
       Floats("scalar", {}, DType::kF32, {7})}));
  const absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  NF_ASSERT_OK(read);
  EXPECT_EQ(read->metadata, metadata);
  ASSERT_EQ(read->tensors.size(), 4u);
  const std::vector<std::string> names = {"w", "h", "b", "scalar"};
  const std::vector<std::vector<float>> values = {{1, 2, 3, 4, 5, 6}, {0.5f, -2, 65504}, {3}, {7}};
  const std::vector<DType> dtypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kF32};
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(read->tensors[i].name, names[i]);
    EXPECT_EQ(read->tensors[i].data.dtype(), dtypes[i]);
    EXPECT_EQ(*ToFloatVector(read->tensors[i].data), values[i]);
  }
  EXPECT_EQ(read->tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(read->tensors[3].shape, Shape{});
  // The data section starts 8-byte aligned, as the safetensors package writes it.
  const std::string bytes = *ReadWholeFile(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  EXPECT_EQ(header % 8, 0u);
}

// What exports and imports of large models rely on: one tensor in memory at a time.
TEST(SafetensorsFileTest, TensorsAreWrittenAndReadOneAtATime) {
  TempDir dir;
  const fs::path path = dir.path() / "t.safetensors";
  const std::vector<NamedTensor> tensors = {Floats("w", {2, 2}, DType::kF32, {1, 2, 3, 4}),
                                            Floats("h", {3}, DType::kF16, {0.5f, -2, 8})};
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(path, {{"k", "v"}},
                                  {{.name = "w", .dtype = DType::kF32, .shape = {2, 2}},
                                   {.name = "h", .dtype = DType::kF16, .shape = {3}}});
    NF_ASSERT_OK(writer);
    NF_ASSERT_OK(writer->Append(tensors[0].data));
    NF_ASSERT_OK(writer->Append(tensors[1].data));
    NF_ASSERT_OK(writer->Commit());
  }
  // The same bytes as the whole file written at once.
  const fs::path whole = dir.path() / "whole.safetensors";
  NF_ASSERT_OK(WriteSafetensors(whole, {{"k", "v"}}, tensors));
  EXPECT_EQ(*ReadWholeFile(path), *ReadWholeFile(whole));

  const absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  NF_ASSERT_OK(reader);
  ASSERT_EQ(reader->entries().size(), 2u);
  EXPECT_EQ(reader->entries()[1].name, "h");
  EXPECT_EQ(reader->Find("w")->shape, (Shape{2, 2}));
  EXPECT_EQ(reader->Find("nope"), nullptr);
  EXPECT_EQ(*ToFloatVector(*reader->Read("h")), (std::vector<float>{0.5f, -2, 8}));
  EXPECT_EQ(*ToFloatVector(*reader->Read("w")), (std::vector<float>{1, 2, 3, 4}));
  const absl::StatusOr<Tensor> unknown = reader->Read("nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr(path.string()));
}

TEST(SafetensorsFileTest, AWriterTakesTheHeadersTensorsInOrderAndLeavesNothingUnlessCommitted) {
  TempDir dir;
  const fs::path path = dir.path() / "t.safetensors";
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(path, {},
                                  {{.name = "w", .dtype = DType::kF32, .shape = {2, 2}},
                                   {.name = "h", .dtype = DType::kF16, .shape = {3}}});
    NF_ASSERT_OK(writer);
    // h's tensor where w's belongs: named, and not written.
    const absl::Status swapped = writer->Append(Floats("h", {3}, DType::kF16, {0.5f, -2, 8}).data);
    EXPECT_THAT(swapped.message(), HasSubstr("tensor w is f32[2,2] in the header"));
    NF_ASSERT_OK(writer->Append(Floats("w", {2, 2}, DType::kF32, {1, 2, 3, 4}).data));
    const absl::Status early = writer->Commit();
    EXPECT_THAT(early.message(), HasSubstr("1 of the 2 tensors were written"));
    EXPECT_EQ(TemporariesOf(path), 1);
    EXPECT_FALSE(fs::exists(path));
  }
  // Destroyed without a commit (a failed export): neither the file nor its temporary remains.
  EXPECT_EQ(TemporariesOf(path), 0);
  EXPECT_FALSE(fs::exists(path));
}

class SafetensorsRefusalTest : public ::testing::Test {
 protected:
  // A file of the length prefix, `header` and `data`.
  fs::path File(const std::string& header, const std::string& data = "") {
    const fs::path path = dir_.path() / "bad.safetensors";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    std::ofstream(path, std::ios::binary) << bytes << header << data;
    return path;
  }
  void ExpectRefused(const fs::path& path, const std::string& mentions) {
    const absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
    ASSERT_FALSE(read.ok());
    EXPECT_THAT(read.status().message(), HasSubstr(path.string()));
    EXPECT_THAT(read.status().message(), HasSubstr(mentions));
  }
  TempDir dir_;
};

TEST_F(SafetensorsRefusalTest, AFileTooShortOrWithAHeaderLongerThanIt) {
  const fs::path tiny = dir_.path() / "tiny";
  std::ofstream(tiny) << "abc";
  ExpectRefused(tiny, "shorter than a safetensors header");
  const fs::path path = File("{}");
  std::string bytes = *ReadWholeFile(path);
  bytes[0] = 100;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  ExpectRefused(path, "the header length 100 does not fit the file's 10 bytes");
}

TEST_F(SafetensorsRefusalTest, MalformedJson) {
  ExpectRefused(File("[]"), "the header is not a JSON object");
  ExpectRefused(File("{\"a\":{}} x"), "text after the header's object");
  ExpectRefused(File("{\"a\":1,\"a\":2}"), "duplicate key \"a\"");
  ExpectRefused(File("{\"a\":{\"b\":{\"c\":[1]}}}"), "nested deeper than a safetensors header");
  ExpectRefused(File("{\"a\":1.5}"), "a fraction where an integer belongs");
  ExpectRefused(File("{\"a\":\"\\ud800\"}"), "a lone surrogate");
  ExpectRefused(File("{\"a\":\"x"), "a string without its closing quote");
  ExpectRefused(File("{\"__metadata__\":{\"k\":1}}"), "__metadata__ \"k\" is not a string");
}

TEST_F(SafetensorsRefusalTest, TensorEntriesThatDoNotDescribeTheirBytes) {
  const std::string four(4, '\0');
  ExpectRefused(File("{\"t\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
                     std::string(8, '\0')),
                "tensor \"t\": dtype \"I64\" (F32, F16 or BF16 are read)");
  ExpectRefused(File("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", four),
                "tensor \"t\": data_offsets [0, 4] hold 4 bytes, its shape and dtype need 8");
  ExpectRefused(File("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", four),
                "tensor \"t\": needs dtype, shape and data_offsets");
  ExpectRefused(
      File("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", four),
      "tensor \"t\": unknown field \"x\"");
  ExpectRefused(
      File("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", four + four),
      "tensor \"t\" starts at data byte 4, where 0 was expected");
  ExpectRefused(
      File("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", four + four),
      "the tensors cover 4 bytes of a data section of 8");
  ExpectRefused(File("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", ""),
                "the tensors cover 4 bytes of a data section of 0");
  ExpectRefused(File("{\"t\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
                     "\"data_offsets\":[0,4]}}",
                     four),
                "a shape too large for a tensor");
}

}  // namespace
}  // namespace nf::checkpoint
