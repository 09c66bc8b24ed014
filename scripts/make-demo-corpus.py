#!/usr/bin/env python3
"""Builds the demo corpus: the English text of Debian's `fortunes` package as JSONL.

Each fortune (the files in /usr/share/games/fortunes separate them with lines holding a
single "%") becomes one document {"text": ...}. Files are read in sorted order, so the output
is the same on every machine with the same package version. Nothing of it is committed:
scripts/setup.sh installs the package and this script writes into corpora/ (git-ignored).

usage: scripts/make-demo-corpus.py [OUTPUT.jsonl]   (default corpora/demo/fortunes.jsonl)
"""
import json
import os
import sys
import tempfile

FORTUNES = "/usr/share/games/fortunes"


def documents(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        entry = []
        for line in f:
            if line.rstrip("\n") == "%":
                text = "".join(entry).strip()
                if text:
                    yield text
                entry = []
            else:
                entry.append(line)
        text = "".join(entry).strip()
        if text:
            yield text


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "corpora/demo/fortunes.jsonl"
    if not os.path.isdir(FORTUNES):
        sys.exit(f"make-demo-corpus: {FORTUNES} is missing; install the 'fortunes' package "
                 "(scripts/setup.sh does)")
    # The plain-text databases: not the .dat indexes, not the .u8 links to the same files.
    names = sorted(n for n in os.listdir(FORTUNES)
                   if "." not in n and os.path.isfile(os.path.join(FORTUNES, n)))
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    # A temporary of its own (mkstemp: created new, never through a link), renamed into place.
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(out_path) or ".",
                                     prefix=os.path.basename(out_path) + ".tmp-")
    count = size = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for name in names:
                for text in documents(os.path.join(FORTUNES, name)):
                    out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                    count += 1
                    size += len(text.encode("utf-8"))
        os.chmod(temporary, 0o644)
        os.replace(temporary, out_path)
    except BaseException:
        os.unlink(temporary)
        raise
    print(f"make-demo-corpus: {count} documents, {size / 1e6:.2f} MB of text -> {out_path}")


if __name__ == "__main__":
    main()
