"""normformer's SentencePiece ids of long documents against sentencepiece 0.2.3's (issue 33 item 13).

normformer links Debian's libsentencepiece 0.1.97. A unigram model picks the best-scoring
segmentation of a text, but 0.1.97 compares segmentations by a running score whose rounding grows
with the text, and on long documents it picks lower-scoring ones than the Python package
sentencepiece 0.2.3 (scripts/setup.sh installs it into .venv), which users train and encode with
(e.g. ' told' as '▁t' 'old' instead of '▁to' 'l' 'd'). normformer therefore encodes a unigram
model's text in chunks of about 4 KiB cut where the ids are those of the whole text
(data/chunked_encoding.h); this test checks that it then agrees with 0.2.3.

A unigram model is trained with sentencepiece 0.2.3 on generated text (pseudo-words of Zipfian
frequency, sentences, paragraphs); documents of 16 KiB to 1 MiB are encoded by nf-tokenize (the
tokenizer nf-eval uses, which encodes as nf-preprocess does) and by 0.2.3. Where the two differ,
the stretch of text on which they differ must be a tie: both segmentations spell the same text
and score the same within the rounding of a float running score over one chunk (tolerance
below). Encoding each document in one 0.1.97 call, as normformer did before, fails here: 7
stretches of the 1 MiB documents score lower than 0.2.3's, by 0.01 to 0.08 (e.g. 'totmi' as
'to' 't' 'mi', -17.00365, against 't' 'otmi', -16.96839; checked with the library called
directly). On English text the previous session counted 216 such stretches in 1 MiB.

Then the text at a 1 MiB cut (issue 45 item 10): documents over 1 MiB built from adversarial
pieces, each with a stretch of more than 1 MiB without whitespace (glued words, a base64 blob,
words with combining accents, CJK, numbers and punctuation, a URL, emoji sequences, words joined
by U+200B, which the normalizer makes a space), encoded by nf-tokenize with a unigram model
trained on English with SentencePiece's defaults (what nf-preprocess trains): decoding the ids
must give what decoding sentencepiece 0.2.3's ids gives, the document in normal form. Before,
the chunk after the cut was encoded with the dummy prefix's word start, a space in the text
there, and a cut could split a combining sequence.

usage: sentencepiece_reference_test.py NF_TOKENIZE
"""
import pathlib
import random
import subprocess
import sys
import tempfile

import sentencepiece as spm

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "pe", "da", "go", "fu", "zi", "ba",
             "che", "str", "an", "el", "is", "on", "th", "er", "l", "d", "t", "o"]


def make_words(rng, count):
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def make_text(rng, words, weights, size):
    """Sentences of words drawn with Zipfian weights, some capitalised or followed by
    punctuation, in paragraphs separated by newlines."""
    parts, length = [], 0
    while length < size:
        sentence = rng.choices(words, weights, k=rng.randint(4, 20))
        sentence[0] = sentence[0].capitalize()
        text = " ".join(w + ("," if rng.random() < 0.08 else "") for w in sentence)
        text += rng.choice([".", ".", ".", "?", "!"]) + ("\n" if rng.random() < 0.2 else " ")
        parts.append(text)
        length += len(text)
    return "".join(parts)[:size]


def nf_ids(nf_tokenize, model, documents, work):
    texts = work / "texts"
    with open(texts, "wb") as out:
        for document in documents:
            data = document.encode()
            out.write(b"%d\n%s\n" % (len(data), data))
    result = subprocess.run([nf_tokenize, "--tokenizer", "sentencepiece", "--spm-model", model,
                             "--texts", texts], check=True, capture_output=True, text=True)
    lines = result.stdout.split("\n")
    return [[int(i) for i in line.split()] for line in lines[1:1 + len(documents)]]


def differing_stretches(ours, reference, sp):
    """The stretches where two segmentations of one text differ: for each, the pieces of each
    side that spell the same text, and their total scores."""
    stretches = []
    i = j = 0
    while i < len(ours) and j < len(reference):
        if ours[i] == reference[j]:
            i, j = i + 1, j + 1
            continue
        spelled_ours, spelled_reference = "", ""
        pieces_ours, pieces_reference = [], []
        while True:
            if len(spelled_ours) <= len(spelled_reference):
                assert i < len(ours), "our ids spell a shorter text"
                pieces_ours.append(ours[i])
                spelled_ours += sp.id_to_piece(ours[i])
                i += 1
            else:
                assert j < len(reference), "our ids spell a longer text"
                pieces_reference.append(reference[j])
                spelled_reference += sp.id_to_piece(reference[j])
                j += 1
            if spelled_ours == spelled_reference:
                break
        stretches.append((spelled_ours, [sp.id_to_piece(p) for p in pieces_ours],
                          [sp.id_to_piece(p) for p in pieces_reference],
                          sum(sp.get_score(p) for p in pieces_ours),
                          sum(sp.get_score(p) for p in pieces_reference)))
    assert i == len(ours) and j == len(reference), "the two sides spell different texts"
    return stretches


ENGLISH = ("the of and to in is was that for it with as his on be at by had are but from or have "
           "an they which one you were her all she there would their we him been has when who "
           "will more no if out so said what up its about into than them can only other new "
           "some could time these two may then do first any my now such like our over man me "
           "even most made after also did many before must through back years where much your "
           "way well down should because each just those people how too little state good very "
           "make world still own see men work long get here between both life being under never "
           "day same another know while last might us great old year off come since against go "
           "came right used take three").split()
