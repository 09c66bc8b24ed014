#include "checkpoint/safetensors_file.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "checkpoint/durable_files.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

// The JSON header is bounded like the safetensors package bounds it (100 MB): a larger one is
// not a header but damage, and must not make us allocate by it.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

absl::StatusOr<std::string> DTypeCode(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::string("F32");
    case DType::kF16:
      return std::string("F16");
    case DType::kBF16:
      return std::string("BF16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors files here hold f32, f16 or bf16, not ", DTypeName(dtype)));
  }
}

// JSON string contents: escape what JSON needs.
std::string JsonEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
      continue;
    }
    out += c;
  }
  return out;
}

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", JsonEscape(s), "\""); }

// The subset of JSON a safetensors header uses: objects, arrays, strings and non-negative
// integers. Objects keep their keys in order.
struct JsonValue {
  enum Kind { kObject, kArray, kString, kInteger } kind = kObject;
  std::vector<std::pair<std::string, JsonValue>> members;
  std::vector<JsonValue> elements;
  std::string text;
  uint64_t integer = 0;
};

class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view json) : json_(json) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    NF_ASSIGN_OR_RETURN(JsonValue value, Parse(0));
    SkipSpace();
    if (pos_ != json_.size()) return Error("text after the header's object");
    return value;
  }

 private:
  // Nesting deeper than a header's (object > tensor entry > shape array) is refused.
  static constexpr int kMaxDepth = 3;

  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("header byte ", pos_, ": ", what));
  }
  void SkipSpace() {
    while (pos_ < json_.size() && (json_[pos_] == ' ' || json_[pos_] == '\t' ||
                                   json_[pos_] == '\n' || json_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < json_.size() && json_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::StatusOr<JsonValue> Parse(int depth) {
    SkipSpace();
    if (pos_ >= json_.size()) return Error("the header ends inside a value");
    const char c = json_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= kMaxDepth) return Error("nested deeper than a safetensors header");
      return c == '{' ? ParseObject(depth) : ParseArray(depth);
    }
    JsonValue value;
    if (c == '"') {
      value.kind = JsonValue::kString;
      NF_ASSIGN_OR_RETURN(value.text, ParseString());
      return value;
    }
    if (c >= '0' && c <= '9') {
      value.kind = JsonValue::kInteger;
      NF_ASSIGN_OR_RETURN(value.integer, ParseInteger());
      return value;
    }
    return Error("expected an object, array, string or non-negative integer");
  }

  absl::StatusOr<JsonValue> ParseObject(int depth) {
    ++pos_;  // '{'
    JsonValue object;
    object.kind = JsonValue::kObject;
    if (Consume('}')) return object;
    do {
      SkipSpace();
      if (pos_ >= json_.size() || json_[pos_] != '"') return Error("expected a key");
      NF_ASSIGN_OR_RETURN(std::string key, ParseString());
      for (const auto& member : object.members) {
        if (member.first == key) return Error(absl::StrCat("duplicate key ", Quoted(key)));
      }
      if (!Consume(':')) return Error("expected ':'");
      NF_ASSIGN_OR_RETURN(JsonValue value, Parse(depth + 1));
      object.members.emplace_back(std::move(key), std::move(value));
    } while (Consume(','));
    if (!Consume('}')) return Error("expected ',' or '}'");
    return object;
  }

  absl::StatusOr<JsonValue> ParseArray(int depth) {
    ++pos_;  // '['
    JsonValue array;
    array.kind = JsonValue::kArray;
    if (Consume(']')) return array;
    do {
      NF_ASSIGN_OR_RETURN(JsonValue value, Parse(depth + 1));
      array.elements.push_back(std::move(value));
    } while (Consume(','));
    if (!Consume(']')) return Error("expected ',' or ']'");
    return array;
  }

  absl::StatusOr<uint64_t> ParseInteger() {
    uint64_t value = 0;
    const size_t begin = pos_;
    while (pos_ < json_.size() && json_[pos_] >= '0' && json_[pos_] <= '9') {
      if (value > (uint64_t{1} << 53)) return Error("an integer too large for a size");
      value = value * 10 + static_cast<uint64_t>(json_[pos_] - '0');
      ++pos_;
    }
    if (pos_ - begin > 1 && json_[begin] == '0') return Error("an integer with a leading zero");
    if (pos_ < json_.size() && (json_[pos_] == '.' || json_[pos_] == 'e' || json_[pos_] == 'E')) {
      return Error("a fraction where an integer belongs");
    }
    return value;
  }

  absl::StatusOr<uint32_t> ParseHex4() {
    if (pos_ + 4 > json_.size()) return Error("a \\u escape cut short");
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = json_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') {
        code |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        code |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        code |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return Error("a \\u escape with a non-hex digit");
      }
    }
    return code;
  }

  static void AppendUtf8(uint32_t code, std::string& out) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  absl::StatusOr<std::string> ParseString() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= json_.size()) return Error("a string without its closing quote");
      const char c = json_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) return Error("a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= json_.size()) return Error("an escape cut short");
      const char e = json_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          NF_ASSIGN_OR_RETURN(uint32_t code, ParseHex4());
          if (code >= 0xD800 && code < 0xDC00) {  // a high surrogate: its pair must follow
            if (pos_ + 2 > json_.size() || json_[pos_] != '\\' || json_[pos_ + 1] != 'u') {
              return Error("a lone surrogate in a \\u escape");
            }
            pos_ += 2;
            NF_ASSIGN_OR_RETURN(const uint32_t low, ParseHex4());
            if (low < 0xDC00 || low >= 0xE000) return Error("a lone surrogate in a \\u escape");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code < 0xE000) {
            return Error("a lone surrogate in a \\u escape");
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return Error("an unknown escape");
      }
    }
  }

  absl::string_view json_;
  size_t pos_ = 0;
};

