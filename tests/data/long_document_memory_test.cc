// nf-preprocess on one 32 MiB document with SentencePiece, run as a user runs it: it succeeds,
// and its peak resident memory stays under 12 bytes per document byte (measured: 244 MB, 7.3 per
// byte). Encoding the document in one SentencePiece call took 2.67 GB here, 79 per byte (and
// 4.5 GB for 50 MB, or std::bad_alloc on a smaller machine); encoded in chunks
// (data/chunked_encoding.h), what remains is the document's own copies (read, JSON-decoded),
// its ids, and one chunk's working memory.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/sentencepiece_tokenizer.h"
#include "tests/assert_ok.h"
#include "tests/cli_util.h"

extern char** environ;

namespace nf::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kDocumentBytes = size_t{32} << 20;
constexpr size_t kPeakBytesPerDocumentByte = 12;

// A sentence of pseudo-words (letters, single spaces, a period): JSON needs no escapes.
std::string Sentence(std::mt19937& rng) {
  static constexpr const char* kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to",  "vi",
                                               "pe", "da", "go", "fu", "zi", "ba", "che", "str"};
  std::string sentence;
  for (int w = 3 + rng() % 8; w > 0; --w) {
    for (int s = 1 + rng() % 3; s > 0; --s) sentence += kSyllables[rng() % 16];
    sentence += w > 1 ? " " : ". ";
  }
  return sentence;
}

// What a finished child process did: its exit status and its peak resident memory.
struct ChildRun {
  int status = -1;
  long peak_rss_bytes = 0;
};

// Runs `argv` with stdout and stderr into `log`; wait4 reports the child's own peak RSS.
ChildRun RunMeasured(const std::vector<std::string>& argv, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  ChildRun run;
  const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return run;
  struct rusage usage {};
  if (wait4(pid, &run.status, 0, &usage) == pid) run.peak_rss_bytes = usage.ru_maxrss * 1024L;
  return run;
}

TEST(LongDocumentMemoryTest, OneHugeDocumentIsEncodedInBoundedMemory) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "under AddressSanitizer the resident memory is its shadow and quarantine";
#endif
  const fs::path dir =
      fs::path(::testing::TempDir()) / absl::StrCat("nf_long_document_memory_test_", getpid());
  fs::create_directories(dir);
  // Removed however the test ends: the document and the dataset are 100 MB.
  const std::unique_ptr<const fs::path, void (*)(const fs::path*)> remove_dir(
      &dir, [](const fs::path* path) { fs::remove_all(*path); });
  std::mt19937 rng(1);
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 3000; ++i) corpus << Sentence(rng) << "\n";
  }
  NF_ASSERT_OK(SentencePieceTokenizer::Train({.inputs = {(dir / "corpus.txt").string()},
                                              .model_prefix = (dir / "toy").string(),
                                              .vocab_size = 300}));
  std::string document;
  while (document.size() < kDocumentBytes) document += Sentence(rng);
  std::ofstream((dir / "huge.jsonl").string()) << "{\"text\": \"" << document << "\"}\n";

  const ChildRun run = RunMeasured({NF_PREPROCESS_BINARY, "--input", (dir / "huge.jsonl").string(),
                                    "--output-prefix", (dir / "huge").string(), "--tokenizer",
                                    "sentencepiece", "--spm-model", (dir / "toy.model").string()},
                                   dir / "log.txt");
  const std::string log = nf::testing::ReadFile(dir / "log.txt");
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << log;
  EXPECT_NE(log.find("1 documents"), std::string::npos) << log;
  std::cout << "peak RSS " << run.peak_rss_bytes / 1000000 << " MB for a document of "
            << document.size() / 1000000 << " MB\n";
  EXPECT_LT(run.peak_rss_bytes, kPeakBytesPerDocumentByte * document.size());
}

}  // namespace
}  // namespace nf::data
