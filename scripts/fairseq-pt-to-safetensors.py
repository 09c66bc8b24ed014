#!/usr/bin/env python3
"""Converts a fairseq checkpoint (.pt) into the safetensors file `nf-ckpt import` takes.

    scripts/fairseq-pt-to-safetensors.py checkpoint_best.pt model.safetensors [--skip-other-objects]

Needs Python 3 and numpy; no torch. A .pt file is a pickle, and unpickling runs whatever code
the file names, so it is read with a restricted unpickler that executes nothing from the file:
it knows PyTorch's zip format (archive/data.pkl, the pickle; archive/data/<key>, each storage's
raw bytes; archive/byteorder) and rebuilds tensors itself from the storage references
('storage', torch.<Type>Storage, key, location, numel) and torch._utils._rebuild_tensor_v2 /
_rebuild_parameter calls (storage, offset, size, stride), as plain data. The only classes it
accepts are those and collections.OrderedDict, around dicts, lists, tuples, strings and
numbers. Anything else is refused, naming the class, unless --skip-other-objects: then it
stands for an inert placeholder (never called, never used) so that the parameters can be read
from a real fairseq checkpoint, whose training state holds argparse, omegaconf and fairseq
objects besides them.

The parameters are the checkpoint's "model" state dict (or the file itself, when it is one),
written under their fairseq names in their dtype (float32, float16, bfloat16). A tied head's
decoder.output_projection.weight, the same storage as decoder.embed_tokens.weight, is written
once (as fairseq's own loader, import takes the embedding); the deprecated keys fairseq's
SinusoidalPositionalEmbedding ignores on load are left out. fairseq's model config is not read:
give `nf-ckpt import` the model with --config.
"""
import argparse
import collections
import json
import os
import pathlib
import pickle
import re
import sys
import tempfile
import zipfile

import numpy as np

# torch.<Name>Storage -> (numpy dtype of the raw bytes, safetensors dtype); bfloat16 has no numpy
# dtype and is carried as its 16 bits.
STORAGE_TYPES = {
    "FloatStorage": (np.dtype("<f4"), "F32"),
    "HalfStorage": (np.dtype("<f2"), "F16"),
    "BFloat16Storage": (np.dtype("<u2"), "BF16"),
    "DoubleStorage": (np.dtype("<f8"), "F64"),
    "LongStorage": (np.dtype("<i8"), "I64"),
    "IntStorage": (np.dtype("<i4"), "I32"),
    "ShortStorage": (np.dtype("<i2"), "I16"),
    "CharStorage": (np.dtype("i1"), "I8"),
    "ByteStorage": (np.dtype("u1"), "U8"),
    "BoolStorage": (np.dtype("?"), "BOOL"),
}
PARAMETER_DTYPES = {"F32", "F16", "BF16"}  # what nf-ckpt import takes
# SinusoidalPositionalEmbedding._load_from_state_dict deletes these.
DEPRECATED_KEYS = ("decoder.embed_positions._float_tensor", "decoder.embed_positions.weights")


class ConversionError(Exception):
    pass


class StorageType:
    def __init__(self, name):
        self.name = name
        self.dtype, self.code = STORAGE_TYPES[name]


class StorageRef:
    """A storage of the archive: its record key and element type."""

    def __init__(self, storage_type, key, numel):
        self.type, self.key, self.numel = storage_type, key, numel


class TensorRef:
    """What torch._utils._rebuild_tensor_v2 would build: a strided view of a storage."""

    def __init__(self, storage, offset, size, stride):
        if not isinstance(storage, StorageRef):
            raise ConversionError("a tensor whose storage is not one of the archive's")
        self.storage, self.offset = storage, int(offset)
        self.size, self.stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)

    def same_view(self, other):
        return (self.storage.key, self.offset, self.size, self.stride) == (
            other.storage.key, other.offset, other.size, other.stride)


def rebuild_tensor(storage, offset, size, stride, *unused):  # requires_grad, hooks, metadata
    return TensorRef(storage, offset, size, stride)


def rebuild_parameter(data, *unused):  # requires_grad, hooks[, state]
    return data