struct HeaderEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // bytes into the data section
};

absl::StatusOr<HeaderEntry> ParseEntry(const std::string& name, const JsonValue& value) {
  const auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("tensor ", Quoted(name), ": ", what));
  };
  if (value.kind != JsonValue::kObject) return bad("its entry is not an object");
  HeaderEntry entry;
  entry.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : value.members) {
    if (key == "dtype") {
      if (field.kind != JsonValue::kString) return bad("dtype is not a string");
      if (field.text == "F32") {
        entry.dtype = DType::kF32;
      } else if (field.text == "F16") {
        entry.dtype = DType::kF16;
      } else if (field.text == "BF16") {
        entry.dtype = DType::kBF16;
      } else {
        return bad(absl::StrCat("dtype ", Quoted(field.text), " (F32, F16 or BF16 are read)"));
      }
      has_dtype = true;
    } else if (key == "shape") {
      if (field.kind != JsonValue::kArray) return bad("shape is not an array");
      for (const JsonValue& dim : field.elements) {
        if (dim.kind != JsonValue::kInteger || dim.integer > (uint64_t{1} << 40)) {
          return bad("shape holds something other than a dimension");
        }
        entry.shape.push_back(static_cast<int64_t>(dim.integer));
      }
      has_shape = true;
    } else if (key == "data_offsets") {
      if (field.kind != JsonValue::kArray || field.elements.size() != 2 ||
          field.elements[0].kind != JsonValue::kInteger ||
          field.elements[1].kind != JsonValue::kInteger) {
        return bad("data_offsets is not [begin, end]");
      }
      entry.begin = field.elements[0].integer;
      entry.end = field.elements[1].integer;
      has_offsets = true;
    } else {
      return bad(absl::StrCat("unknown field ", Quoted(key)));
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) return bad("needs dtype, shape and data_offsets");
  constexpr uint64_t kMaxElements = uint64_t{1} << 48;
  uint64_t elements = 1;
  for (int64_t dim : entry.shape) {
    if (dim != 0 && elements > kMaxElements / static_cast<uint64_t>(dim)) {
      return bad("a shape too large for a tensor");
    }
    elements *= static_cast<uint64_t>(dim);
  }
  const uint64_t bytes = elements * SizeOf(entry.dtype);
  if (entry.end < entry.begin || entry.end - entry.begin != bytes) {
    return bad(absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] hold ",
                            entry.end - entry.begin, " bytes, its shape and dtype need ", bytes));
  }
  return entry;
}

}  // namespace

