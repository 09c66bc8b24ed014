#include "data/gpt_samples_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/files/atomic_file.h"
#include "core/status.h"

namespace nf::data {
namespace {

constexpr std::array<char, 8> kMagic = {'N', 'F', 'G', 'P', 'T', 'S', 'M', 'P'};
constexpr uint64_t kVersion = 1;

absl::Status IoError(absl::string_view what, absl::string_view path) {
  return absl::InternalError(absl::StrCat("data: cannot ", what, " sample-index cache ", path, ": ",
                                          std::strerror(errno)));
}

// Closes the descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting the error close() may carry for buffered writes.
  bool Close() {
    const int fd = std::exchange(fd_, -1);
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

bool ReadAll(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Header bytes before the arrays.
uint64_t HeaderBytes(absl::string_view description) {
  return kMagic.size() + 2 * sizeof(uint64_t) + description.size() + 4 * sizeof(int64_t);
}

}  // namespace

uint64_t Fnv1a64(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string SampleIndexCachePath(absl::string_view prefix, absl::string_view description) {
  return absl::StrCat(prefix, "_gpt_",
                      absl::Hex(Fnv1a64(description.data(), description.size()), absl::kZeroPad16),
                      ".samples");
}

absl::Status WriteSampleIndexCache(const std::string& path, absl::string_view description,
                                   const GptSampleIndices& indices) {
  // Under a name of its own beside the target (core/files/atomic_file.h), renamed into place:
  // concurrent writers (every rank of a job may build the same indices) never share a temporary,
  // and a reader sees the old cache or the whole new one.
  NF_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(path));
  const auto append = [&file](const void* data, size_t bytes) {
    return file.Append(data, static_cast<int64_t>(bytes));
  };
  const uint64_t description_bytes = description.size();
  const std::array<int64_t, 4> sizes = {indices.num_epochs, indices.separate_from,
                                        static_cast<int64_t>(indices.document_index.size()),
                                        indices.num_samples()};
  NF_RETURN_IF_ERROR(append(kMagic.data(), kMagic.size()));
  NF_RETURN_IF_ERROR(append(&kVersion, sizeof(kVersion)));
  NF_RETURN_IF_ERROR(append(&description_bytes, sizeof(description_bytes)));
  NF_RETURN_IF_ERROR(append(description.data(), description.size()));
  NF_RETURN_IF_ERROR(append(sizes.data(), sizeof(sizes)));
  for (const std::vector<int64_t>* array :
       {&indices.document_index, &indices.sample_index, &indices.shuffle_index}) {
    NF_RETURN_IF_ERROR(append(array->data(), array->size() * sizeof(int64_t)));
  }
  return file.Commit(OnCommit::kReplace);
}

absl::StatusOr<GptSampleIndices> ReadSampleIndexCache(const std::string& path,
                                                      absl::string_view description,
                                                      const GptSampleIndexShape& shape) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("data: no cache ", path));
    return IoError("open", path);
  }
  Fd file(fd);
  const auto mismatch = [&path](absl::string_view what) {
    return absl::FailedPreconditionError(
        absl::StrCat("data: sample-index cache ", path, " does not match: ", what));
  };
  struct stat info;
  if (::fstat(fd, &info) != 0) return IoError("stat", path);

  std::array<char, 8> magic;
  uint64_t version = 0, description_bytes = 0;
  if (!ReadAll(fd, magic.data(), magic.size()) || magic != kMagic) return mismatch("magic");
  if (!ReadAll(fd, &version, sizeof(version)) || version != kVersion) return mismatch("version");
  if (!ReadAll(fd, &description_bytes, sizeof(description_bytes)) ||
      description_bytes != description.size()) {
    return mismatch("description");
  }
  std::string stored(description_bytes, '\0');
  if (!ReadAll(fd, stored.data(), stored.size()) || stored != description) {
    return mismatch("description");
  }
  std::array<int64_t, 4> sizes;
  if (!ReadAll(fd, sizes.data(), sizeof(sizes))) return mismatch("truncated header");
  if (sizes != std::array<int64_t, 4>{shape.num_epochs, shape.separate_from,
                                      shape.document_index_size, shape.num_samples}) {
    return mismatch(absl::StrCat("shape (epochs, separate_from, documents, samples) (", sizes[0],
                                 ", ", sizes[1], ", ", sizes[2], ", ", sizes[3], ") != (",
                                 shape.num_epochs, ", ", shape.separate_from, ", ",
                                 shape.document_index_size, ", ", shape.num_samples, ")"));
  }
  // The shape is the expected one, so these sizes cannot overflow.
  const uint64_t expected_bytes =
      HeaderBytes(description) +
      sizeof(int64_t) * static_cast<uint64_t>(shape.document_index_size + 3 * shape.num_samples);
  if (static_cast<uint64_t>(info.st_size) != expected_bytes) {
    return mismatch(absl::StrCat("size ", info.st_size, " bytes, expected ", expected_bytes));
  }
  GptSampleIndices indices{
      .num_epochs = shape.num_epochs,
      .separate_from = shape.separate_from,
      .document_index = std::vector<int64_t>(shape.document_index_size),
      .sample_index = std::vector<int64_t>(2 * shape.num_samples),
      .shuffle_index = std::vector<int64_t>(shape.num_samples),
  };
  for (std::vector<int64_t>* array :
       {&indices.document_index, &indices.sample_index, &indices.shuffle_index}) {
    if (!ReadAll(fd, array->data(), array->size() * sizeof(int64_t))) {
      return mismatch("truncated arrays");
    }
  }
  return indices;
}

}  // namespace nf::data
