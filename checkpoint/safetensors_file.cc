#include "checkpoint/safetensors_file.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/files/atomic_file.h"
#include "core/json_cursor.h"
#include "core/json_value.h"
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

std::string Quoted(absl::string_view s) { return JsonQuoted(s); }

// The subset of JSON a safetensors header uses: objects, arrays, strings and non-negative
// integers. Objects keep their keys in order.
struct HeaderValue {
  enum Kind { kObject, kArray, kString, kInteger } kind = kObject;
  std::vector<std::pair<std::string, HeaderValue>> members;
  std::vector<HeaderValue> elements;
  std::string text;
  uint64_t integer = 0;
};

// Nesting deeper than a header's (object > tensor entry > shape array) is refused.
constexpr int kMaxHeaderDepth = 3;

// The header value at `cursor`, `depth` containers down: JSON's syntax, a header's shapes.
absl::StatusOr<HeaderValue> ReadHeaderValue(JsonCursor& cursor, int depth) {
  cursor.SkipSpace();
  if (cursor.AtEnd()) return cursor.Error("the header ends inside a value");
  const char c = cursor.Peek();
  HeaderValue value;
  if ((c == '{' || c == '[') && depth >= kMaxHeaderDepth) {
    return cursor.Error("nested deeper than a safetensors header");
  }
  if (c == '{') {
    value.kind = HeaderValue::kObject;
    NF_RETURN_IF_ERROR(cursor.ReadObject([&](std::string key, size_t key_offset) -> absl::Status {
      for (const auto& member : value.members) {
        if (member.first == key) {
          return cursor.ErrorAt(key_offset, absl::StrCat("duplicate key ", Quoted(key)));
        }
      }
      NF_ASSIGN_OR_RETURN(HeaderValue member, ReadHeaderValue(cursor, depth + 1));
      value.members.emplace_back(std::move(key), std::move(member));
      return absl::OkStatus();
    }));
  } else if (c == '[') {
    value.kind = HeaderValue::kArray;
    NF_RETURN_IF_ERROR(cursor.ReadArray([&]() -> absl::Status {
      NF_ASSIGN_OR_RETURN(HeaderValue element, ReadHeaderValue(cursor, depth + 1));
      value.elements.push_back(std::move(element));
      return absl::OkStatus();
    }));
  } else if (c == '"') {
    value.kind = HeaderValue::kString;
    NF_RETURN_IF_ERROR(cursor.ReadString(&value.text));
  } else if (c >= '0' && c <= '9') {
    value.kind = HeaderValue::kInteger;
    const size_t start = cursor.offset();
    NF_ASSIGN_OR_RETURN(const absl::string_view literal, cursor.ReadNumber());
    if (const size_t fraction = literal.find_first_of(".eE"); fraction != literal.npos) {
      return cursor.ErrorAt(start + fraction, "a fraction where an integer belongs");
    }
    // A size or offset past 2^53 is damage: readers that hold JSON numbers as doubles could not
    // even read it exactly.
    if (!absl::SimpleAtoi(literal, &value.integer) || value.integer > (uint64_t{1} << 53)) {
      return cursor.ErrorAt(start, "an integer too large for a size");
    }
  } else {
    return cursor.Error("expected an object, array, string or non-negative integer");
  }
  return value;
}

// The header `json`: one value, nothing after it. DataLoss "header byte B: what" when it is
// not JSON or not a header's JSON.
absl::StatusOr<HeaderValue> ParseHeader(absl::string_view json) {
  JsonCursor cursor(json, JsonPlaces::kByte, "header");
  absl::StatusOr<HeaderValue> value = ReadHeaderValue(cursor, 0);
  if (value.ok()) {
    cursor.SkipSpace();
    if (!cursor.AtEnd()) value = cursor.Error("text after the header's object");
  }
  if (!value.ok()) return absl::DataLossError(value.status().message());
  return value;
}

