"""nf-preprocess's GPT-2 tokenizer gives the ids Hugging Face `tokenizers` gives (issue 18).

HF `tokenizers` (scripts/setup.sh installs 0.23.3 into .venv) is what Megatron's
HuggingFaceTokenizer and transformers' GPT2TokenizerFast run. Both sides read the same vocab.json
and merges.txt, written here: GPT-2's 256 byte symbols, a few merges of ASCII words and of the
pieces of "<|endoftext|>", and a merge of every "end of a UTF-8 character" byte with every lead
byte (and every continuation byte with every printable ASCII byte), so that two neighbouring
characters end up in one token exactly when the pre-tokenizer kept them in one piece: a character
class that differs on either side changes the ids. "<|endoftext|>" is the vocabulary's last
token and, on the HF side, an added special token, as in GPT-2's tokenizer.json. The HF
tokenizer is built as GPT-2's tokenizer.json describes it: BPE, ByteLevel pre-tokenizer without
a prefix space and with the GPT-2 regex, ByteLevel decoder and post-processor.

Checked over nf-preprocess's .bin/.idx (each document's appended end-of-document token removed),
every Unicode scalar value: identical ids
  - in the 4,344 documents of 256 consecutive code points (the issue's sweep), and
  - with each code point c written as "a" c "1" c "!" (its class then shows next to a letter, a
    digit and a punctuation mark: L, N, other and white space all cut that differently) over
    planes 0-3 and 14, where Unicode assigns characters; planes 4-13 are unassigned and 15-16
    private use, all "other" for HF, where the first sweep's documents are one piece each, so any
    code point read otherwise there already changes their ids.
With the Unicode 17 tables (HF's regex engine is at Unicode 16: data/gen_unicode_classes.py)
15 and 31 documents differed.

And texts holding "<|endoftext|>" (at either end, twice, next to spaces, inside a longer
literal, a prefix or another case of it): with --parse-special-tokens the ids of HF's default
(the literal is the token, the text on each side tokenized on its own), without it those of HF
with encode_special_tokens = True (the literal tokenized as text, which is also what Megatron's
GPT2BPETokenizer up to core 0.14 and openai's encoder.py give); one document each either way.

usage: hf_tokenizers_parity_test.py NF_PREPROCESS
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's reversible byte -> character map, from its definition: the printable bytes
    '!'..'~', '¡'..'¬', '®'..'ÿ' are their own character, the other 68 take U+0100, U+0101, ...
    in increasing byte order."""
    own = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in own:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def write_vocab(work):
    sym = bytes_to_unicode()
    tokens = [sym[b] for b in range(256)]
    merges = []

    def merge(left, right):
        merges.append(f"{left} {right}")
        if left + right not in tokens:
            tokens.append(left + right)

    def text(s):
        return "".join(sym[b] for b in s.encode())

    # Words, so that ordinary text tokenizes into more than bytes.
    for left, right in [(" ", "t"), ("h", "e"), (" t", "he"), ("e", "n"), ("d", "o"), ("en", "do"),
                        ("f", "t"), ("e", "x"), ("ex", "t"), ("ft", "ext"), ("endo", "ftext"),
                        ("<", "|"), ("|", ">"), (" ", "<|")]:
        merge(text(left), text(right))
    # Neighbouring characters: the last byte of one (ASCII or a continuation byte) with the lead
    # byte of the next; a continuation byte with a printable ASCII byte.
    for last in list(range(0x00, 0x80)) + list(range(0x80, 0xC0)):
        for lead in range(0xC2, 0xF5):
            merge(sym[last], sym[lead])
    for last in range(0x80, 0xC0):
        for ascii_byte in range(0x21, 0x7F):
            merge(sym[last], sym[ascii_byte])
    tokens.append(EOT)
    vocab = {token: i for i, token in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    (work / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (work / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n",
                                     encoding="utf-8")
    return vocab[EOT], len(tokens)


def hf_tokenizer(work):
    tok = Tokenizer(models.BPE.from_file(str(work / "vocab.json"), str(work / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                 use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=True)])
    return tok


def preprocess(nf_preprocess, work, eod, name, documents, *flags):
    """nf-preprocess over `documents` (JSONL); each document's ids, its end-of-document token
    checked and removed."""
    corpus = work / f"{name}.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for d in documents:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    prefix = work / name
    subprocess.run([nf_preprocess, "--input", str(corpus), "--output-prefix", str(prefix),
                    "--tokenizer", "gpt2", "--vocab-file", str(work / "vocab.json"),
                    "--merges-file", str(work / "merges.txt"), *flags],
                   check=True, capture_output=True, text=True)
    idx = (prefix.with_suffix(".idx")).read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
    dtype = {8: np.uint16, 4: np.int32}[idx[17]]
    sequences, entries = struct.unpack_from("<QQ", idx, 18)
    lengths = np.frombuffer(idx, np.int32, sequences, 34)
    pointers = np.frombuffer(idx, np.int64, sequences, 34 + 4 * sequences)
    document_index = np.frombuffer(idx, np.int64, entries, 34 + 12 * sequences)
    assert sequences == len(documents) and entries == sequences + 1, (sequences, entries)
    assert list(document_index) == list(range(entries))
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype)
    itemsize = np.dtype(dtype).itemsize
    out = []
    for length, pointer in zip(lengths, pointers):
        ids = tokens[pointer // itemsize:pointer // itemsize + length].tolist()
        assert ids[-1] == eod, ids
        out.append(ids[:-1])
    return out


def compare(what, documents, ours, theirs):
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    for i in bad[:5]:
        a, b = ours[i], theirs[i]
        at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        print(f"{what}: document {i} ({documents[i][:40]!r}...) differs at id {at}: "
              f"ours {a[max(0, at - 3):at + 3]}, HF {b[max(0, at - 3):at + 3]}", file=sys.stderr)
    print(f"{what}: {len(documents) - len(bad)} of {len(documents)} documents identical")
    return len(bad)


def sweep_documents():
    blocks = []
    for start in range(0, 0x110000, 256):
        chars = [chr(c) for c in range(start, start + 256) if not 0xD800 <= c <= 0xDFFF]
        if chars:
            blocks.append(chars)
    plain = ["".join(chars) for chars in blocks]
    assigned_planes = [chars for chars in blocks if ord(chars[0]) >> 16 in (0, 1, 2, 3, 14)]
    probes = ["".join("a" + c + "1" + c + "!" for c in chars) for chars in assigned_planes]
    return plain, probes


SPECIAL_TEXTS = [
    "Hello<|endoftext|>world",
    "the end.<|endoftext|>The start",
    "a <|endoftext|> b",
    " <|endoftext|>",
    "<|endoftext|> ",
    EOT,
    EOT + EOT,
    "<<|endoftext|>>",
    "<|endo<|endoftext|>ftext|>",
    "<|endoftext|>|>",
    "x<|endoftext",
    "<|ENDOFTEXT|>",
    "It's<|endoftext|>'s",
    "line one\n<|endoftext|>\n\nline two",
    "tab\t<|endoftext|>\tand  <|endoftext|>  spaces",
    "number 12<|endoftext|>34",
    "é<|endoftext|>ü",
]


def main():
    nf_preprocess = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        eod, vocab_size = write_vocab(work)
        hf = hf_tokenizer(work)
        assert hf.token_to_id(EOT) == eod and hf.get_vocab_size() == vocab_size
        failures = 0

        plain, probes = sweep_documents()
        assert len(plain) == 4344, len(plain)
        for name, documents in [("sweep", plain), ("sweep-probes", probes)]:
            ours = preprocess(nf_preprocess, work, eod, name, documents, "--workers", "2")
            theirs = [e.ids for e in hf.encode_batch_fast(documents)]
            failures += compare(f"every code point ({name})", documents, ours, theirs)

        # "<|endoftext|>" in the text: the token with --parse-special-tokens, as in HF by default;
        # text without it, as in HF with encode_special_tokens (transformers' split_special_tokens).
        theirs = [e.ids for e in hf.encode_batch(SPECIAL_TEXTS)]
        assert [eod in ids for ids in theirs] == [EOT in t for t in SPECIAL_TEXTS]
        ours = preprocess(nf_preprocess, work, eod, "special", SPECIAL_TEXTS,
                          "--parse-special-tokens")
        failures += compare("--parse-special-tokens vs HF", SPECIAL_TEXTS, ours, theirs)
        hf.encode_special_tokens = True
        theirs = [e.ids for e in hf.encode_batch(SPECIAL_TEXTS)]
        assert not any(eod in ids for ids in theirs)
        ours = preprocess(nf_preprocess, work, eod, "text", SPECIAL_TEXTS)
        failures += compare("default vs HF encode_special_tokens", SPECIAL_TEXTS, ours, theirs)
        # The literal as text is GPT-2's regex over it: "<|", "endoftext", "|>" (merged here).
        expected = [hf.token_to_id(t) for t in ["<|", "endoftext", "|>"]]
        assert ours[SPECIAL_TEXTS.index(EOT)] == expected, ours[SPECIAL_TEXTS.index(EOT)]
    if failures:
        sys.exit(f"FAILED: {failures} documents differ from HF tokenizers {hf_version()}")
    print(f"OK: identical to HF tokenizers {hf_version()}")


def hf_version():
    import tokenizers
    return tokenizers.__version__


if __name__ == "__main__":
    main()
