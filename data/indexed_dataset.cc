// The MMIDIDX writer (temporaries, fsync, renames) and the reader (mmap, full validation at
// Open). See indexed_dataset.h for the byte layout.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/files/atomic_file.h"
#include "core/status.h"
#include "data/mapped_file.h"

namespace nf::data {
namespace {

// Both files are read in place and written from memory as they are: the format is
// little-endian, and so must the host be.
static_assert(std::endian::native == std::endian::little);

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
// Offsets of the header fields and the size of the header.
constexpr size_t kVersionOffset = 9;
constexpr size_t kDTypeOffset = 17;
constexpr size_t kSequenceCountOffset = 18;
constexpr size_t kDocumentCountOffset = 26;
constexpr size_t kHeaderSize = 34;
// Bytes per sequence in the index (an i32 length and an i64 pointer) and per document entry.
constexpr uint64_t kSequenceEntryBytes = 4 + 8;
constexpr uint64_t kDocumentEntryBytes = 8;

// The .bin is written in chunks of this size: large enough that writes cost nothing next to
// tokenization, small enough not to matter for memory.
constexpr size_t kWriteChunk = size_t{1} << 20;

int64_t ElementSize(TokenDType dtype) { return dtype == TokenDType::kU16 ? 2 : 4; }

// The names of the format's dtype codes 1..8, as numpy spells them (for messages).
absl::string_view CodeName(uint8_t code) {
  constexpr absl::string_view kNames[] = {"uint8", "int8",    "int16",   "int32",
                                          "int64", "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? kNames[code - 1] : "unknown";
}

// The .idx arrays start at byte 34, so their elements are not aligned: read them by value.
template <typename T>
T Load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void Append(std::vector<uint8_t>* out, T value) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &value, sizeof(T));
}

absl::Status IoError(absl::string_view what, const std::string& path, int error) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::FailedPreconditionError(message);
}

// `status` of the one file writer (core/files/), said to be the dataset writer's.
absl::Status InWriter(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("indexed dataset writer: ", status.message()));
}

absl::Status Corrupt(const std::string& path, absl::string_view problem) {
  return absl::DataLossError(absl::StrCat("indexed dataset ", path, ": ", problem));
}

}  // namespace

// ---- Writer -------------------------------------------------------------------------------

struct IndexedDatasetWriter::State {
  absl::Status Flush() {
    absl::Status status = bin->Append(pending.data(), static_cast<int64_t>(pending.size()));
    pending.clear();
    return status;
  }

  std::string prefix;
  TokenDType dtype = TokenDType::kU16;
  // PREFIX.bin under a temporary name of its own (core/files/atomic_file.h), removed unless
  // Finish commits it.
  std::optional<AtomicFileWriter> bin;
  std::vector<uint8_t> pending;  // .bin bytes not yet written
  std::vector<int32_t> lengths;  // one per sequence (= non-empty document)
  // The sequence count at each empty document, in order (non-decreasing): its document index
  // entry. Kept apart so that the usual dataset, without empty documents, costs nothing more.
  std::vector<uint64_t> empty_documents;
  // Sticky: after a failed write the .bin temporary holds an unknown prefix of the data, so
  // nothing more may be added and Finish() must fail.
  absl::Status error;
  bool finished = false;  // Finish() succeeded: the temporaries are the final files now
};

absl::StatusOr<IndexedDatasetWriter> IndexedDatasetWriter::Create(const std::string& prefix,
                                                                  TokenDType dtype) {
  if (dtype != TokenDType::kU16 && dtype != TokenDType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indexed dataset writer ", prefix, ": unsupported dtype code ", static_cast<int>(dtype)));
  }
  auto state = std::make_unique<State>();
  state->prefix = prefix;
  state->dtype = dtype;
  // A temporary of its own: several writers of one prefix (tests, parallel preprocessing) never
  // share one, and a link planted at any name is never written through.
  absl::StatusOr<AtomicFileWriter> bin = AtomicFileWriter::Create(absl::StrCat(prefix, ".bin"));
  if (!bin.ok()) return InWriter(bin.status());
  state->bin.emplace(*std::move(bin));
  state->pending.reserve(kWriteChunk);
  return IndexedDatasetWriter(std::move(state));
}

