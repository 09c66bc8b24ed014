// Machine-readable run logs: one JSON object per line (JSON Lines), appended and flushed as
// each record is written so that a crashed or killed run leaves every record it got to.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nf::launcher {

// A flat JSON object built member by member, in insertion order:
//   JsonObject().AddString("event", "train").AddInt("iter", 10).AddDouble("loss", 2.5)
// Strings are escaped (invalid UTF-8 bytes become U+FFFD, so every line is valid JSON);
// finite doubles are written with the fewest digits that read back to the same double, and
// NaN and infinities, which JSON cannot express as numbers, as the strings "nan", "inf" and
// "-inf". Keys must be distinct; that is the caller's responsibility.
class JsonObject {
 public:
  JsonObject& AddString(absl::string_view key, absl::string_view value);
  JsonObject& AddInt(absl::string_view key, int64_t value);
  JsonObject& AddDouble(absl::string_view key, double value);
  JsonObject& AddBool(absl::string_view key, bool value);
  // [v0, v1, ...], each element written as AddDouble writes a value.
  JsonObject& AddDoubleArray(absl::string_view key, absl::Span<const double> values);
  // [v0, v1, ...] of integers (token ids).
  JsonObject& AddIntArray(absl::string_view key, absl::Span<const int32_t> values);
  // A nested object: "key":{...} with `value`'s members.
  JsonObject& AddObject(absl::string_view key, const JsonObject& value);

  // The object on one line, "{}" when empty.
  std::string ToString() const;

 private:
  void AddKey(absl::string_view key);

  std::string members_;  // "\"key\":value" pieces joined by commas
};

class JsonlLog {
 public:
  // Opens `path` for appending, creating it if needed. The error names the path.
  static absl::StatusOr<JsonlLog> Open(const std::string& path);

  JsonlLog(JsonlLog&& other) noexcept;
  JsonlLog& operator=(JsonlLog&& other) noexcept;
  JsonlLog(const JsonlLog&) = delete;
  JsonlLog& operator=(const JsonlLog&) = delete;
  ~JsonlLog();

  // Appends the record and a newline with a single write to the file: nothing is buffered in
  // the process, and with O_APPEND lines from several writers never interleave.
  absl::Status Write(const JsonObject& record);

  const std::string& path() const { return path_; }

 private:
  JsonlLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

}  // namespace nf::launcher
