#include "eval/tokenizer_client.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status.h"

extern char** environ;

namespace nf::eval {
namespace {

namespace fs = std::filesystem;

absl::Status OsError(absl::string_view what, int error) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
}

// A file of the texts in the protocol's records, removed when this goes out of scope.
class TextsFile {
 public:
  static absl::StatusOr<TextsFile> Write(const std::vector<std::string>& texts) {
    std::string path = (fs::temp_directory_path() / "nf-eval-texts-XXXXXX").string();
    const int fd = mkstemp(path.data());
    if (fd < 0) return OsError(absl::StrCat("cannot create ", path), errno);
    TextsFile file(path);
    std::string records;
    for (const std::string& text : texts) AppendTextRecord(text, records);
    for (size_t written = 0; written < records.size();) {
      const ssize_t n = ::write(fd, records.data() + written, records.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        ::close(fd);
        return OsError(absl::StrCat("cannot write ", path), error);
      }
      written += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) return OsError(absl::StrCat("cannot write ", path), errno);
    return file;
  }
  TextsFile(TextsFile&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TextsFile& operator=(TextsFile&&) = delete;
  ~TextsFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit TextsFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// What a process wrote to a file descriptor of an unlinked temporary file, from its start.
std::string ReadBack(int fd) {
  std::string text;
  char buffer[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR);) {
    if (n > 0) text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

// An unlinked temporary file (a descriptor only) for a helper's standard error.
absl::StatusOr<int> AnonymousFile() {
  std::string path = (fs::temp_directory_path() / "nf-eval-stderr-XXXXXX").string();
  const int fd = mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) return OsError(absl::StrCat("cannot create ", path), errno);
  ::unlink(path.c_str());
  return fd;
}

// Runs argv[0] with standard output into a pipe and returns everything it wrote. Its standard
// error is kept aside: when it fails, its own message becomes this error (one line for the
// user, not the helper's line and then ours); when it succeeds, what it said is passed on.
absl::StatusOr<std::string> RunCapturingOutput(const std::vector<std::string>& args) {
  NF_ASSIGN_OR_RETURN(const int errors_fd, AnonymousFile());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } close_errors{errors_fd};
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return OsError("cannot create a pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, errors_fd, STDERR_FILENO);
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    return OsError(absl::StrCat("cannot run ", args[0]), spawned);
  }
  std::string output;
  char buffer[1 << 16];
  int read_error = 0;
  while (true) {
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) read_error = errno;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string said = ReadBack(errors_fd);
  if (read_error != 0) return OsError(absl::StrCat("cannot read from ", args[0]), read_error);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    // "nf-tokenize: cannot open SentencePiece model M: ..." -> "cannot open ... (nf-tokenize,
    // exit code 1)": its first line says what is wrong.
    absl::string_view first = absl::string_view(said).substr(0, said.find('\n'));
    absl::ConsumePrefix(&first, absl::StrCat(fs::path(args[0]).filename().string(), ": "));
    const std::string how = WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                                              : absl::StrCat("signal ", WTERMSIG(status));
    return absl::FailedPreconditionError(
        first.empty()
            ? absl::StrCat(args[0], " failed (", how, ")")
            : absl::StrCat(first, " (", fs::path(args[0]).filename().string(), ", ", how, ")"));
  }
  std::cerr << said;
  return output;
}

absl::StatusOr<TokenizedTexts> ParseOutput(const std::string& output, size_t texts,
                                           const std::string& helper) {
  const auto malformed = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat(helper, " wrote ", what));
  };
  std::vector<absl::string_view> lines = absl::StrSplit(output, '\n');
  // Every line ends with '\n': the split leaves one empty piece after the last.
  if (lines.size() != texts + 2 || !lines.back().empty()) return malformed("the wrong line count");
  TokenizedTexts result;
  std::istringstream header{std::string(lines[0])};
  std::string vocab_word, eod_word;
  int64_t eod = -1;
  if (!(header >> vocab_word >> result.vocab_size >> eod_word >> eod) ||
      vocab_word != "vocab_size" || eod_word != "end_of_document") {
    return malformed("a malformed header");
  }
  if (eod >= 0) result.end_of_document = static_cast<int32_t>(eod);
  for (size_t i = 1; i <= texts; ++i) {
    std::vector<int32_t> ids;
    for (const absl::string_view word : absl::StrSplit(lines[i], ' ', absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(word, &id)) return malformed("a malformed id");
      ids.push_back(id);
    }
    result.ids.push_back(std::move(ids));
  }
  return result;
}

}  // namespace

absl::StatusOr<TokenizedTexts> TokenizeTexts(const std::string& helper, const TokenizerFlags& flags,
                                             const std::vector<std::string>& texts) {
  absl::StatusOr<TextsFile> file = TextsFile::Write(texts);
  if (!file.ok()) return file.status();
  std::vector<std::string> args = {helper};
  for (std::string& arg : TokenizerArguments(flags)) args.push_back(std::move(arg));
  args.insert(args.end(), {"--texts", file->path()});
  absl::StatusOr<std::string> output = RunCapturingOutput(args);
  if (!output.ok()) return output.status();
  return ParseOutput(*output, texts.size(), helper);
}

absl::StatusOr<std::string> ProgramBesideThisOne(const std::string& name) {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error)
    return absl::UnavailableError(absl::StrCat("cannot find this program: ", error.message()));
  const fs::path program = self.parent_path() / name;
  if (!fs::exists(program, error)) {
    return absl::NotFoundError(absl::StrCat(program.string(), " is missing: build the ", name,
                                            " target (it is built with this program)"));
  }
  return program.string();
}

}  // namespace nf::eval
