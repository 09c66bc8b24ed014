// The model config a manifest records (checkpoint/manifest_model.h): a manifest written before
// model.first_position existed reads as the numbering it was trained with (0), never as the new
// default (2), so resuming it with a config that resolves to 2 is refused by the model-config
// comparison instead of silently shifting every position by two.
#include <filesystem>

#include "checkpoint/load.h"
#include "checkpoint/manifest_file.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "tests/assert_ok.h"

namespace nf::checkpoint {
namespace {

using ::testing::HasSubstr;

Manifest WithModel(const model::ModelConfig& model) {
  Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  *manifest.mutable_model() = model;
  return manifest;
}

TEST(ManifestModelTest, AManifestWithoutFirstPositionReadsAsZero) {
  // What an older build wrote: the message as it was, without the field.
  const std::string old_bytes = FrameManifestPayload(WithModel({}).SerializeAsString());
  const absl::StatusOr<Manifest> read = DecodeManifest(old_bytes, "old manifest");
  NF_ASSERT_OK(read);
  EXPECT_TRUE(read->model().has_first_position());
  EXPECT_EQ(read->model().first_position(), 0);
}

TEST(ManifestModelTest, ANewManifestRecordsTheRunsFirstPosition) {
  // The run's config leaves the field unset: the manifest records the default it ran with.
  const absl::StatusOr<Manifest> read = DecodeManifest(EncodeManifest(WithModel({})), "new");
  NF_ASSERT_OK(read);
  EXPECT_TRUE(read->model().has_first_position());
  EXPECT_EQ(read->model().first_position(), 2);
  model::ModelConfig zero;
  zero.set_first_position(0);
  const absl::StatusOr<Manifest> zero_read = DecodeManifest(EncodeManifest(WithModel(zero)), "0");
  NF_ASSERT_OK(zero_read);
  EXPECT_EQ(zero_read->model().first_position(), 0);
}

// Recursively: every singular field of `message` is set.
void ExpectEveryFieldSet(const google::protobuf::Message& message) {
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;
    EXPECT_TRUE(message.GetReflection()->HasField(message, field)) << field->full_name();
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      ExpectEveryFieldSet(message.GetReflection()->GetMessage(message, field));
    }
  }
}

TEST(ManifestModelTest, EveryFieldIsRecordedAndRead) {
  const Manifest written = *DecodeManifest(EncodeManifest(WithModel({})), "new");
  ExpectEveryFieldSet(written.model());
  const std::string old_bytes = FrameManifestPayload(WithModel({}).SerializeAsString());
  ExpectEveryFieldSet(DecodeManifest(old_bytes, "old manifest")->model());
}

TEST(ManifestModelTest, ResumingAnOldCheckpointWithTheNewDefaultIsRefused) {
  const std::string old_bytes = FrameManifestPayload(WithModel({}).SerializeAsString());
  const Manifest old = *DecodeManifest(old_bytes, "old manifest");
  const absl::Status refused = CheckSameModel("iter_0000010", old, model::ModelConfig());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              HasSubstr("model.first_position (checkpoint 0, run 2) (--set "
                        "model.first_position=0 continues it with the position numbering it was "
                        "trained with)"));
  model::ModelConfig as_trained;
  as_trained.set_first_position(0);
  NF_EXPECT_OK(CheckSameModel("iter_0000010", old, as_trained));
}

}  // namespace
}  // namespace nf::checkpoint
