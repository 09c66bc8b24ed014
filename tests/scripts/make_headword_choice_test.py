#!/usr/bin/python3
"""scripts/make-headword-choice on corpora written here. Checks that
  - only the held-out parts' entries become examples, the parts cut as data/splits.cc cuts them
    (split 2,1,1 of 6 documents: train [0, 3), validation [3, 4), test [4, 6): the boundary 4.5
    rounds half to even, to 4);
  - each example is WinoGrande's format: "_ definition", the entry's own "Headword, pos." as the
    answer, the other option a different held-out headword of the same part of speech;
  - entries that do not fit (brackets, a citation, too short, no period, a multi-word headword)
    are left out; the same seed gives the same bytes;
  - a corpus whose .idx counts other documents, a bad --split or --parts, and a corpus without
    any fitting entry are one-line errors, exit 2, nothing written.

usage: make_headword_choice_test.py REPO_ROOT
"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def check(condition, message):
    if not condition:
        print("FAIL: " + message)
        sys.exit(1)


def write_corpus(prefix, texts):
    with open(prefix + ".jsonl", "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")


def write_index(path, documents):
    """A Megatron-LM index header for `documents` one-token documents (the rest not needed)."""
    with open(path, "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, documents, documents + 1))


def main():
    script = os.path.join(sys.argv[1], "scripts", "make-headword-choice")
    with tempfile.TemporaryDirectory() as root:
        def run(*flags):
            return subprocess.run([script, *flags], capture_output=True, text=True)

        def read(path):
            with open(path, encoding="utf-8") as f:
                return [json.loads(line) for line in f]

        # Split 2,1,1 of six documents: the training part's entries never become examples.
        small = os.path.join(root, "small")
        write_corpus(small, [
            "Trained, n. An entry of the training part.",
            "Alsotrained, n. Another entry of the training part.",
            "Third, n. The last training document here.",
            "Validator, n. One who validates things.",
            "Tester, n. One who tests things.",
            "Examiner, n. One who examines things.",
        ])
        write_index(small + ".idx", 6)
        out = os.path.join(root, "small.choice.jsonl")
        made = run("--corpus", small, "--split", "2,1,1", "-o", out)
        check(made.returncode == 0, f"exit {made.returncode}: {made.stderr}")
        examples = read(out)
        answers = sorted(e["option" + e["answer"]] for e in examples)
        check(answers == ["Examiner, n.", "Tester, n.", "Validator, n."],
              f"the held-out entries are documents 3-5; got {answers}")
        only_test = os.path.join(root, "test-part.jsonl")
        check(run("--corpus", small, "--split", "2,1,1", "--parts", "test",
                  "-o", only_test).returncode == 0, "--parts test")
        check(sorted(e["option" + e["answer"]] for e in read(only_test))
              == ["Examiner, n.", "Tester, n."], "the test part is documents 4 and 5")

        # Entries of several parts of speech, and some that must be left out.
        mixed = os.path.join(root, "mixed")
        kept = {
            "Sugarless, a.": "Without sugar; free from sugar.",
            "Toothless, a.": "Having no teeth; without teeth.",
            "Foolishly, adv.": "In a foolish manner.",
            "Wisely, adv.": "In a wise manner; with wisdom.",
            "Attirer, n.": "One who attires.",
            "Motherhood, n.": "The state of being a mother.",
            "Disworth, v. t.": "To deprive of worth; to degrade.",
            "Unkindle, v. t.": "To put out a fire; to quench.",
        }
        left_out = [
            "Tonical, a. Tonic. [R.] --Sir T. Browne.",     # brackets and a citation
            "Ride, n. A journey.",                          # two words of definition
            "Sun dial, n. An instrument showing the time.",  # a headword of two words
            "Lamp, n. A vessel holding oil for light",       # no final period
            "Plural, a. A long definition " + "word " * 40 + "end.",  # over 30 words
        ]
        texts = [f"{head} {definition}" for head, definition in kept.items()] + left_out
        write_corpus(mixed, texts)
        out = os.path.join(root, "mixed.choice.jsonl")
        made = run("--corpus", mixed, "--split", "0,0,1", "-o", out)
        check(made.returncode == 0, f"exit {made.returncode}: {made.stderr}")
        examples = read(out)
        check(len(examples) == len(kept), f"{len(examples)} examples, expected {len(kept)}")
        for example in examples:
            check(example["sentence"].startswith("_ ") and example["answer"] in ("1", "2"),
                  f"format: {example}")
            right = example["option" + example["answer"]]
            wrong = example["option" + ("2" if example["answer"] == "1" else "1")]
            check(kept.get(right) == example["sentence"][2:], f"wrong answer: {example}")
            check(wrong in kept and wrong != right, f"the other option: {example}")
            check(wrong.split(", ", 1)[1] == right.split(", ", 1)[1],
                  f"the options' parts of speech differ: {example}")
        check({e["answer"] for e in examples} == {"1", "2"}, "the answer is always one option")
        again = os.path.join(root, "again.jsonl")
        check(run("--corpus", mixed, "--split", "0,0,1", "-o", again).returncode == 0, "rerun")
        with open(out, "rb") as a, open(again, "rb") as b:
            check(a.read() == b.read(), "the same seed gave other bytes")

        # One-line errors, nothing written.
        def fails(flags, expected):
            target = os.path.join(root, "never.jsonl")
            failed = run(*flags, "-o", target)
            check(failed.returncode == 2 and failed.stderr.count("\n") == 1
                  and expected in failed.stderr, f"{flags}: exit {failed.returncode}: "
                  f"{failed.stderr}")
            check(not os.path.exists(target), f"{flags}: wrote output")

        write_index(mixed + ".idx", len(texts) + 1)
        fails(["--corpus", mixed], "holds 14 documents but")
        os.remove(mixed + ".idx")
        fails(["--corpus", mixed, "--split", "1,x,1"], "--split")
        fails(["--corpus", mixed, "--parts", "test,heldout"], "--parts")
        fails(["--corpus", mixed, "--split", "1,0,0"], "no dictionary entry")
        fails(["--corpus", os.path.join(root, "missing")], "missing.jsonl")
    print("make-headword-choice: ok")


if __name__ == "__main__":
    main()