absl::Status WriteSafetensors(const fs::path& out, const SafetensorsMetadata& metadata,
                              const std::vector<NamedTensor>& tensors) {
  std::vector<std::string> metadata_entries;
  for (const auto& [key, value] : metadata) {
    metadata_entries.push_back(absl::StrCat(Quoted(key), ":", Quoted(value)));
  }
  std::vector<std::string> entries;
  if (!metadata.empty()) {
    entries.push_back(
        absl::StrCat("\"__metadata__\":{", absl::StrJoin(metadata_entries, ","), "}"));
  }
  int64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    NF_ASSIGN_OR_RETURN(const std::string type, DTypeCode(t.data.dtype()));
    if (NumElements(t.shape) != t.data.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": shape [",
                                                     absl::StrJoin(t.shape, ","), "] but ",
                                                     t.data.numel(), " elements"));
    }
    const int64_t bytes = static_cast<int64_t>(t.data.nbytes());
    entries.push_back(absl::StrCat(Quoted(t.name), ":{\"dtype\":\"", type, "\",\"shape\":[",
                                   absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
                                   offset + bytes, "]}"));
    offset += bytes;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t header_size = header.size();
  char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((header_size >> (8 * i)) & 0xFF);

  const fs::path temporary = out.string() + ".tmp";
  const absl::Status written = [&]() -> absl::Status {
    NF_ASSIGN_OR_RETURN(DurableWriter writer, DurableWriter::Create(temporary));
    NF_RETURN_IF_ERROR(writer.Append(prefix, 8));
    NF_RETURN_IF_ERROR(writer.Append(header.data(), static_cast<int64_t>(header.size())));
    for (const NamedTensor& t : tensors) {
      NF_RETURN_IF_ERROR(writer.Append(t.data.raw_data(), static_cast<int64_t>(t.data.nbytes())));
    }
    NF_RETURN_IF_ERROR(writer.Close());
    std::error_code error;
    fs::rename(temporary, out, error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("cannot rename ", temporary.string(), " to ",
                                                 out.string(), ": ", error.message()));
    }
    return absl::OkStatus();
  }();
  if (!written.ok()) {
    std::error_code ignored;  // a full disk must not be made fuller by what failed to fit
    fs::remove(temporary, ignored);
  }
  return written;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const fs::path& file) {
  const auto in_file = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(file.string(), ": ", status.message()));
  };
  std::error_code error;
  const uintmax_t file_size = fs::file_size(file, error);
  if (error) {
    return absl::NotFoundError(absl::StrCat("cannot read ", file.string(), ": ", error.message()));
  }
  if (file_size < 8) return in_file(absl::DataLossError("shorter than a safetensors header"));
  unsigned char prefix[8];
  NF_RETURN_IF_ERROR(ReadRange(file, 0, 8, prefix));
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | prefix[i];
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    return in_file(absl::DataLossError(
        absl::StrCat("the header length ", header_size, " does not fit the file's ", file_size,
                     " bytes: not a safetensors file, or a damaged one")));
  }
  std::string header(header_size, '\0');
  NF_RETURN_IF_ERROR(ReadRange(file, 8, static_cast<int64_t>(header_size), header.data()));
  const absl::StatusOr<JsonValue> parsed = HeaderParser(header).ParseDocument();
  if (!parsed.ok()) return in_file(parsed.status());
  if (parsed->kind != JsonValue::kObject) {
    return in_file(absl::DataLossError("the header is not a JSON object"));
  }
  SafetensorsContents contents;
  std::vector<HeaderEntry> entries;
  for (const auto& [key, value] : parsed->members) {
    if (key == "__metadata__") {
      if (value.kind != JsonValue::kObject) {
        return in_file(absl::DataLossError("__metadata__ is not an object"));
      }
      for (const auto& [meta_key, meta_value] : value.members) {
        if (meta_value.kind != JsonValue::kString) {
          return in_file(absl::DataLossError(
              absl::StrCat("__metadata__ ", Quoted(meta_key), " is not a string")));
        }
        contents.metadata.emplace_back(meta_key, meta_value.text);
      }
      continue;
    }
    absl::StatusOr<HeaderEntry> entry = ParseEntry(key, value);
    if (!entry.ok()) return in_file(entry.status());
    entries.push_back(*std::move(entry));
  }
  // The data section is covered exactly: every byte belongs to one tensor.
  const uint64_t data_begin = 8 + header_size, data_size = file_size - data_begin;
  std::vector<const HeaderEntry*> by_offset;
  for (const HeaderEntry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  for (const HeaderEntry* e : by_offset) {
    if (e->begin != covered) {
      return in_file(absl::DataLossError(absl::StrCat(
          "tensor ", Quoted(e->name), " starts at data byte ", e->begin, ", where ", covered,
          " was expected (the tensors must cover the data section without gaps or overlaps)")));
    }
    covered = e->end;
  }
  if (covered != data_size) {
    return in_file(absl::DataLossError(
        absl::StrCat("the tensors cover ", covered, " bytes of a data section of ", data_size)));
  }
  for (const HeaderEntry& e : entries) {
    NF_ASSIGN_OR_RETURN(Tensor data, Tensor::HostEmpty(e.dtype, {NumElements(e.shape)}));
    NF_RETURN_IF_ERROR(ReadRange(file, static_cast<int64_t>(data_begin + e.begin),
                                 static_cast<int64_t>(e.end - e.begin), data.raw_data()));
    contents.tensors.push_back({.name = e.name, .shape = e.shape, .data = std::move(data)});
  }
  return contents;
}

}  // namespace nf::checkpoint
