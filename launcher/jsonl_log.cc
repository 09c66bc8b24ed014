// JSON Lines: string escaping, number formatting and whole-line appends.
#include "launcher/jsonl_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/files/durable_files.h"
#include "core/status.h"

namespace nf::launcher {
namespace {

// The length of the well-formed UTF-8 sequence starting at text[i], or 0 if there is none
// (stray continuation byte, truncated, overlong, surrogate or beyond U+10FFFF).
size_t Utf8SequenceLength(absl::string_view text, size_t i) {
  const unsigned char lead = static_cast<unsigned char>(text[i]);
  if (lead < 0x80) return 1;
  size_t length;
  uint32_t code_point;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code_point = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code_point = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    const unsigned char next = static_cast<unsigned char>(text[i + k]);
    if ((next & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (next & 0x3F);
  }
  // Below kSmallest[length] a shorter sequence was required (an overlong form).
  constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < kSmallest[length] || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    return 0;
  }
  return length;
}

void AppendQuoted(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const size_t length = Utf8SequenceLength(text, i);
    if (length == 0) {
      out->append("\\ufffd");
      ++i;
      continue;
    }
    if (length > 1) {
      out->append(text.data() + i, length);
      i += length;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[7];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out->append(escaped);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// A double as a JSON value: the shortest round-trip form of a finite one (always valid JSON:
// "1e+20", "-0", "0.1", never locale-dependent), the strings "nan", "inf", "-inf" otherwise.
void AppendJsonDouble(double value, std::string& out) {
  if (std::isnan(value)) {
    out.append("\"nan\"");
  } else if (std::isinf(value)) {
    out.append(value > 0 ? "\"inf\"" : "\"-inf\"");
  } else {
    char digits[32];
    const std::to_chars_result result = std::to_chars(digits, digits + sizeof(digits), value);
    out.append(digits, result.ptr);
  }
}

}  // namespace

void JsonObject::AddKey(absl::string_view key) {
  if (!members_.empty()) members_.push_back(',');
  AppendQuoted(key, &members_);
  members_.push_back(':');
}

JsonObject& JsonObject::AddString(absl::string_view key, absl::string_view value) {
  AddKey(key);
  AppendQuoted(value, &members_);
  return *this;
}

JsonObject& JsonObject::AddInt(absl::string_view key, int64_t value) {
  AddKey(key);
  absl::StrAppend(&members_, value);
  return *this;
}

JsonObject& JsonObject::AddDouble(absl::string_view key, double value) {
  AddKey(key);
  AppendJsonDouble(value, members_);
  return *this;
}

JsonObject& JsonObject::AddDoubleArray(absl::string_view key, absl::Span<const double> values) {
  AddKey(key);
  members_.push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) members_.push_back(',');
    AppendJsonDouble(values[i], members_);
  }
  members_.push_back(']');
  return *this;
}

JsonObject& JsonObject::AddIntArray(absl::string_view key, absl::Span<const int32_t> values) {
  AddKey(key);
  members_.push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) members_.push_back(',');
    absl::StrAppend(&members_, values[i]);
  }
  members_.push_back(']');
  return *this;
}

JsonObject& JsonObject::AddObject(absl::string_view key, const JsonObject& value) {
  AddKey(key);
  members_.append(value.ToString());
  return *this;
}

JsonObject& JsonObject::AddBool(absl::string_view key, bool value) {
  AddKey(key);
  members_.append(value ? "true" : "false");
  return *this;
}

std::string JsonObject::ToString() const { return absl::StrCat("{", members_, "}"); }

absl::StatusOr<JsonlLog> JsonlLog::Open(const std::string& path) {
  NF_ASSIGN_OR_RETURN(const int fd, OpenForAppend(path, O_WRONLY, "log"));
  return JsonlLog(path, fd);
}

JsonlLog::JsonlLog(JsonlLog&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

JsonlLog& JsonlLog::operator=(JsonlLog&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

JsonlLog::~JsonlLog() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status JsonlLog::Write(const JsonObject& record) {
  const std::string line = absl::StrCat(record.ToString(), "\n");
  size_t written = 0;
  // A regular file takes the whole line at once; the loop covers signals and exotic files.
  while (written < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot append to log ", path_, ": ", std::strerror(errno)));
    }
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace nf::launcher
