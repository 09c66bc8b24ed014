#include "generate/text_decoder.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

extern char** environ;

namespace nf::generate {

absl::StatusOr<std::unique_ptr<TextDecoder>> TextDecoder::Start(const std::string& helper,
                                                                const eval::TokenizerFlags& flags) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0) return absl::UnavailableError("pipe() failed for the decoder");
  if (pipe(from_child) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return absl::UnavailableError("pipe() failed for the decoder");
  }
  std::vector<std::string> args = {helper};
  for (const std::string& arg : eval::TokenizerArguments(flags)) args.push_back(arg);
  args.push_back("--decode");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  for (const int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) {
    posix_spawn_file_actions_addclose(&actions, fd);
  }
  std::unique_ptr<TextDecoder> decoder(new TextDecoder());
  const int error =
      posix_spawn(&decoder->pid_, helper.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (error != 0) {
    close(to_child[1]);
    close(from_child[0]);
    decoder->pid_ = -1;
    return absl::UnavailableError(absl::StrCat("cannot start ", helper, ": error ", error));
  }
  decoder->to_helper_ = fdopen(to_child[1], "w");
  decoder->from_helper_ = fdopen(from_child[0], "r");
  return decoder;
}

TextDecoder::~TextDecoder() {
  if (to_helper_ != nullptr) std::fclose(to_helper_);
  if (from_helper_ != nullptr) std::fclose(from_helper_);
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

absl::StatusOr<std::string> TextDecoder::Decode(std::span<const int32_t> ids) {
  const std::string line = absl::StrCat(absl::StrJoin(ids, " "), "\n");
  if (std::fwrite(line.data(), 1, line.size(), to_helper_) != line.size() ||
      std::fflush(to_helper_) != 0) {
    return absl::UnavailableError("the decoding helper nf-tokenize stopped reading");
  }
  // "<bytes>\n<text>\n"
  std::string length_line;
  for (int c = std::fgetc(from_helper_); c != '\n'; c = std::fgetc(from_helper_)) {
    if (c == EOF) {
      return absl::UnavailableError(
          "the decoding helper nf-tokenize ended without an answer (its message is above)");
    }
    length_line.push_back(static_cast<char>(c));
  }
  size_t length = 0;
  if (!absl::SimpleAtoi(length_line, &length)) {
    return absl::InternalError(absl::StrCat("nf-tokenize --decode answered '", length_line, "'"));
  }
  std::string text(length + 1, '\0');
  if (std::fread(text.data(), 1, length + 1, from_helper_) != length + 1 || text.back() != '\n') {
    return absl::InternalError("nf-tokenize --decode answered a short record");
  }
  text.pop_back();
  return text;
}

absl::StatusOr<std::string> ContinuationText(std::span<const int32_t> prompt_ids,
                                             std::span<const int32_t> ids,
                                             const DecodeIds& decode) {
  if (prompt_ids.empty()) return decode(ids);
  std::vector<int32_t> joint(prompt_ids.begin(), prompt_ids.end());
  joint.insert(joint.end(), ids.begin(), ids.end());
  NF_ASSIGN_OR_RETURN(const std::string prompt, decode(prompt_ids));
  NF_ASSIGN_OR_RETURN(std::string text, decode(joint));
  if (text.compare(0, prompt.size(), prompt) == 0) return text.substr(prompt.size());
  return decode(ids);
}

std::string ValidUtf8(const std::string& text) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char lead = s[i];
    size_t length = 0;
    uint32_t lo = 0x80, hi = 0xBF;  // the range of the second byte (RFC 3629's table)
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    }
    // The longest valid prefix of the sequence (one replacement for it, as Python does).
    size_t valid = length == 0 ? 0 : 1;
    while (valid < length && i + valid < n) {
      const unsigned char c = s[i + valid];
      if (valid == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
      ++valid;
    }
    if (length > 0 && valid == length) {
      out.append(text, i, length);
      i += length;
    } else {
      out += kReplacement;
      i += std::max<size_t>(valid, 1);
    }
  }
  return out;
}

}  // namespace nf::generate
