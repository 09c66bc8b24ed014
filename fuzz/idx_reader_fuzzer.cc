// libFuzzer target for IndexedDataset::Open: whatever the bytes of PREFIX.idx and PREFIX.bin,
// Open either fails with a status or returns a dataset that keeps its promises: every sequence
// reads in full (ASan and UBSan watch), and the sequences read back as exactly the .bin.
//
// Input layout: a little-endian u16 n (taken modulo the bytes that follow, plus one), then the
// .idx, then the last n bytes as the .bin. Splitting the input lets the fuzzer vary both files,
// which it must to get past the .bin size checks. fuzz/make_idx_seeds.py writes valid seeds.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace {

void WriteOrDie(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

// One scratch directory for the whole run; its destructor removes it when the fuzzer exits.
struct ScratchDir {
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    path =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/nf_idx_reader_fuzzer_XXXXXX";
    if (::mkdtemp(path.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::string path;
};

const std::string& Prefix() {
  static const ScratchDir dir;
  static const std::string prefix = dir.path + "/data";
  return prefix;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t bin_size = 0;
  if (size >= 2) {
    const size_t rest = size - 2;
    bin_size = (size_t{data[0]} | size_t{data[1]} << 8) % (rest + 1);
    data += 2;
    size = rest;
  }
  const std::string& prefix = Prefix();
  WriteOrDie(prefix + ".idx", data, size - bin_size);
  WriteOrDie(prefix + ".bin", data + (size - bin_size), bin_size);

  auto dataset = nf::data::IndexedDataset::Open(prefix);
  if (!dataset.ok()) return 0;
  const nf::data::IndexedDataset& d = **dataset;
  // Everything Open promises. The .bin is mapped whole pages at a time, where ASan cannot see a
  // read past its end, so the tokens are checked against the .bin instead: the sequences lie
  // back to back and cover it exactly, so together they must read back as the whole .bin.
  const std::vector<int64_t>& documents = d.document_index();
  if (documents.empty() || documents.front() != 0 || documents.back() != d.num_sequences() ||
      d.num_documents() != static_cast<int64_t>(documents.size()) - 1) {
    std::abort();
  }
  const uint8_t* bin = data + (size - bin_size);
  const size_t element = d.dtype() == nf::data::TokenDType::kU16 ? 2 : 4;
  if (bin_size % element != 0 || d.total_tokens() != static_cast<int64_t>(bin_size / element)) {
    std::abort();
  }
  std::vector<int32_t> tokens;
  size_t position = 0;  // in tokens of the .bin
  for (int64_t i = 0; i < d.num_sequences(); ++i) {
    const int64_t length = d.sequence_length(i);
    if (length < 0 || static_cast<size_t>(length) > bin_size / element - position) std::abort();
    tokens.assign(static_cast<size_t>(length), 0);
    d.ReadTokens(i, 0, length, tokens.data());
    for (const int32_t token : tokens) {
      const uint8_t* b = bin + position++ * element;
      const uint32_t expected = element == 2 ? uint32_t{b[0]} | uint32_t{b[1]} << 8
                                             : uint32_t{b[0]} | uint32_t{b[1]} << 8 |
                                                   uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
      if (static_cast<uint32_t>(token) != expected) std::abort();
    }
  }
  if (position != bin_size / element) std::abort();
  return 0;
}
