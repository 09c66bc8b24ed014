#!/usr/bin/python3
"""scripts/make-experiment-corpus on small sources written here in the packages' formats: a
dictd index and gzipped data (with an entry two headwords share and one repeated verbatim), a
stand-in for bible-kjv's `bible` printing two chapters, and a fortunes directory with a .dat
file beside it. Checks the documents (markup gone, chapters without verse numbers, duplicates
dropped), that the order is shuffled but the same for the same seed, and that a bad index is
one line naming the file and line, exit 2, with nothing written.

usage: make_experiment_corpus_test.py REPO_ROOT
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

BASE64_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

ENTRIES = [
    ("Abandon", 'Abandon \\A*ban"don\\ ([.a]*b[a^]n"d[u^]n), v. t.\n'
                "   1. To cast or drive out; to banish. [Obs.]\n      [1913 Webster]\n\n"
                "   2. To give up {absolutely}; to forsake\n      entirely.\n      [1913 Webster]\n"),
    ("Odometer", "Odometer \\O*dom\"e*ter\\, n. [F. odom['e]tre.] An instrument.\n   [1913 Webster]\n"),
    ("Seldom", "Seldom \\Sel\"dom\\, a. Rare. [Archaic.]\n   [1913 Webster]\n"),
    # The same text again at another offset (the dictionary repeats WordNet entries).
    ("Infrequent", "Seldom \\Sel\"dom\\, a. Rare. [Archaic.]\n   [1913 Webster]\n"),
]

BIBLE = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void.

1 Kings 2

  1 Now the days of David drew nigh that he should die.
"""

FORTUNES = "A fortune.\n%\nAnother\n  fortune.\n%\nA fortune.\n%\n"


def number(value):
    digits = ""
    while True:
        digits = BASE64_DIGITS[value % 64] + digits
        value //= 64
        if value == 0:
            return digits


def write_sources(root):
    data = b""
    index = ["00-database-short\tA\tB"]
    for headword, text in ENTRIES:
        raw = text.encode("utf-8")
        index.append(f"{headword}\t{number(len(data))}\t{number(len(raw))}")
        if headword == "Abandon":  # a second headword for the same entry
            index.append(f"abandoning\t{number(len(data))}\t{number(len(raw))}")
        data += raw
    with open(os.path.join(root, "gcide.index"), "w", encoding="utf-8") as f:
        f.write("\n".join(index) + "\n")
    with gzip.open(os.path.join(root, "gcide.dict.dz"), "wb") as f:
        f.write(data)
    with open(os.path.join(root, "bible.txt"), "w", encoding="utf-8") as f:
        f.write(BIBLE)
    fortunes = os.path.join(root, "fortunes")
    os.makedirs(fortunes)
    with open(os.path.join(fortunes, "wisdom"), "w", encoding="utf-8") as f:
        f.write(FORTUNES)
    with open(os.path.join(fortunes, "wisdom.dat"), "wb") as f:
        f.write(b"\x00\x01binary index")


def run(repo, root, output, seed, index="gcide.index"):
    return subprocess.run(
        [os.path.join(repo, "scripts", "make-experiment-corpus"), "-o", output,
         "--seed", str(seed), "--gcide-index", os.path.join(root, index),
         "--gcide-data", os.path.join(root, "gcide.dict.dz"),
         "--bible-command", "cat " + os.path.join(root, "bible.txt"),
         "--fortunes-dir", os.path.join(root, "fortunes")],
        capture_output=True, text=True)


def read_texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def check(condition, message):
    if not condition:
        print("FAIL: " + message)
        sys.exit(1)


def main():
    repo = sys.argv[1]
    with tempfile.TemporaryDirectory() as root:
        write_sources(root)
        out = os.path.join(root, "out", "english.jsonl")
        result = run(repo, root, out, seed=1)
        check(result.returncode == 0, f"exit {result.returncode}: {result.stderr}")
        texts = read_texts(out)
        expected = {
            # Wrapped lines join; blank-line paragraphs stay lines.
            "Abandon, v. t. 1. To cast or drive out; to banish. [Obs.]\n"
            "2. To give up absolutely; to forsake entirely.",
            "Odometer, n. [F. odometre.] An instrument.",
            "Seldom, a. Rare. [Archaic.]",
            "Genesis 1\nIn the beginning God created the heaven and the earth.\n"
            "And the earth was without form, and void.",
            "1 Kings 2\nNow the days of David drew nigh that he should die.",
            "A fortune.",
            "Another\n  fortune.",
        }
        check(len(texts) == len(expected), f"{len(texts)} documents, expected {len(expected)}: "
              f"{texts}")
        check(set(texts) == expected, f"documents {sorted(set(texts) - expected)} not expected; "
              f"missing {sorted(expected - set(texts))}")
        check("gcide 3 (1 duplicates dropped)" in result.stdout, result.stdout)
        check("fortunes 2 (1 duplicates dropped)" in result.stdout, result.stdout)

        # The same seed gives the same bytes; other seeds other orders.
        again = os.path.join(root, "again.jsonl")
        check(run(repo, root, again, seed=1).returncode == 0, "second run failed")
        with open(out, "rb") as a, open(again, "rb") as b:
            check(a.read() == b.read(), "the same seed gave a different file")
        orders = set()
        for seed in range(2, 8):
            other = os.path.join(root, f"seed{seed}.jsonl")
            check(run(repo, root, other, seed=seed).returncode == 0, f"seed {seed} failed")
            orders.add(tuple(read_texts(other)))
        check(len(orders) > 1, "six seeds gave one order: the documents are not shuffled")

        # A malformed index line: one line naming it, exit 2, no output file.
        with open(os.path.join(root, "bad.index"), "w", encoding="utf-8") as f:
            f.write("Abandon\tA\tB\nbroken line without tabs\n")
        bad_out = os.path.join(root, "bad.jsonl")
        result = run(repo, root, bad_out, seed=1, index="bad.index")
        check(result.returncode == 2, f"bad index: exit {result.returncode}")
        check(result.stderr.count("\n") == 1 and "bad.index:2" in result.stderr, result.stderr)
        check(not os.path.exists(bad_out), "a failed run wrote its output")
    print("make-experiment-corpus: ok")


if __name__ == "__main__":
    main()
