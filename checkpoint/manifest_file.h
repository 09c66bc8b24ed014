// manifest.pb on disk: the Manifest message framed so that every byte of it is checked before
// anything in it is believed (a flipped bit in a step count or a piece offset is otherwise a
// valid protobuf, and a silently different run).
//
//   bytes [0, 8)    magic "NFMANIF\x02" (format 2; format 1 was the bare message)
//   bytes [8, 16)   u64 little-endian: payload length
//   bytes [16, 20)  u32 little-endian: CRC-32C of the payload
//   bytes [20, ...) payload: the serialized Manifest, exactly `length` bytes
//
// Decoding then checks the manifest's own consistency (ValidateManifest): what a reader may
// index or allocate by is in range, and the pieces tile every shard file exactly, so every byte
// of a checkpoint is under some checksum.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.pb.h"

namespace nf::checkpoint {

inline constexpr int kFormatVersion = 2;

// The file's bytes for `manifest` (its format_version must be kFormatVersion).
std::string EncodeManifest(const Manifest& manifest);
// The file's bytes for a payload given as bytes: the header, then `payload`.
std::string FrameManifestPayload(absl::string_view payload);

// The manifest in `bytes`, or DataLoss naming `where` (the file) and what is wrong: bad magic,
// length, checksum, an unparsable payload, an inconsistent manifest; FailedPrecondition for
// another format version. Never crashes or allocates by a size it has not checked.
absl::StatusOr<Manifest> DecodeManifest(absl::string_view bytes, absl::string_view where);

// The structural checks DecodeManifest applies: counters >= 0, shard files named plainly and
// once each, every tensor record a known kind and dtype with a valid global shape, every piece
// inside a listed file with a length that matches its element range, and the pieces of each file
// covering it exactly once (no byte outside a checksum, none claimed twice).
absl::Status ValidateManifest(const Manifest& manifest, absl::string_view where);

// DataLoss naming `where` when a tensor record's name or global shape is not what the manifest's
// model config (and its layout's vocabulary padding) gives: a config that says vocab_size 2^24
// over tensors of 512 rows would make every reader allocate for the config's size before failing.
// DecodeManifest applies it to every manifest with a model.
absl::Status CheckTensorsFollowModel(const Manifest& manifest, absl::string_view where);

}  // namespace nf::checkpoint
