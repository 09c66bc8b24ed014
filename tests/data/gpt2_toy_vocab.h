// A toy GPT-2 byte-level BPE for tests: the 256 byte symbols (id = byte value) and the merges a
// test chooses, as the vocab.json and merges.txt GPT-2 ships, written independently of
// data/gpt2_bpe.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/gpt2_bpe.h"
#include "tests/assert_ok.h"

namespace nf::data {

// GPT-2's bytes_to_unicode, written from its definition (independently of gpt2_bpe.cc): the
// printable bytes '!'..'~', '¡'..'¬', '®'..'ÿ' are their own code point; the other 68 bytes,
// in increasing order, take U+0100, U+0101, ... So ' ' (0x20) is 'Ġ' (U+0120), '\n' (0x0A) is
// 'Ċ' (U+010A), 0xC3 is 'Ã' and 0xA9 is '©'.
inline std::string ByteSymbol(int byte) {
  std::vector<int> printable;
  for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
  int code_point = byte;
  if (std::find(printable.begin(), printable.end(), byte) == printable.end()) {
    code_point = 256;
    for (int b = 0; b < byte; ++b) {
      if (std::find(printable.begin(), printable.end(), b) == printable.end()) ++code_point;
    }
  }
  std::string utf8;
  if (code_point < 0x80) {
    utf8.push_back(static_cast<char>(code_point));
  } else {
    utf8.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    utf8.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return utf8;
}

// A JSON string literal as Python's json.dump writes GPT-2's encoder.json: non-ASCII as \uXXXX.
inline std::string JsonString(const std::string& utf8) {
  std::string out = "\"";
  for (size_t i = 0; i < utf8.size();) {
    const unsigned char c = utf8[i];
    if (c < 0x80) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
    } else {  // toy tokens only hold 2-byte characters
      const int code_point = (c & 0x1F) << 6 | (utf8[i + 1] & 0x3F);
      absl::StrAppend(&out, "\\u", absl::Hex(code_point, absl::kZeroPad4));
      i += 2;
    }
  }
  return out + "\"";
}

// A byte-level vocabulary: symbol of byte b -> b, then each merge's result in merge order,
// then `extra` tokens. Merges are symbol strings "left right".
struct ToyFiles {
  std::string vocab_json;
  std::string merges_txt;
  std::map<std::string, int32_t> ids;  // symbol string -> id
};

inline ToyFiles MakeToy(const std::vector<std::string>& merges,
                        const std::vector<std::string>& extra) {
  ToyFiles toy;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteSymbol(b));
  toy.merges_txt = "#version: 0.2\n";
  for (const std::string& merge : merges) {
    const size_t space = merge.find(' ');
    const std::string merged = merge.substr(0, space) + merge.substr(space + 1);
    if (std::find(tokens.begin(), tokens.end(), merged) == tokens.end()) tokens.push_back(merged);
    absl::StrAppend(&toy.merges_txt, merge, "\n");
  }
  tokens.insert(tokens.end(), extra.begin(), extra.end());
  std::vector<std::string> members;
  for (size_t id = 0; id < tokens.size(); ++id) {
    toy.ids[tokens[id]] = static_cast<int32_t>(id);
    members.push_back(absl::StrCat(JsonString(tokens[id]), ": ", id));
  }
  toy.vocab_json = absl::StrCat("{", absl::StrJoin(members, ",\n "), "}\n");
  return toy;
}

inline std::unique_ptr<Gpt2Bpe> MakeBpe(const ToyFiles& toy) {
  absl::StatusOr<std::unique_ptr<Gpt2Bpe>> bpe =
      Gpt2Bpe::FromContents(toy.vocab_json, toy.merges_txt);
  NF_EXPECT_OK(bpe);
  if (!bpe.ok()) std::abort();
  return *std::move(bpe);
}

}  // namespace nf::data
