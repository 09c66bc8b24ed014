#include "launcher/tensorboard_writer.h"

#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "core/files/durable_files.h"
#include "launcher/tensorboard_event.pb.h"

namespace nf::launcher {
namespace {

// TFRecord's checksum: CRC-32C, rotated and offset so that a CRC of CRCs does not vanish.
uint32_t MaskedCrc(const std::string& bytes) {
  const uint32_t crc = checkpoint::Crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string LittleEndian(uint64_t value, int bytes) {
  std::string out(bytes, '\0');
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr int kStringDType = 7;  // TensorFlow's DT_STRING

}  // namespace

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(
    const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", dir.string(), ": ", error.message()));
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const auto seconds = static_cast<int64_t>(WallTime());
  // A new file, created exclusively: never an append to another process's file (two starts
  // within a second, a quick resume, take the next name) nor a write through a link.
  const std::string base = absl::StrCat("events.out.tfevents.", seconds, ".", host);
  constexpr int kNameAttempts = 1000;
  std::unique_ptr<TensorBoardWriter> writer;
  for (int n = 0; writer == nullptr; ++n) {
    const std::filesystem::path path = dir / (n == 0 ? base : absl::StrCat(base, ".", n));
    absl::StatusOr<DurableWriter> out = DurableWriter::Create(path);
    if (out.ok()) {
      writer.reset(new TensorBoardWriter(path, *std::move(out)));
    } else if (!absl::IsAlreadyExists(out.status()) || n == kNameAttempts) {
      return out.status();
    }
  }
  tensorboard::Event version;
  version.set_wall_time(WallTime());
  version.set_file_version("brain.Event:2");
  if (absl::Status written = writer->Write(version); !written.ok()) return written;
  return writer;
}

absl::Status TensorBoardWriter::Scalars(int64_t step,
                                        const std::vector<std::pair<std::string, double>>& values) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  for (const auto& [tag, value] : values) {
    tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return Write(event);
}

absl::Status TensorBoardWriter::Text(int64_t step, const std::string& tag,
                                     const std::string& text) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* tensor = v->mutable_tensor();
  tensor->set_dtype(kStringDType);
  tensor->mutable_tensor_shape();
  tensor->add_string_val(text);
  return Write(event);
}

absl::Status TensorBoardWriter::Write(const tensorboard::Event& event) {
  const std::string data = event.SerializeAsString();
  const std::string length = LittleEndian(data.size(), 8);
  // One write per record: a reader sees whole records (it tolerates a torn last one).
  const std::string record = absl::StrCat(length, LittleEndian(MaskedCrc(length), 4), data,
                                          LittleEndian(MaskedCrc(data), 4));
  return out_.Append(record.data(), static_cast<int64_t>(record.size()));
}

}  // namespace nf::launcher