# Pieces of the stretches without whitespace, one kind per document.
ADVERSARIAL = [
    ("glued words", lambda rng: rng.choice(ENGLISH)),
    ("base64", lambda rng: "".join(rng.choice(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(16))),
    ("combining accents", lambda rng: rng.choice(ENGLISH) + rng.choice(["e\u0301", "a\u0300\u0316",
                                                                         "n\u0303", "o\u0308"])),
    ("CJK", lambda rng: rng.choice(["\u6f22\u5b57", "\u65e5\u672c\u8a9e", "\u4e2d\u6587",
                                    "\u6bb5\u843d"])),
    ("numbers", lambda rng: rng.choice(["3.14159", ",", ";", "2.71828", "-", "42", "(1)", "..."])),
    ("URL", lambda rng: rng.choice(["https://example.com/", rng.choice(ENGLISH), "?q=", "&id=",
                                    "%20", "/", "#top"])),
    ("emoji", lambda rng: rng.choice(["\U0001F468\u200D\U0001F469\u200D\U0001F467",
                                      "\U0001F44D\U0001F3FD", "\U0001F1EB\U0001F1F7",
                                      rng.choice(ENGLISH)])),
    ("U+200B", lambda rng: rng.choice(ENGLISH) + "\u200b"),
]


def english(rng, size):
    parts, length = [], 0
    while length < size:
        sentence = " ".join(rng.choice(ENGLISH) for _ in range(rng.randint(5, 15)))
        parts.append(sentence.capitalize() + rng.choice([". ", "? ", "! ", ".\n"]))
        length += len(parts[-1])
    return "".join(parts)


def check_text_at_inexact_cuts(nf_tokenize, work, rng):
    corpus = work / "english.txt"
    corpus.write_text(english(rng, 1 << 20).replace(". ", ".\n"))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(work / "english"),
                                   vocab_size=300, model_type="unigram", num_threads=2,
                                   minloglevel=2)
    model = work / "english.model"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    documents = []
    for _, piece in ADVERSARIAL:
        stretch, length = [], 0
        while length < (1 << 20) + (200 << 10):
            stretch.append(piece(rng))
            length += len(stretch[-1].encode())
        documents.append(english(rng, 2000) + "".join(stretch) + " " + english(rng, 2000))
    ours = nf_ids(nf_tokenize, model, documents, work)
    failures = []
    for (name, _), document, our_ids in zip(ADVERSARIAL, documents, ours):
        expected = sp.decode(sp.encode(document))
        decoded = sp.decode(our_ids)
        if decoded != expected:
            at = next((i for i, (a, b) in enumerate(zip(decoded, expected)) if a != b),
                      min(len(decoded), len(expected)))
            failures.append(f"{name}: from character {at}, {decoded[max(0, at - 20):at + 20]!r} "
                            f"where sentencepiece 0.2.3's ids give "
                            f"{expected[max(0, at - 20):at + 20]!r}")
    for failure in failures:
        print("FAIL", failure)
    assert not failures, f"{len(failures)} of {len(documents)} documents change at a cut"
    print(f"{len(documents)} adversarial documents of {min(map(len, documents))} to "
          f"{max(map(len, documents))} characters: the text of sentencepiece {spm.__version__}'s "
          f"ids")


def main():
    nf_tokenize = pathlib.Path(sys.argv[1])
    rng = random.Random(33)
    words = make_words(rng, 20000)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    with tempfile.TemporaryDirectory(prefix="nf_spm_reference_") as tmp:
        work = pathlib.Path(tmp)
        corpus = work / "corpus.txt"
        corpus.write_text(make_text(rng, words, weights, 3 << 20).replace(". ", ".\n"))
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(work / "m"),
                                       vocab_size=8000, model_type="unigram",
                                       num_threads=2, minloglevel=2)
        model = work / "m.model"
        sp = spm.SentencePieceProcessor(model_file=str(model))
        sizes = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 1 << 20]
        documents = [make_text(rng, words, weights, size) for size in sizes]
        ours = nf_ids(nf_tokenize, model, documents, work)
        # The tolerance: a chunk is at most 4 KiB here (every sentence ends in a space or a
        # newline, an exact cut), and its float running score S rounds in steps of S * 2^-23;
        # two paths compared late in a chunk may be off by a few such steps each. S is bounded
        # by the scores of 8 KiB of text at this corpus's score per byte.
        failures, ties = [], 0
        for size, document, our_ids in zip(sizes, documents, ours):
            reference = sp.encode(document)
            per_byte = sum(abs(sp.get_score(p)) for p in reference) / len(document.encode())
            tolerance = per_byte * 8192 * 2 ** -20
            for text, our_pieces, reference_pieces, score, reference_score in \
                    differing_stretches(our_ids, reference, sp):
                if abs(score - reference_score) <= tolerance:
                    ties += 1
                else:
                    failures.append(f"{size} bytes: {text!r} as {our_pieces} scores {score:.5f}, "
                                    f"sentencepiece 0.2.3's {reference_pieces} {reference_score:.5f}")
        for failure in failures[:10]:
            print("FAIL", failure)
        assert not failures, f"{len(failures)} stretches differ from sentencepiece 0.2.3's"
        print(f"{len(documents)} documents ({sum(sizes)} bytes): the ids of sentencepiece "
              f"{spm.__version__} but for {ties} stretches that score the same within rounding")
        check_text_at_inexact_cuts(nf_tokenize, work, random.Random(45))


if __name__ == "__main__":
    main()