class Placeholder:
    """An object of a class the converter does not read (--skip-other-objects): it takes any
    arguments and state and keeps them; nothing of the class named in the file runs."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state


def placeholder_class(module, name):
    return type(f"Placeholder[{module}.{name}]", (Placeholder,), {})


class RestrictedUnpickler(pickle.Unpickler):
    ALLOWED = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): rebuild_parameter,
    }

    def __init__(self, file, skip_other_objects):
        super().__init__(file)
        self.skip_other_objects = skip_other_objects

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_TYPES:
            return StorageType(name)
        if self.skip_other_objects:
            return placeholder_class(module, name)
        raise ConversionError(
            f"the checkpoint holds an object of {module}.{name}, which this converter does not "
            "load (it reads only tensors and the dicts and lists around them, and executes "
            "nothing from the file); --skip-other-objects reads the parameters beside it")

    def persistent_load(self, saved_id):
        if (not isinstance(saved_id, tuple) or len(saved_id) != 5 or saved_id[0] != "storage"
                or not isinstance(saved_id[1], StorageType)):
            raise ConversionError(f"an unknown persistent reference {saved_id!r:.200}")
        _, storage_type, key, _location, numel = saved_id
        return StorageRef(storage_type, str(key), int(numel))


def read_archive(path, skip_other_objects):
    """(the unpickled object, a function reading a storage's bytes by key)."""
    if not zipfile.is_zipfile(path):
        raise ConversionError(
            f"{path} is not a PyTorch zip checkpoint (torch.save's format since PyTorch 1.6); "
            "an older one can be re-saved by a PyTorch of today")
    archive = zipfile.ZipFile(path)
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise ConversionError(f"{path}: expected one <archive>/data.pkl, found {pickles}")
    prefix = pickles[0][:-len("data.pkl")]
    if prefix + "byteorder" in archive.namelist():
        order = archive.read(prefix + "byteorder").decode()
        if order != "little":
            raise ConversionError(f"{path}: byte order {order!r}, only little-endian is read")
    with archive.open(pickles[0]) as f:
        top = RestrictedUnpickler(f, skip_other_objects).load()

    def storage_bytes(storage):
        name = f"{prefix}data/{storage.key}"
        if name not in archive.namelist():
            raise ConversionError(f"{path}: storage {storage.key} has no record {name}")
        data = archive.read(name)
        need = storage.numel * storage.type.dtype.itemsize
        if len(data) < need:
            raise ConversionError(f"{path}: {name} holds {len(data)} bytes, its storage {need}")
        return data[:need]
    return top, storage_bytes


def state_dict_of(top):
    """fairseq's checkpoint dict keeps the parameters under "model"; a bare state dict is one."""
    if isinstance(top, dict) and isinstance(top.get("model"), dict):
        if not top["model"]:
            raise ConversionError("the checkpoint's \"model\" state dict is empty: no parameters "
                                  "to convert (a checkpoint saved without its model?)")
        return top["model"]
    if isinstance(top, dict) and top and all(isinstance(v, TensorRef) for v in top.values()):
        return top
    raise ConversionError("found neither a checkpoint with a \"model\" state dict nor a state dict")


def array_of(tensor, storage_bytes):
    """The tensor's values, contiguous, from its storage, offset and strides (all checked)."""
    flat = np.frombuffer(storage_bytes(tensor.storage), dtype=tensor.storage.type.dtype)
    if len(tensor.size) != len(tensor.stride) or any(s < 0 for s in tensor.size + tensor.stride):
        raise ConversionError("a tensor with an invalid size or stride")
    if all(s > 0 for s in tensor.size):
        last = tensor.offset + sum((s - 1) * st for s, st in zip(tensor.size, tensor.stride))
        if tensor.offset < 0 or last >= len(flat):
            raise ConversionError("a tensor reaching past its storage")
    view = np.lib.stride_tricks.as_strided(
        flat[tensor.offset:], shape=tensor.size,
        strides=tuple(st * flat.itemsize for st in tensor.stride), writeable=False)
    return np.ascontiguousarray(view)


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, safetensors dtype, shape, bytes)], in order."""
    header = {"__metadata__": metadata}
    offset = 0
    for name, code, shape, data in tensors:
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    # A temporary of its own (mkstemp: O_CREAT | O_EXCL, never through a link) renamed over
    # `path`, as the project's C++ writer (core/files/atomic_file.h) does; removed on failure.
    path = pathlib.Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text.encode())
            for _, _, _, data in tensors:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def check_out(source, out):
    """The rule of checkpoint/output_path.h for this tool's one output: not its input, and not
    inside a checkpoint (a directory holding manifest.pb or named iter_NNNNNNN[.tmp]) or a run's
    checkpoints/ (whose `latest` names one)."""
    out, source = pathlib.Path(out), pathlib.Path(source)
    if out.exists() and source.exists() and os.path.samefile(out, source):
        raise ConversionError(f"{out} is the checkpoint being converted: choose another output")
    resolved = out.resolve()
    for directory in resolved.parents:
        latest = directory / "latest"
        if (re.fullmatch(r"iter_\d{7}(\.tmp)?", directory.name) or
                (directory / "manifest.pb").exists() or
                (latest.is_file() and latest.stat().st_size <= 64 and
                 re.fullmatch(r"iter_\d{7}\s*", latest.read_text(errors="replace")))):
            raise ConversionError(f"{out} is inside checkpoint directory {directory}: writing "
                                  "there would damage it; choose a path outside every checkpoint")


def convert(source, out, skip_other_objects):
    check_out(source, out)
    top, storage_bytes = read_archive(source, skip_other_objects)
    state = state_dict_of(top)
    tensors, written, notes = [], [], []
    for name, value in state.items():
        if name in DEPRECATED_KEYS:
            notes.append(f"{name} left out (fairseq ignores it)")
            continue
        if not isinstance(value, TensorRef):
            raise ConversionError(f"state dict entry {name} is not a tensor")
        code = value.storage.type.code
        if code not in PARAMETER_DTYPES:
            raise ConversionError(f"{name} is {code}; parameters are F32, F16 or BF16")
        alias = next((other for other, ref in written if ref.same_view(value)), None)
        if alias is not None:
            notes.append(f"{name} is {alias} (one storage): written once")
            continue
        written.append((name, value))
        tensors.append((name, code, value.size, array_of(value, storage_bytes).tobytes()))
    write_safetensors(out, tensors, {"format": "pt", "producer": "fairseq-pt-to-safetensors",
                                     "source": pathlib.Path(source).name})
    return len(tensors), notes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="fairseq's .pt file")
    parser.add_argument("out", help="the safetensors file to write")
    parser.add_argument("--skip-other-objects", action="store_true",
                        help="read past objects of other classes as inert placeholders")
    args = parser.parse_args()
    try:
        count, notes = convert(args.checkpoint, args.out, args.skip_other_objects)
    except ConversionError as e:
        print(f"fairseq-pt-to-safetensors: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a damaged file: pickle's, zipfile's and numpy's own complaints
        print(f"fairseq-pt-to-safetensors: {args.checkpoint} is damaged or not a checkpoint "
              f"({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out}: {count} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