IndexedDatasetWriter::IndexedDatasetWriter(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
IndexedDatasetWriter::IndexedDatasetWriter(IndexedDatasetWriter&&) noexcept = default;
IndexedDatasetWriter& IndexedDatasetWriter::operator=(IndexedDatasetWriter&&) noexcept = default;
IndexedDatasetWriter::~IndexedDatasetWriter() = default;

absl::Status IndexedDatasetWriter::AddDocument(std::span<const int32_t> tokens) {
  if (state_ == nullptr) return absl::FailedPreconditionError("indexed dataset writer: moved from");
  State& s = *state_;
  if (s.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("indexed dataset writer ", s.prefix, ": AddDocument after Finish"));
  }
  NF_RETURN_IF_ERROR(s.error);
  const auto document = static_cast<int64_t>(s.lengths.size());
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexed dataset writer ", s.prefix, ": document ", document, " has ",
                     tokens.size(), " tokens, more than the format's i32 sequence length allows"));
  }
  // Checked before anything is written, so a rejected document leaves the dataset as it was.
  if (s.dtype == TokenDType::kU16) {
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (tokens[t] < 0 || tokens[t] > std::numeric_limits<uint16_t>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "indexed dataset writer ", s.prefix, ": document ", document, " token ", t, " is ",
            tokens[t], ", outside the uint16 range [0, 65535] of the dataset's dtype"));
      }
    }
  }
  // Every int32 fits the i32 dtype; ids outside the vocabulary are the tokenizer's business.
  const size_t element = static_cast<size_t>(ElementSize(s.dtype));
  size_t t = 0;
  while (t < tokens.size()) {
    const size_t n = std::min(tokens.size() - t, (kWriteChunk - s.pending.size()) / element);
    const size_t at = s.pending.size();
    s.pending.resize(at + n * element);
    if (s.dtype == TokenDType::kI32) {
      std::memcpy(s.pending.data() + at, tokens.data() + t, n * element);
    } else {
      for (size_t j = 0; j < n; ++j) {
        const auto v = static_cast<uint16_t>(tokens[t + j]);
        std::memcpy(s.pending.data() + at + j * element, &v, element);
      }
    }
    t += n;
    if (s.pending.size() + element > kWriteChunk) {
      s.error = s.Flush();
      NF_RETURN_IF_ERROR(s.error);
    }
  }
  s.lengths.push_back(static_cast<int32_t>(tokens.size()));
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::AddEmptyDocument() {
  if (state_ == nullptr) return absl::FailedPreconditionError("indexed dataset writer: moved from");
  State& s = *state_;
  if (s.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("indexed dataset writer ", s.prefix, ": AddEmptyDocument after Finish"));
  }
  NF_RETURN_IF_ERROR(s.error);
  s.empty_documents.push_back(s.lengths.size());
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::Finish() {
  if (state_ == nullptr) return absl::FailedPreconditionError("indexed dataset writer: moved from");
  State& s = *state_;
  if (s.finished) {
    return absl::FailedPreconditionError(
        absl::StrCat("indexed dataset writer ", s.prefix, ": Finish called twice"));
  }
  NF_RETURN_IF_ERROR(s.error);
  // Any failure from here on leaves the temporaries in an unknown state: make it sticky.
  auto fail = [&s](absl::Status status) {
    s.error = status;
    return status;
  };

  if (absl::Status status = s.Flush(); !status.ok()) return fail(status);
  const std::string bin_path = absl::StrCat(s.prefix, ".bin");
  const std::string idx_path = absl::StrCat(s.prefix, ".idx");
  absl::StatusOr<AtomicFileWriter> idx = AtomicFileWriter::Create(idx_path);
  if (!idx.ok()) return fail(InWriter(idx.status()));
  const uint64_t num_sequences = s.lengths.size();
  std::vector<uint8_t> out;
  out.reserve(kWriteChunk);
  out.insert(out.end(), kMagic, kMagic + sizeof(kMagic));
  Append<uint64_t>(&out, kVersion);
  Append<uint8_t>(&out, static_cast<uint8_t>(s.dtype));
  Append<uint64_t>(&out, num_sequences);
  // One document per sequence, and the empty documents: 0, then each document's end in order.
  Append<uint64_t>(&out, num_sequences + 1 + s.empty_documents.size());
  absl::Status status;
  auto flush_if_full = [&] {
    if (status.ok() && out.size() + sizeof(int64_t) > kWriteChunk) {
      status = idx->Append(out.data(), static_cast<int64_t>(out.size()));
      out.clear();
    }
  };
  for (int32_t length : s.lengths) {
    Append<int32_t>(&out, length);
    flush_if_full();
  }
  int64_t pointer = 0;
  for (int32_t length : s.lengths) {
    Append<int64_t>(&out, pointer);
    pointer += length * ElementSize(s.dtype);
    flush_if_full();
  }
  // Entry d (d >= 1) of the sequences is d; an empty document added after sequence c is an
  // entry c after it. Both non-decreasing: merged, they are the document index in input order.
  auto empty = s.empty_documents.begin();
  for (uint64_t d = 0; d <= num_sequences; ++d) {
    Append<int64_t>(&out, static_cast<int64_t>(d));
    flush_if_full();
    for (; empty != s.empty_documents.end() && *empty == d; ++empty) {
      Append<int64_t>(&out, static_cast<int64_t>(d));
      flush_if_full();
    }
  }
  if (status.ok()) status = idx->Append(out.data(), static_cast<int64_t>(out.size()));
  if (!status.ok()) return fail(status);

  // The old .idx goes first and the new .bin is in place (durably: each commit fsyncs its file,
  // renames it and syncs the directory) before the new .idx appears, so a crash at any point
  // leaves either no .idx or an .idx with its own .bin.
  if (::unlink(idx_path.c_str()) != 0 && errno != ENOENT) {
    return fail(IoError("indexed dataset writer: cannot remove the old", idx_path, errno));
  }
  if (absl::Status st = SyncDirectory(DirectoryOf(s.prefix)); !st.ok()) return fail(st);
  if (absl::Status st = s.bin->Commit(OnCommit::kReplace); !st.ok()) return fail(InWriter(st));
  if (absl::Status st = idx->Commit(OnCommit::kReplace); !st.ok()) return fail(InWriter(st));
  s.finished = true;
  return absl::OkStatus();
}

