#!/usr/bin/env python3
"""Writes seed inputs for idx_reader_fuzzer into the directory given as the only argument.

Each seed is a valid MMIDIDX pair in the fuzzer's input layout: a little-endian u16 with the
.bin size, the .idx, then the .bin. The fields are packed here from the format's specification
(data/indexed_dataset.h), independently of the C++ writer.
"""
import os
import struct
import sys


def pair(code, sequences, document_index):
    item = {8: ("<H", 2), 4: ("<i", 4)}[code]
    binary = b"".join(struct.pack(item[0], t) for s in sequences for t in s)
    pointers, offset = [], 0
    for s in sequences:
        pointers.append(offset)
        offset += len(s) * item[1]
    index = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(sequences), len(document_index))
    index += b"".join(struct.pack("<i", len(s)) for s in sequences)
    index += b"".join(struct.pack("<q", p) for p in pointers)
    index += b"".join(struct.pack("<q", d) for d in document_index)
    return struct.pack("<H", len(binary)) + index + binary


SEEDS = {
    "u16_one_per_document": pair(8, [[1, 2, 3], [65535], []], [0, 1, 2, 3]),
    "i32_one_per_document": pair(4, [[0x01020304, -1], [70000]], [0, 1, 2]),
    "u16_multi_sequence_documents": pair(8, [[5, 6], [7], [], [8, 9, 10]], [0, 2, 2, 4]),
    "i32_empty": pair(4, [], [0]),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