struct HeaderEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // bytes into the data section
};

absl::StatusOr<HeaderEntry> ParseEntry(const std::string& name, const HeaderValue& value) {
  const auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("tensor ", Quoted(name), ": ", what));
  };
  if (value.kind != HeaderValue::kObject) return bad("its entry is not an object");
  HeaderEntry entry;
  entry.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, field] : value.members) {
    if (key == "dtype") {
      if (field.kind != HeaderValue::kString) return bad("dtype is not a string");
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
      if (field.kind != HeaderValue::kArray) return bad("shape is not an array");
      for (const HeaderValue& dim : field.elements) {
        if (dim.kind != HeaderValue::kInteger || dim.integer > (uint64_t{1} << 40)) {
          return bad("shape holds something other than a dimension");
        }
        entry.shape.push_back(static_cast<int64_t>(dim.integer));
      }
      has_shape = true;
    } else if (key == "data_offsets") {
      if (field.kind != HeaderValue::kArray || field.elements.size() != 2 ||
          field.elements[0].kind != HeaderValue::kInteger ||
          field.elements[1].kind != HeaderValue::kInteger) {
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

std::string HeaderJson(const SafetensorsMetadata& metadata,
                       const std::vector<SafetensorsEntry>& entries) {
  std::vector<std::string> metadata_entries;
  for (const auto& [key, value] : metadata) {
    metadata_entries.push_back(absl::StrCat(Quoted(key), ":", Quoted(value)));
  }
  std::vector<std::string> members;
  if (!metadata.empty()) {
    members.push_back(
        absl::StrCat("\"__metadata__\":{", absl::StrJoin(metadata_entries, ","), "}"));
  }
  int64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const int64_t bytes = NumElements(e.shape) * static_cast<int64_t>(SizeOf(e.dtype));
    members.push_back(absl::StrCat(Quoted(e.name), ":{\"dtype\":\"", *DTypeCode(e.dtype),
                                   "\",\"shape\":[", absl::StrJoin(e.shape, ","),
                                   "],\"data_offsets\":[", offset, ",", offset + bytes, "]}"));
    offset += bytes;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(members, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  return header;
}

}  // namespace

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(const fs::path& out,
                                                            const SafetensorsMetadata& metadata,
                                                            std::vector<SafetensorsEntry> entries) {
  for (const SafetensorsEntry& e : entries) {
    NF_RETURN_IF_ERROR(DTypeCode(e.dtype).status());
  }
  const std::string header = HeaderJson(metadata, entries);
  const uint64_t header_size = header.size();
  char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((header_size >> (8 * i)) & 0xFF);
  NF_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(out));
  SafetensorsWriter writer(out, std::move(entries),
                           std::make_unique<AtomicFileWriter>(std::move(file)));
  NF_RETURN_IF_ERROR(writer.file_->Append(prefix, 8));
  NF_RETURN_IF_ERROR(writer.file_->Append(header.data(), static_cast<int64_t>(header.size())));
  return writer;
}

SafetensorsWriter::SafetensorsWriter(fs::path out, std::vector<SafetensorsEntry> entries,
                                     std::unique_ptr<AtomicFileWriter> file)
    : out_(std::move(out)), entries_(std::move(entries)), file_(std::move(file)) {}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : out_(std::move(other.out_)),
      entries_(std::move(other.entries_)),
      file_(std::move(other.file_)),
      appended_(other.appended_) {}

SafetensorsWriter::~SafetensorsWriter() = default;  // an uncommitted file_ removes its temporary

absl::Status SafetensorsWriter::Append(const Tensor& data) {
  if (file_ == nullptr || appended_ == entries_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(out_.string(), ": a tensor beyond the ",
                                                      entries_.size(), " its header lists"));
  }
  const SafetensorsEntry& e = entries_[appended_];
  if (data.dtype() != e.dtype || data.numel() != NumElements(e.shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat(out_.string(), ": tensor ", e.name, " is ", DTypeName(e.dtype), "[",
                     absl::StrJoin(e.shape, ","), "] in the header but ", DTypeName(data.dtype()),
                     " with ", data.numel(), " elements was appended"));
  }
  NF_RETURN_IF_ERROR(file_->Append(data.raw_data(), static_cast<int64_t>(data.nbytes())));
  ++appended_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Commit() {
  if (file_ == nullptr || appended_ != entries_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(out_.string(), ": ", appended_, " of the ",
                                                      entries_.size(), " tensors were written"));
  }
  // An export writes a new file: one that appeared at `out` since the tool checked is kept.
  NF_RETURN_IF_ERROR(file_->Commit(OnCommit::kNoReplace));
  file_.reset();
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const fs::path& out, const SafetensorsMetadata& metadata,
                              const std::vector<NamedTensor>& tensors) {
  std::vector<SafetensorsEntry> entries;
  for (const NamedTensor& t : tensors) {
    if (NumElements(t.shape) != t.data.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": shape [",
                                                     absl::StrJoin(t.shape, ","), "] but ",
                                                     t.data.numel(), " elements"));
    }
    entries.push_back({.name = t.name, .dtype = t.data.dtype(), .shape = t.shape});
  }
  NF_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                      SafetensorsWriter::Create(out, metadata, std::move(entries)));
  for (const NamedTensor& t : tensors) NF_RETURN_IF_ERROR(writer.Append(t.data));
  return writer.Commit();
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const fs::path& file) {
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
  const absl::StatusOr<HeaderValue> parsed = ParseHeader(header);
  if (!parsed.ok()) return in_file(parsed.status());
  if (parsed->kind != HeaderValue::kObject) {
    return in_file(absl::DataLossError("the header is not a JSON object"));
  }
  SafetensorsReader reader;
  reader.file_ = file;
  std::vector<HeaderEntry> entries;
  for (const auto& [key, value] : parsed->members) {
    if (key == "__metadata__") {
      if (value.kind != HeaderValue::kObject) {
        return in_file(absl::DataLossError("__metadata__ is not an object"));
      }
      for (const auto& [meta_key, meta_value] : value.members) {
        if (meta_value.kind != HeaderValue::kString) {
          return in_file(absl::DataLossError(
              absl::StrCat("__metadata__ ", Quoted(meta_key), " is not a string")));
        }
        reader.metadata_.emplace_back(meta_key, meta_value.text);
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
    reader.index_[e.name] = reader.entries_.size();
    reader.entries_.push_back({.name = e.name, .dtype = e.dtype, .shape = e.shape});
    reader.offsets_.push_back(static_cast<int64_t>(data_begin + e.begin));
  }
  return reader;
}

const SafetensorsEntry* SafetensorsReader::Find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

absl::StatusOr<Tensor> SafetensorsReader::Read(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(file_.string(), " has no tensor ", Quoted(name)));
  }
  const SafetensorsEntry& e = entries_[it->second];
  NF_ASSIGN_OR_RETURN(Tensor data, Tensor::HostEmpty(e.dtype, {NumElements(e.shape)}));
  NF_RETURN_IF_ERROR(
      ReadRange(file_, offsets_[it->second], static_cast<int64_t>(data.nbytes()), data.raw_data()));
  return data;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const fs::path& file) {
  NF_ASSIGN_OR_RETURN(const SafetensorsReader reader, SafetensorsReader::Open(file));
  SafetensorsContents contents{.metadata = reader.metadata(), .tensors = {}};
  for (const SafetensorsEntry& e : reader.entries()) {
    NF_ASSIGN_OR_RETURN(Tensor data, reader.Read(e.name));
    contents.tensors.push_back({.name = e.name, .shape = e.shape, .data = std::move(data)});
  }
  return contents;
}

}  // namespace nf::checkpoint