// ---- Reader -------------------------------------------------------------------------------

struct IndexedDataset::Mapping {
  std::string prefix;
  TokenDType dtype = TokenDType::kU16;
  int64_t num_sequences = 0;
  int64_t total_tokens = 0;
  std::vector<int64_t> document_index;
  MappedFile idx;
  MappedFile bin;
  const uint8_t* lengths = nullptr;   // i32[S] inside idx
  const uint8_t* pointers = nullptr;  // i64[S] inside idx
};

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(const std::string& prefix) {
  auto m = std::make_unique<Mapping>();
  m->prefix = prefix;
  const std::string idx_path = absl::StrCat(prefix, ".idx");
  const std::string bin_path = absl::StrCat(prefix, ".bin");
  NF_RETURN_IF_ERROR(m->idx.Map(idx_path));
  NF_RETURN_IF_ERROR(m->bin.Map(bin_path));
  const uint8_t* idx = m->idx.data();
  const auto idx_size = static_cast<uint64_t>(m->idx.size());

  // Header.
  if (idx_size < kHeaderSize) {
    return Corrupt(idx_path, absl::StrCat("the file is ", idx_size, " bytes, shorter than the ",
                                          kHeaderSize, "-byte header"));
  }
  if (std::memcmp(idx, kMagic, sizeof(kMagic)) != 0) {
    const absl::string_view found(reinterpret_cast<const char*>(idx), sizeof(kMagic));
    const absl::string_view expected(kMagic, sizeof(kMagic));
    return Corrupt(idx_path, absl::StrCat("wrong magic \"", absl::CHexEscape(found),
                                          "\", expected \"", absl::CHexEscape(expected),
                                          "\" (not a Megatron/fairseq mmap index)"));
  }
  if (const auto version = Load<uint64_t>(idx + kVersionOffset); version != kVersion) {
    return Corrupt(idx_path, absl::StrCat("version ", version, ", expected ", kVersion));
  }
  const uint8_t code = idx[kDTypeOffset];
  if (code < 1 || code > 8) {
    return Corrupt(idx_path,
                   absl::StrCat("unknown dtype code ", code, " (the format defines codes 1 to 8)"));
  }
  if (code != static_cast<uint8_t>(TokenDType::kU16) &&
      code != static_cast<uint8_t>(TokenDType::kI32)) {
    return Corrupt(idx_path, absl::StrCat("dtype code ", code, " (", CodeName(code),
                                          ") is not supported: token datasets are uint16 (code 8) "
                                          "or int32 (code 4)"));
  }
  m->dtype = static_cast<TokenDType>(code);
  const int64_t element = ElementSize(m->dtype);

  // Counts: checked by division first, so that counts near 2^64 cannot overflow the size.
  const auto num_sequences = Load<uint64_t>(idx + kSequenceCountOffset);
  const auto num_entries = Load<uint64_t>(idx + kDocumentCountOffset);
  constexpr uint64_t kMaxSize = std::numeric_limits<uint64_t>::max();
  if (num_sequences > (kMaxSize - kHeaderSize) / kSequenceEntryBytes ||
      num_entries >
          (kMaxSize - kHeaderSize - num_sequences * kSequenceEntryBytes) / kDocumentEntryBytes) {
    return Corrupt(idx_path, absl::StrCat("sequence count ", num_sequences, " and document count ",
                                          num_entries, " need more than the ", idx_size,
                                          "-byte file holds (over 2^64 bytes)"));
  }
  const uint64_t expected_size =
      kHeaderSize + num_sequences * kSequenceEntryBytes + num_entries * kDocumentEntryBytes;
  if (idx_size != expected_size) {
    // Megatron's multimodal indices append an i8 mode per sequence.
    const bool modes = idx_size == expected_size + num_sequences && num_sequences > 0;
    return Corrupt(
        idx_path,
        absl::StrCat("the file is ", idx_size, " bytes, expected exactly ", expected_size, " for ",
                     num_sequences, " sequences and ", num_entries, " document index entries",
                     modes ? " (multimodal sequence modes are not supported)" : ""));
  }
  if (num_entries == 0) {
    return Corrupt(idx_path, "the document index is empty (it must start with 0)");
  }
  m->num_sequences = static_cast<int64_t>(num_sequences);
  m->lengths = idx + kHeaderSize;
  m->pointers = m->lengths + num_sequences * 4;
  const uint8_t* documents = m->pointers + num_sequences * 8;

  // Sequences: each within the .bin and directly after the previous one. The running offset
  // never exceeds the .bin size, so nothing here can overflow.
  const int64_t bin_size = m->bin.size();
  int64_t offset = 0;
  for (int64_t i = 0; i < m->num_sequences; ++i) {
    const auto length = Load<int32_t>(m->lengths + i * 4);
    if (length < 0) {
      return Corrupt(idx_path, absl::StrCat("sequence ", i, " has negative length ", length));
    }
    const auto pointer = Load<int64_t>(m->pointers + i * 8);
    const int64_t bytes = length * element;
    if (pointer < 0 || pointer > bin_size || bytes > bin_size - pointer) {
      return Corrupt(idx_path, absl::StrCat("sequence ", i, " (byte offset ", pointer, ", ", length,
                                            " tokens) runs past the end of the ", bin_size,
                                            "-byte ", bin_path));
    }
    if (pointer != offset) {
      return Corrupt(
          idx_path, absl::StrCat("sequence ", i, " starts at byte ", pointer, ", expected ", offset,
                                 " (sequences are stored back to back)"));
    }
    offset += bytes;
  }
  if (offset != bin_size) {
    return Corrupt(bin_path, absl::StrCat("the file is ", bin_size, " bytes but ", idx_path,
                                          " describes ", offset));
  }
  m->total_tokens = offset / element;

  // Document index: 0, non-decreasing, ending at the sequence count.
  m->document_index.resize(num_entries);
  for (uint64_t d = 0; d < num_entries; ++d) {
    const auto entry = Load<int64_t>(documents + d * 8);
    if (d == 0 && entry != 0) {
      return Corrupt(idx_path, absl::StrCat("document index starts at ", entry, ", expected 0"));
    }
    if (d > 0 && entry < m->document_index[d - 1]) {
      return Corrupt(idx_path, absl::StrCat("document index decreases at entry ", d, " (",
                                            m->document_index[d - 1], " then ", entry, ")"));
    }
    m->document_index[d] = entry;
  }
  if (m->document_index.back() != m->num_sequences) {
    return Corrupt(idx_path, absl::StrCat("document index ends at ", m->document_index.back(),
                                          ", expected the sequence count ", m->num_sequences));
  }
  return std::unique_ptr<IndexedDataset>(new IndexedDataset(std::move(m)));
}

