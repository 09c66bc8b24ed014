"""Writes .pt files in PyTorch's zip format without torch, for the converter's tests.

torch.save (PyTorch >= 1.6) writes a zip archive, uncompressed: <archive>/data.pkl, a pickle
(protocol 2) of the object in which every storage is a persistent reference
('storage', torch.<Type>Storage, key, location, numel), <archive>/data/<key> holding each
storage's raw little-endian bytes, <archive>/byteorder ("little") and <archive>/version. A
tensor pickles as torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
requires_grad, backward_hooks), an nn.Parameter as torch._utils._rebuild_parameter(tensor,
requires_grad, backward_hooks), a state dict as a collections.OrderedDict with a _metadata
attribute. Here those globals are stand-ins registered under torch's names in this process's
sys.modules, so that pickle writes the same opcodes and references torch would.
"""
import collections
import io
import pickle
import sys
import types
import zipfile

import numpy as np

_torch = sys.modules.setdefault("torch", types.ModuleType("torch"))
_torch_utils = sys.modules.setdefault("torch._utils", types.ModuleType("torch._utils"))

DTYPE_STORAGES = {"F32": "FloatStorage", "F16": "HalfStorage", "BF16": "BFloat16Storage",
                  "I64": "LongStorage"}
for _name in DTYPE_STORAGES.values():
    _cls = type(_name, (), {"__module__": "torch"})
    setattr(_torch, _name, _cls)


def _rebuild_tensor_v2(*args):
    raise AssertionError("written, never called")


def _rebuild_parameter(*args):
    raise AssertionError("written, never called")


for _function in (_rebuild_tensor_v2, _rebuild_parameter):
    _function.__module__ = "torch._utils"
    setattr(_torch_utils, _function.__name__, _function)


class Storage:
    def __init__(self, key, code, raw):
        """raw: the storage's bytes; code: safetensors dtype (F32, F16, BF16, I64)."""
        self.key, self.code, self.raw = key, code, raw
        self.numel = len(raw) // {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}[code]


class Tensor:
    def __init__(self, storage, offset, size, stride, parameter=False):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.parameter = parameter

    def __reduce_ex__(self, protocol):
        tensor = (_rebuild_tensor_v2, (self.storage, self.offset, tuple(self.size),
                                       tuple(self.stride), False, collections.OrderedDict()))
        if not self.parameter:
            return tensor
        return (_rebuild_parameter, (Tensor(self.storage, self.offset, self.size, self.stride),
                                     True, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", getattr(_torch, DTYPE_STORAGES[obj.code]), obj.key, "cpu",
                    obj.numel)
        return None


def state_dict(entries):
    """An OrderedDict as nn.Module.state_dict() returns it, with its _metadata."""
    state = collections.OrderedDict(entries)
    state._metadata = collections.OrderedDict({"": {"version": 1}})
    return state


def save(obj, path, storages, archive="archive"):
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{archive}/data.pkl", buffer.getvalue())
        z.writestr(f"{archive}/byteorder", "little")
        for storage in storages:
            z.writestr(f"{archive}/data/{storage.key}", storage.raw)
        z.writestr(f"{archive}/version", "3\n")


def contiguous(key, code, raw, shape, parameter=True):
    """A storage holding one contiguous tensor, and the tensor."""
    storage = Storage(key, code, raw)
    stride = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    return storage, Tensor(storage, 0, list(shape), stride, parameter)
