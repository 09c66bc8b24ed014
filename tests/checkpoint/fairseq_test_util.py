"""What the fairseq interop tests share: training tiny models with nf-launch (alone or under
mpirun), running nf-ckpt, and reading safetensors files with their metadata."""
import json
import pathlib
import subprocess

import numpy as np
from safetensors import safe_open

VOCAB = 37  # padded to 128 rows (256 under tensor parallelism 2) in checkpoints
SEQ = 16


def run(*args, check=True):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def config_text(model="", steps=30, parallel=""):
    """A tiny run: 2 layers, d 16, 2 heads (4 with tensor parallelism in mind), lr 1e-2 so that
    30 steps move the NormFormer scales well away from their initial 1."""
    return f"""
      model {{ num_layers: 2 d_model: 16 num_heads: 2 ffn_dim: 32 vocab_size: {VOCAB}
              max_seq_len: {SEQ} {model} }}
      train {{ seq_len: {SEQ} micro_batch_size: 2 global_batch_size: 4 train_iters: {steps}
              optimizer {{ lr: 1e-2 }} lr_schedule {{ warmup_iters: 2 }} }}
      parallel {{ {parallel} }}
    """


def train(nf_launch, work, name, model="", steps=30, mpirun=None, tp=1, pp=1):
    """Trains and returns the run's checkpoints directory; with mpirun, on tp x pp ranks."""
    work = pathlib.Path(work)
    config = work / f"{name}.pbtxt"
    parallel = f"tensor_parallel: {tp} pipeline_parallel: {pp}" if tp * pp > 1 else ""
    config.write_text(config_text(model, steps, parallel))
    command = [nf_launch, "--config", config, "--run-dir", work / name]
    if tp * pp > 1:
        command = list(mpirun) + ["-np", str(tp * pp)] + command
    run(*command)
    return work / name / "checkpoints"


def load(path):
    """(tensors by name as numpy arrays, metadata) of a safetensors file."""
    with safe_open(str(path), "np") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata() or {}


def token_sequences(count=4, seed=7):
    """[count, SEQ] ids of the real vocabulary without 1, which fairseq reads as padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB - 1, size=(count, SEQ))
    return np.where(ids >= 1, ids + 1, ids)


def raw_tensors(path):
    """(name -> (dtype, shape, bytes), metadata) of a safetensors file, read with the json module:
    any dtype (numpy has no bfloat16), compared bit for bit."""
    data = pathlib.Path(path).read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {})
    body = data[8 + length:]
    return {name: (entry["dtype"], tuple(entry["shape"]),
                   body[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items()}, metadata


def project_logits(checkpoint_logits, checkpoints, tokens, work):
    """The project's own fp32 logits [sequences, length, vocab] of `tokens` (checkpoint_logits,
    one rank), as float64."""
    work = pathlib.Path(work)
    tokens_file = work / "tokens.txt"
    np.savetxt(tokens_file, tokens, fmt="%d")
    out = work / "ours.npy"
    run(checkpoint_logits, checkpoints, tokens_file, out)
    return np.load(out).astype(np.float64)


def expect_refused_export(nf_ckpt, checkpoints, out, field, architecture):
    """`nf-ckpt export --format fairseq` refuses: exit 1, one line naming `field` and
    `architecture`, nothing written (nor its temporary). Returns that line."""
    result = run(nf_ckpt, "export", checkpoints, "--format", "fairseq", "--out", out, check=False)
    assert result.returncode == 1, (out, result.returncode, result.stderr)
    assert field in result.stderr and architecture in result.stderr, (out, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists() and not pathlib.Path(str(out) + ".tmp").exists(), out
    return result.stderr.strip()
