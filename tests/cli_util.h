// Running a program of this build from a test, as a user would from a shell: its exit code and
// what it printed on stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace nf::testing {

// What one run of a program did.
struct Outcome {
  int exit_code = -1;  // -1 unless it exited normally
  std::string out, err;
};

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines of `text`, without the newlines (and without an empty last one).
inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// Single-quotes `arg` for /bin/sh.
inline std::string ShellQuote(const std::string& arg) {
  std::string quoted = "'";
  for (const char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

// Runs `binary` with `args`, capturing stdout and stderr in files under `scratch_dir`.
inline Outcome RunProgram(const std::string& binary, const std::vector<std::string>& args,
                          const std::filesystem::path& scratch_dir) {
  const std::filesystem::path out = scratch_dir / "stdout.txt", err = scratch_dir / "stderr.txt";
  std::string command = ShellQuote(binary);
  for (const std::string& arg : args) absl::StrAppend(&command, " ", ShellQuote(arg));
  absl::StrAppend(&command, " >", ShellQuote(out.string()), " 2>", ShellQuote(err.string()),
                  " </dev/null");
  const int status = std::system(command.c_str());
  Outcome outcome;
  if (status != -1 && WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  outcome.out = ReadFile(out);
  outcome.err = ReadFile(err);
  return outcome;
}

}  // namespace nf::testing