IndexedDataset::IndexedDataset(std::unique_ptr<Mapping> mapping) : mapping_(std::move(mapping)) {}
IndexedDataset::~IndexedDataset() = default;

const std::string& IndexedDataset::prefix() const { return mapping_->prefix; }
TokenDType IndexedDataset::dtype() const { return mapping_->dtype; }
int64_t IndexedDataset::num_sequences() const { return mapping_->num_sequences; }
int64_t IndexedDataset::num_documents() const {
  return static_cast<int64_t>(mapping_->document_index.size()) - 1;
}
int64_t IndexedDataset::sequence_length(int64_t i) const {
  return Load<int32_t>(mapping_->lengths + i * 4);
}
const std::vector<int64_t>& IndexedDataset::document_index() const {
  return mapping_->document_index;
}
int64_t IndexedDataset::total_tokens() const { return mapping_->total_tokens; }

void IndexedDataset::ReadTokens(int64_t i, int64_t offset, int64_t count, int32_t* out) const {
  if (count <= 0) return;  // also keeps an empty .bin's null mapping out of memcpy
  const Mapping& m = *mapping_;
  const int64_t element = ElementSize(m.dtype);
  const uint8_t* src = m.bin.data() + Load<int64_t>(m.pointers + i * 8) + offset * element;
  if (m.dtype == TokenDType::kI32) {
    std::memcpy(out, src, static_cast<size_t>(count) * sizeof(int32_t));
    return;
  }
  for (int64_t j = 0; j < count; ++j) out[j] = Load<uint16_t>(src + j * 2);
}

}  // namespace nf::data
