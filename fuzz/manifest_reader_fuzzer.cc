// libFuzzer target for DecodeManifest (checkpoint/manifest_file.h), what every load, resume and
// `nf-ckpt verify` believes first: whatever the bytes of a manifest.pb, decoding either fails
// with a status or returns a manifest that keeps ValidateManifest's promises, and that encodes
// and decodes again to the same message. ASan and UBSan watch the parsing and the checks.
//
// Each input is tried twice: as a whole file (the header's checks), and as a payload framed with
// a correct header, so that the fuzzer reaches the protobuf parser and the structural checks
// past the checksum (inputs a random flip cannot produce but a bad build could write).
// make_manifest_seeds writes valid files and payloads as seeds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/manifest_file.h"

namespace {

void Check(const std::string& bytes) {
  const auto manifest = nf::checkpoint::DecodeManifest(bytes, "fuzz");
  if (!manifest.ok()) return;
  if (!nf::checkpoint::ValidateManifest(*manifest, "fuzz").ok()) std::abort();
  const auto again =
      nf::checkpoint::DecodeManifest(nf::checkpoint::EncodeManifest(*manifest), "fuzz");
  if (!again.ok() || again->SerializeAsString() != manifest->SerializeAsString()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  Check(nf::checkpoint::FrameManifestPayload(bytes));
  return 0;
}
