#include "data/gpt2_bpe.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "data/gpt2_pretokenizer.h"
#include "data/unicode_class.h"
#include "data/vocab_json.h"

namespace nf::data {
namespace {

constexpr absl::string_view kEndOfText = "<|endoftext|>";
// Longer pre-tokens (long numbers, runs of punctuation or spaces) are rarely repeated; caching
// them would only churn the shards.
constexpr size_t kMaxCachedBytes = 64;
constexpr size_t kCacheCapacity = 1 << 16;  // words per thread and tokenizer

using WordCache = absl::flat_hash_map<std::string, std::vector<int32_t>>;

// This thread's cache for the tokenizer with id `cache_id` (ids are never reused, so a
// destroyed tokenizer's entry is merely dead weight until the thread ends).
WordCache& ThreadCache(uint64_t cache_id) {
  thread_local absl::flat_hash_map<uint64_t, WordCache> caches;
  return caches[cache_id];
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the others (control
// characters, space, DEL, NBSP, soft hyphen...) take U+0100, U+0101, ... in byte order, so
// that no symbol is whitespace or a control character and the map stays reversible.
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? b : next++;
  }
  return map;
}

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else {  // the byte alphabet stays below U+0800
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

// A token string of the vocabulary back to the bytes it stands for.
std::string TokenBytes(absl::string_view token, const std::array<int, 0x144>& code_point_byte) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const int length = NextUtf8Char(token, pos).length;
    uint32_t code_point = static_cast<unsigned char>(token[pos]);
    if (length == 2) code_point = (code_point & 0x1F) << 6 | (token[pos + 1] & 0x3F);
    if (code_point < code_point_byte.size() && code_point_byte[code_point] >= 0) {
      bytes.push_back(static_cast<char>(code_point_byte[code_point]));
    } else {
      bytes.append(token.data() + pos, length);  // not a byte symbol: its own UTF-8
    }
    pos += length;
  }
  return bytes;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return static_cast<uint64_t>(left) << 32 | static_cast<uint32_t>(right);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    contents.append(buffer, n);
  }
  ::close(fd);
  return contents;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::Load(const std::string& vocab_path,
                                                       const std::string& merges_path) {
  NF_ASSIGN_OR_RETURN(const std::string vocab, ReadFile(vocab_path));
  NF_ASSIGN_OR_RETURN(const std::string merges, ReadFile(merges_path));
  return FromContents(vocab, merges, vocab_path, merges_path);
}

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::FromContents(absl::string_view vocab_json,
                                                               absl::string_view merges_txt,
                                                               absl::string_view vocab_name,
                                                               absl::string_view merges_name) {
  NF_ASSIGN_OR_RETURN(const auto vocab, ParseVocabJson(vocab_json, vocab_name));
  const auto vocab_error = [&](const auto&... what) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_name, ": ", what...));
  };
  std::unique_ptr<Gpt2Bpe> bpe(new Gpt2Bpe());

  // Ids must be exactly 0..N-1: each decodes to one token, and vocab_size() bounds them all.
  std::vector<const std::string*> tokens(vocab.size(), nullptr);
  for (const auto& [token, id] : vocab) {
    if (static_cast<size_t>(id) >= tokens.size()) {
      return vocab_error("ids must be 0..", vocab.size() - 1, " (one per token), but \"",
                         absl::CHexEscape(token), "\" has id ", id);
    }
    if (tokens[id] != nullptr) {
      return vocab_error("id ", id, " is used by both \"", absl::CHexEscape(*tokens[id]),
                         "\" and \"", absl::CHexEscape(token), "\"");
    }
    tokens[id] = &token;
  }

  const std::array<uint32_t, 256> byte_code_point = ByteToCodePoint();
  std::array<int, 0x144> code_point_byte;  // the inverse map; -1: not a byte symbol
  code_point_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    code_point_byte[byte_code_point[b]] = b;
    std::string symbol;
    AppendUtf8(byte_code_point[b], symbol);
    const auto it = vocab.find(symbol);
    if (it == vocab.end()) {
      return vocab_error("no token for byte 0x", absl::Hex(b, absl::kZeroPad2), " (\"", symbol,
                         "\"): a byte-level BPE vocabulary must have all 256");
    }
    bpe->byte_ids_[b] = it->second;
  }
  bpe->id_bytes_.reserve(tokens.size());
  for (const std::string* token : tokens) {
    bpe->id_bytes_.push_back(TokenBytes(*token, code_point_byte));
  }
  if (const auto it = vocab.find(kEndOfText); it != vocab.end()) {
    bpe->end_of_document_ = it->second;
  }

  const std::vector<absl::string_view> lines = absl::StrSplit(merges_txt, '\n');
  const auto merges_error = [&](size_t line, const auto&... what) {
    return absl::InvalidArgumentError(absl::StrCat(merges_name, ":", line, ": ", what...));
  };
  // encoder.py always skips the first line; requiring it to be the header keeps a headerless
  // file from silently losing its best merge.
  if (!absl::StartsWith(lines[0], "#version")) {
    return merges_error(1, "expected the \"#version: ...\" header line");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t line_number = i + 1;
    if (line.empty() && i + 1 == lines.size()) break;  // the final newline
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty() ||
        absl::StrContains(line, '\r') || absl::StrContains(line, '\t')) {
      return merges_error(line_number, "expected two tokens separated by one space, got \"",
                          absl::CHexEscape(line), "\"");
    }
    int32_t ids[3];
    const std::string merged = absl::StrCat(parts[0], parts[1]);
    const absl::string_view names[3] = {parts[0], parts[1], merged};
    for (int k = 0; k < 3; ++k) {
      const auto it = vocab.find(names[k]);
      if (it == vocab.end()) {
        return merges_error(line_number, k < 2 ? "token \"" : "merged token \"",
                            absl::CHexEscape(names[k]), "\" is not in ", vocab_name);
      }
      ids[k] = it->second;
    }
    if (i - 1 > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return merges_error(line_number, "too many merges");
    }
    const Merge merge = {.rank = static_cast<int32_t>(i - 1), .merged = ids[2]};
    const auto [it, inserted] = bpe->merges_.emplace(PairKey(ids[0], ids[1]), merge);
    if (!inserted) {
      return merges_error(line_number, "duplicate merge \"", absl::CHexEscape(line),
                          "\" (first on line ", it->second.rank + 2, ")");
    }
  }
  return bpe;
}

