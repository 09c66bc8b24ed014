#include "data/sentencepiece_model_options.h"

#include <cstdint>

namespace nf::data {
namespace {

// Protobuf's wire types (https://protobuf.dev/programming-guides/encoding/). Groups (3, 4) are
// not used by sentencepiece_model.proto and are rejected as malformed.
enum WireType : uint64_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

constexpr uint64_t kTrainerSpec = 2;                       // ModelProto
constexpr uint64_t kNormalizerSpec = 3;                    // ModelProto
constexpr uint64_t kTreatWhitespaceAsSuffix = 24;          // TrainerSpec
constexpr uint64_t kAddDummyPrefix = 3;                    // NormalizerSpec
constexpr uint64_t kRemoveExtraWhitespaces = 4;            // NormalizerSpec
constexpr uint64_t kSplitByWhitespace = 22;                // TrainerSpec
constexpr uint64_t kModelType = 3;                         // TrainerSpec
constexpr uint64_t kUnigram = 1;                           // TrainerSpec.ModelType
constexpr uint64_t kPieces = 1;                            // ModelProto
constexpr uint64_t kPieceText = 1;                         // ModelProto.SentencePiece
constexpr uint64_t kUnkId = 40, kEosId = 42, kPadId = 43;  // TrainerSpec

// One field of a message: its number and wire type, and its value when a varint or bytes.
struct Field {
  uint64_t number = 0;
  uint64_t wire_type = 0;
  uint64_t varint = 0;
  absl::string_view bytes;
};

// A base-128 varint from the front of `in`, which it consumes; false when truncated or longer
// than 10 bytes.
bool ReadVarint(absl::string_view& in, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto byte = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Calls visit(field) for each field of `message` in order (a repeated or merged field appears
// once per occurrence, so the last value wins, as protobuf's parsers decide); false when the
// bytes are not wire format.
template <typename Visit>
bool ForEachField(absl::string_view message, const Visit& visit) {
  while (!message.empty()) {
    uint64_t tag;
    if (!ReadVarint(message, tag)) return false;
    Field field;
    field.number = tag >> 3;
    field.wire_type = tag & 7;
    switch (field.wire_type) {
      case kVarint:
        if (!ReadVarint(message, field.varint)) return false;
        break;
      case kFixed64:
      case kFixed32: {
        const size_t size = field.wire_type == kFixed64 ? 8 : 4;
        if (message.size() < size) return false;
        message.remove_prefix(size);
        break;
      }
      case kLengthDelimited: {
        uint64_t size;
        if (!ReadVarint(message, size) || size > message.size()) return false;
        field.bytes = message.substr(0, size);
        message.remove_prefix(size);
        break;
      }
      default:
        return false;
    }
    visit(field);
  }
  return true;
}

// The varint field `number` of `message` into *value, when present.
bool ReadVarintField(absl::string_view message, uint64_t number, uint64_t* value) {
  return ForEachField(message, [&](const Field& field) {
    if (field.number == number && field.wire_type == kVarint) *value = field.varint;
  });
}

// The bool field `number` of `message` into *value, when present.
bool ReadBool(absl::string_view message, uint64_t number, bool* value) {
  uint64_t varint = *value ? 1 : 0;
  const bool well_formed = ReadVarintField(message, number, &varint);
  *value = varint != 0;
  return well_formed;
}

}  // namespace

absl::StatusOr<SentencePieceModelOptions> ReadModelOptions(absl::string_view model_proto) {
  SentencePieceModelOptions options;
  bool well_formed = true;
  const bool top_level_well_formed = ForEachField(model_proto, [&](const Field& field) {
    if (field.wire_type != kLengthDelimited) return;
    if (field.number == kTrainerSpec) {
      well_formed &=
          ReadBool(field.bytes, kTreatWhitespaceAsSuffix, &options.treat_whitespace_as_suffix);
      well_formed &= ReadBool(field.bytes, kSplitByWhitespace, &options.split_by_whitespace);
      uint64_t model_type = options.unigram ? kUnigram : 0;
      well_formed &= ReadVarintField(field.bytes, kModelType, &model_type);
      options.unigram = model_type == kUnigram;
    } else if (field.number == kNormalizerSpec) {
      well_formed &= ReadBool(field.bytes, kAddDummyPrefix, &options.add_dummy_prefix);
      well_formed &=
          ReadBool(field.bytes, kRemoveExtraWhitespaces, &options.remove_extra_whitespaces);
    }
  });
  if (!top_level_well_formed || !well_formed) {
    return absl::InvalidArgumentError(
        "the SentencePiece model's ModelProto is not well-formed protobuf wire format");
  }
  return options;
}

std::string WithoutDummyPrefix(absl::string_view model_proto) {
  // Field 3 (normalizer_spec), length-delimited, 2 bytes: field 3 (add_dummy_prefix), varint 0.
  constexpr char kNoDummyPrefix[] = {static_cast<char>((kNormalizerSpec << 3) | kLengthDelimited),
                                     2, static_cast<char>((kAddDummyPrefix << 3) | kVarint), 0};
  std::string proto(model_proto);
  proto.append(kNoDummyPrefix, sizeof(kNoDummyPrefix));
  return proto;
}

absl::StatusOr<SentencePieceVocabulary> ReadVocabulary(absl::string_view model_proto) {
  SentencePieceVocabulary vocabulary;
  // The ids as varints (int32 -1 is written as the 64-bit two's complement).
  uint64_t ids[3] = {0, 2, static_cast<uint64_t>(-1)};
  const uint64_t fields[3] = {kUnkId, kEosId, kPadId};
  bool well_formed = true;
  const bool top_level_well_formed = ForEachField(model_proto, [&](const Field& field) {
    if (field.wire_type != kLengthDelimited) return;
    if (field.number == kPieces) {
      std::string piece;
      well_formed &= ForEachField(field.bytes, [&](const Field& f) {
        if (f.number == kPieceText && f.wire_type == kLengthDelimited) piece = std::string(f.bytes);
      });
      vocabulary.pieces.push_back(std::move(piece));
    } else if (field.number == kTrainerSpec) {
      for (int k = 0; k < 3; ++k) well_formed &= ReadVarintField(field.bytes, fields[k], &ids[k]);
    }
  });
  if (!top_level_well_formed || !well_formed) {
    return absl::InvalidArgumentError(
        "the SentencePiece model's ModelProto is not well-formed protobuf wire format");
  }
  std::optional<int32_t>* outs[3] = {&vocabulary.unk_id, &vocabulary.eos_id, &vocabulary.pad_id};
  for (int k = 0; k < 3; ++k) {
    const auto id = static_cast<int64_t>(ids[k]);
    if (id >= 0 && id < static_cast<int64_t>(vocabulary.pieces.size())) {
      *outs[k] = static_cast<int32_t>(id);
    }
  }
  return vocabulary;
}

}  // namespace nf::data
