// Rank 0's TensorBoard event file, the field's default view of a run: RUN/tensorboard/
// events.out.tfevents.<seconds>.<host>, one per process start (TensorBoard reads every file of
// the folder). Each record is a TFRecord: the length (8 bytes, little-endian), its masked
// CRC-32C, the serialised Event (launcher/tensorboard_event.proto), the Event's masked CRC-32C.
// The first record is the file version; each later one holds scalars at a step, or the run's
// configuration as text. Flushed after every write, so TensorBoard follows a running job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/files/durable_files.h"

namespace nf::launcher {

namespace tensorboard {
class Event;
}

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::filesystem::path& dir);

  // Scalars (tag, value) at `step`, e.g. {"train/loss", 2.31}.
  absl::Status Scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // A text (markdown) for TensorBoard's text plugin.
  absl::Status Text(int64_t step, const std::string& tag, const std::string& text);

  const std::filesystem::path& path() const { return path_; }

 private:
  TensorBoardWriter(std::filesystem::path path, DurableWriter out)
      : path_(std::move(path)), out_(std::move(out)) {}
  absl::Status Write(const tensorboard::Event& event);

  std::filesystem::path path_;
  DurableWriter out_;
};

}  // namespace nf::launcher