const Gpt2Bpe::Merge* Gpt2Bpe::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// encoder.py's loop, done with a heap instead of rescanning the word for every merge, so that a
// long pre-token (a digit string, base64) costs O(n log n) instead of O(n^2). It must merge in
// the same order: encoder.py takes the best-ranked pair and merges all its occurrences left to
// right before looking at the pairs this created. So the heap orders candidates by (rank,
// position), one rank is drained at a time, and pairs created while draining it wait in
// `created` until it is done (a created pair of lower rank would otherwise jump the queue).
// A rank names one pair and a merge creates pairs with the merged token in them, never that
// pair again, so draining one rank cannot create more of it.
std::vector<int32_t> Gpt2Bpe::MergeWord(absl::string_view piece) const {
  const int32_t n = static_cast<int32_t>(piece.size());
  struct Symbol {
    int32_t id;  // -1: merged into the symbol on its left
    int32_t prev;
    int32_t next;  // -1: none
  };
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {.id = byte_ids_[static_cast<unsigned char>(piece[i])],
                  .prev = i - 1,
                  .next = i + 1 < n ? i + 1 : -1};
  }
  // The merge of the pair starting at `left`, if it has one.
  const auto merge_at = [&](int32_t left) -> const Merge* {
    const int32_t right = symbols[left].next;
    if (symbols[left].id < 0 || right < 0) return nullptr;
    return FindMerge(symbols[left].id, symbols[right].id);
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    auto operator<=>(const Candidate&) const = default;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](int32_t left) {
    if (const Merge* merge = merge_at(left)) heap.push({.rank = merge->rank, .left = left});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  std::vector<int32_t> created;
  while (!heap.empty()) {
    const int32_t rank = heap.top().rank;
    while (!heap.empty() && heap.top().rank == rank) {
      const int32_t left = heap.top().left;
      heap.pop();
      const Merge* merge = merge_at(left);
      if (merge == nullptr || merge->rank != rank) continue;  // an earlier merge took a symbol
      Symbol& l = symbols[left];
      Symbol& r = symbols[l.next];
      l.id = merge->merged;
      r.id = -1;
      l.next = r.next;
      if (l.next >= 0) symbols[l.next].prev = left;
      if (l.prev >= 0) created.push_back(l.prev);
      created.push_back(left);
    }
    for (int32_t left : created) push(left);
    created.clear();
  }

  std::vector<int32_t> ids;
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

uint64_t Gpt2Bpe::NextCacheId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void Gpt2Bpe::AppendWord(absl::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() == 1) {
    ids.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() > kMaxCachedBytes) {
    const std::vector<int32_t> word = MergeWord(piece);
    ids.insert(ids.end(), word.begin(), word.end());
    return;
  }
  WordCache& cache = ThreadCache(cache_id_);
  if (const auto it = cache.find(piece); it != cache.end()) {
    ids.insert(ids.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> word = MergeWord(piece);
  ids.insert(ids.end(), word.begin(), word.end());
  if (cache.size() >= kCacheCapacity) cache.clear();
  cache.emplace(piece, std::move(word));
}

absl::StatusOr<std::vector<int32_t>> Gpt2Bpe::Encode(absl::string_view text) const {
  if (text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT-2 BPE: a text of ", text.size(), " bytes is over the 2 GiB limit"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // With special tokens parsed, the text is first cut at each "<|endoftext|>" (leftmost first, no
  // overlaps) and the text between is pre-tokenized on its own, as HF tokenizers' added
  // vocabulary does: " <|endoftext|>" is " " then the token, never a piece " <|".
  while (parse_special_tokens_) {
    const size_t at = text.find(kEndOfText);
    if (at == text.npos) break;
    for (absl::string_view piece : Gpt2PreTokenize(text.substr(0, at))) AppendWord(piece, ids);
    ids.push_back(*end_of_document_);
    text.remove_prefix(at + kEndOfText.size());
  }
  for (absl::string_view piece : Gpt2PreTokenize(text)) AppendWord(piece, ids);
  return ids;
}

absl::Status Gpt2Bpe::ParseSpecialTokens(bool enable) {
  if (enable && !end_of_document_.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 BPE: the vocabulary has no \"",
                                                   kEndOfText,
                                                   "\" token, so none can be read in the text"));
  }
  parse_special_tokens_ = enable;
  return absl::OkStatus();
}

absl::string_view Gpt2Bpe::special_token_text() const {
  return parse_special_tokens_ ? kEndOfText : absl::string_view();
}

absl::StatusOr<std::string> Gpt2Bpe::Decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("GPT-2 BPE: id ", ids[i], " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     vocab_size(), ")"));
    }
    text += id_bytes_[ids[i]];
  }
  return text;
}

}  // namespace nf::data
