"""A fairseq .pt checkpoint through scripts/fairseq-pt-to-safetensors.py and nf-ckpt import.

The .pt files are written by torch_zip_writer.py in PyTorch's zip format, laid out as fairseq
saves a checkpoint: {"args": an argparse.Namespace, "cfg", "model": the state dict,
"optimizer_history", "extra_state", "last_optimizer_state" with an int64 tensor}, the state dict
holding decoder.version, a tied head under both names on one storage, a weight stored transposed
(strides [1, out]), two biases sharing a storage at offsets, and a deprecated key fairseq ignores.
Checked:
  - without --skip-other-objects the converter refuses the Namespace, naming it, writing nothing;
  - with it, the safetensors file holds exactly the parameters of the model the .pt was made
    from, bit for bit (f32 and bf16), the tied head once;
  - nf-ckpt import takes it with the model from --config (and refuses it without), and the
    imported checkpoint exports to the same parameters;
  - pickles that name code (os.system) run nothing, with or without the flag; a file that is not
    a zip archive is refused.

usage: fairseq_pt_test.py NF_LAUNCH NF_CKPT SCRIPTS_DIR
"""
import argparse
import pathlib
import pickle
import sys
import tempfile
import zipfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import torch_zip_writer as tz  # noqa: E402
from fairseq_test_util import config_text, raw_tensors, run, train  # noqa: E402

CONVERTER = "fairseq-pt-to-safetensors.py"


def fairseq_checkpoint(tensors, path, d_model):
    """Writes `tensors` (name -> (dtype, shape, bytes), a fairseq export) as fairseq's .pt."""
    storages, state = [], []

    def add(name, code, shape, raw, parameter=True):
        storage, tensor = tz.contiguous(str(len(storages)), code, raw, shape, parameter)
        storages.append(storage)
        state.append((name, tensor))
        return tensor

    for name, (code, shape, raw) in tensors.items():
        if name == "decoder.layers.0.self_attn.out_proj.weight":
            # Stored as its transpose [in, out], viewed with strides [1, out].
            width = 2 if code != "F32" else 4
            matrix = np.frombuffer(raw, dtype=f"<u{width}").reshape(shape)
            storage = tz.Storage(str(len(storages)), code, matrix.T.copy().tobytes())
            storages.append(storage)
            state.append((name, tz.Tensor(storage, 0, list(shape), [1, shape[0]], True)))
        elif name == "decoder.layers.1.fc2.bias":
            # Shares the storage of layer 1's fc1 bias, after it.
            fc1_name, fc1 = next((n, t) for n, t in state if n == "decoder.layers.1.fc1.bias")
            joined = tz.Storage(str(len(storages)), code, fc1.storage.raw + raw)
            storages.append(joined)
            state[[n for n, _ in state].index(fc1_name)] = (
                fc1_name, tz.Tensor(joined, 0, fc1.size, fc1.stride, True))
            state.append((name, tz.Tensor(joined, fc1.storage.numel, list(shape), [1], True)))
        else:
            add(name, code, shape, raw, parameter=name != "decoder.version")
    if "decoder.output_projection.weight" not in tensors:  # tied: fairseq lists it too
        embed = dict(state)["decoder.embed_tokens.weight"]
        state.append(("decoder.output_projection.weight", embed))
    add("decoder.embed_positions._float_tensor", "F32", [0], b"", parameter=False)
    step_storage, step = tz.contiguous(str(len(storages)), "I64", np.int64(30).tobytes(), [],
                                       parameter=False)
    storages.append(step_storage)
    checkpoint = {
        "args": argparse.Namespace(arch="transformer_lm", decoder_embed_dim=d_model),
        "cfg": None,
        "model": tz.state_dict(state),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam", "num_updates": 30}],
        "extra_state": {"epoch": 1, "train_iterator": {"iterations_in_epoch": 5}},
        "last_optimizer_state": {"state": {0: {"step": step}}},
    }
    tz.save(checkpoint, path, storages)


def convert(scripts, pt, out, *flags):
    return run(sys.executable, pathlib.Path(scripts) / CONVERTER, pt, out, *flags, check=False)


