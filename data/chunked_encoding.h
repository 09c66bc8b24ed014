// Encoding a document of any length in bounded memory. Tokenizers hold per-byte state for the
// whole text of one Encode call: SentencePiece 0.1.97 peaks at 80-90 bytes per input byte (4.5 GB
// for one 50 MB document, or std::bad_alloc), GPT-2's BPE keeps a 16-byte view per pre-token.
// So documents longer than a chunk limit are encoded piecewise, cut where the tokenizer's own
// splitting cuts anyway, and the chunks' ids concatenated. (docs/design.md section 6.1.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/tokenizer.h"

namespace nf::data {

// 1 MiB: beyond almost every real document (web pages, papers, most books), which are therefore
// encoded whole exactly as before, while one call's working memory stays near 90 MiB per
// encoding thread with SentencePiece (a few MiB with GPT-2's BPE), whatever the document's size.
// Smaller chunks would save memory but cut more of the long texts without spaces, where a cut
// may change ids (below).
inline constexpr size_t kDefaultMaxChunkBytes = size_t{1} << 20;

// tokenizer.Encode(text) when the text has at most P = min(tokenizer.preferred_chunk_bytes(),
// max_chunk_bytes) bytes (at least 4 are used: one UTF-8 character). A longer text is encoded
// in chunks, and the chunks' ids concatenated: each chunk is cut at the exact cut furthest along
// within P bytes, else at the first exact cut beyond (never more than `max_chunk_bytes`). P is
// 4 KiB for SentencePiece unigram models, whose ids drift from the best segmentation as one
// call's text grows, and `max_chunk_bytes` for the others. Exact cuts (the ids those of
// encoding the text whole):
//   - a single ASCII space between two non-space characters (Unicode White_Space decides), the
//     space going where tokenizer.space_at_cut() says: GPT-2's pre-tokenization starts a token
//     there, and so do SentencePiece models that split by whitespace (the default, and what
//     nf-preprocess trains);
//   - before any whitespace character that follows a non-whitespace one, where
//     tokenizer.CutsBeforeWhitespace allows it: for GPT-2 always; for SentencePiece with
//     remove_extra_whitespaces (the default) before the characters its normalizer makes a word
//     boundary of. Text in paragraphs between newlines, double-spaced text and text separated by
//     U+3000 is cut there.
// SentencePiece may still break a tie between two segmentations of a word that score the same
// the other way (it compares float running scores, whose rounding depends on all the text
// before). That rounding also makes SentencePiece's whole-text encoding of a long text drift from
// the model's best segmentation, which chunks keep small.
//
// A stretch of `max_chunk_bytes` without an exact cut (text without whitespace, such as a long
// Chinese paragraph, or a base64 blob) is cut inexactly instead, and counted in *inexact_cuts
// (when given): at the last grapheme cluster boundary between two non-whitespace characters in
// the chunk's second half (grapheme_cluster.h: a combining sequence is never split, which would
// change its normal form), else the last character boundary between two such characters, else
// (a stretch of whitespace) the last character boundary that fits. The ids next to that cut may
// differ from whole-text encoding (the word is split in two), but the text is kept: the chunks
// on either side of a cut inside a word are encoded with tokenizer.EncodeInsideWord (without
// SentencePiece's dummy-prefix word start, which put a space in the text there before issue
// 45), and every chunk's ids are joined with tokenizer.AppendIds (one <unk> for a run of unknown
// text across a cut). That cut moves off an occurrence of tokenizer.special_token_text() it
// would fall inside (to its start, or past its end when it starts the chunk), so a special
// token stays one.
absl::StatusOr<std::vector<int32_t>> EncodeInChunks(const Tokenizer& tokenizer,
                                                    absl::string_view text,
                                                    size_t max_chunk_bytes = kDefaultMaxChunkBytes,
                                                    int64_t* inexact_cuts = nullptr);

}  // namespace nf::data