def check_case(tools, work, name, model, dtype):
    nf_launch, nf_ckpt, scripts = tools
    checkpoints = train(nf_launch, work, name, model, steps=10)
    exported = work / f"{name}.safetensors"
    run(nf_ckpt, "export", checkpoints, "--format", "fairseq", "--out", exported, "--dtype", dtype)
    original, _ = raw_tensors(exported)
    pt = work / f"{name}.pt"
    fairseq_checkpoint(original, pt, 16)

    converted = work / f"{name}.converted.safetensors"
    refused = convert(scripts, pt, converted)
    assert refused.returncode == 1, refused
    assert "argparse.Namespace" in refused.stderr and "--skip-other-objects" in refused.stderr, \
        refused.stderr
    assert not converted.exists()
    # A link planted at the old temporary's name (OUT.tmp) is never written through.
    victim = work / f"{name}.victim"
    victim.write_text("precious")
    pathlib.Path(str(converted) + ".tmp").symlink_to(victim)
    result = convert(scripts, pt, converted, "--skip-other-objects")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious"
    tensors, metadata = raw_tensors(converted)
    assert list(tensors) == list(original), (list(tensors), list(original))
    for tensor, value in original.items():
        assert tensors[tensor] == value, (name, tensor)
    assert "producer" in metadata and "normformer.model_config" not in metadata

    imported = work / f"{name}.imported"
    without = run(nf_ckpt, "import", converted, "--out", imported, check=False)
    assert without.returncode == 1 and "give the model with --config" in without.stderr, without
    config = work / f"{name}.pbtxt"  # train() wrote the run's config
    run(nf_ckpt, "import", converted, "--out", imported, "--config", config, "--tp", "2")
    again = work / f"{name}.again.safetensors"
    run(nf_ckpt, "export", imported, "--format", "fairseq", "--out", again)
    reexported, again_metadata = raw_tensors(again)
    assert reexported == original, name
    assert again_metadata["step"] == "0"
    print(f"{name} ({dtype}): .pt -> safetensors -> import -> export gives the same "
          f"{len(original)} tensors; {result.stdout.strip()}")


def check_code_is_never_run(scripts, work):
    marker = work / "PWNED"
    # pickle protocol 0: os.system("touch PWNED"), then the result as the whole object.
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    evil = work / "evil.pt"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("archive/data.pkl", payload)
    refused = convert(scripts, evil, work / "evil.safetensors")
    assert refused.returncode == 1 and "os.system" in refused.stderr, refused
    skipped = convert(scripts, evil, work / "evil.safetensors", "--skip-other-objects")
    assert skipped.returncode == 1 and "found neither a checkpoint" in skipped.stderr, skipped
    assert not marker.exists() and not (work / "evil.safetensors").exists()
    # A checkpoint whose "model" is empty (one saved without its model): nothing is written.
    empty = work / "empty.pt"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"model": {}, "extra_state": {}}, protocol=2))
    refused = convert(scripts, empty, work / "empty.safetensors")
    assert refused.returncode == 1 and "state dict is empty" in refused.stderr, refused
    assert not (work / "empty.safetensors").exists()
    # The output is never the input, nor inside a checkpoint (it used to write either).
    checkpoint = work / "run" / "checkpoints" / "iter_0000005"
    checkpoint.mkdir(parents=True)
    (checkpoint / "manifest.pb").write_bytes(b"m")
    for out, message in [(empty, "is the checkpoint being converted"),
                         (checkpoint / "x.safetensors", "is inside checkpoint directory")]:
        before = empty.read_bytes()
        refused = convert(scripts, empty, out)
        assert refused.returncode == 1 and message in refused.stderr, refused
        assert empty.read_bytes() == before and not (checkpoint / "x.safetensors").exists()
    legacy = work / "legacy.pt"
    legacy.write_bytes(b"\x80\x02\x8a\x0alegacy torch format")
    refused = convert(scripts, legacy, work / "legacy.safetensors")
    assert refused.returncode == 1 and "not a PyTorch zip checkpoint" in refused.stderr, refused
    print("code named by a pickle is never run; an empty model and a non-zip file are refused")


def main():
    tools = tuple(sys.argv[1:4])
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        check_case(tools, work, "tied_before", "normformer { scale_resids: true }", "f32")
        check_case(tools, work, "untied_after_learned",
                   "positions: LEARNED tie_embeddings: false "
                   "normformer { head_scale_placement: AFTER_OUT_PROJ }", "bf16")
        check_code_is_never_run(tools[2], work)


if __name__ == "__main__":
    main()
