"""nf-ckpt export writes a safetensors file that Hugging Face's `safetensors` package reads.

Trains the tiny model two steps with nf-launch (tied and untied head), exports the final
checkpoint in f32 and f16, and checks with safetensors.numpy.load_file:
  - the names are the checkpoint's parameters (fairseq names), the vocabulary tables cut to the
    real vocabulary, every other shape the model's;
  - the values are the checkpoint's: each non-vocabulary tensor's sum and sum of squares equal
    those `nf-ckpt inspect --tensors` computes from the shard files (1e-9 relative: both sum the
    same fp32 values in double, nf-ckpt in order and numpy pairwise, which differ by ~1e-13);
  - the f16 export is the f32 export rounded to nearest even (numpy's astype(float16)).

usage: safetensors_export_test.py NF_LAUNCH NF_CKPT
"""
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

VOCAB = 37  # padded to 128 rows in the checkpoint


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def check(nf_launch, nf_ckpt, work, tie):
    config = work / "tiny.pbtxt"
    config.write_text(f"""
      model {{ num_layers: 2 d_model: 16 num_heads: 2 ffn_dim: 32 vocab_size: {VOCAB}
              max_seq_len: 8 tie_embeddings: {str(tie).lower()} }}
      train {{ seq_len: 8 micro_batch_size: 2 global_batch_size: 4 train_iters: 2
              lr_schedule {{ warmup_iters: 1 }} }}
    """)
    run_dir = work / f"run_tied_{tie}"
    run(nf_launch, "--config", str(config), "--run-dir", str(run_dir))
    checkpoints = run_dir / "checkpoints"
    f32 = work / f"model_{tie}_f32.safetensors"
    f16 = work / f"model_{tie}_f16.safetensors"
    run(nf_ckpt, "export", str(checkpoints), "--format", "safetensors", "--out", str(f32))
    run(nf_ckpt, "export", str(checkpoints), "--format", "safetensors", "--out", str(f16),
        "--dtype", "f16")

    inspected = {}
    for line in run(nf_ckpt, "inspect", str(checkpoints), "--tensors").splitlines():
        if line.startswith("decoder."):
            name, rest = line.split(" [", 1)
            shape, rest = rest.split("] ", 1)
            fields = rest.split()
            inspected[name] = ([int(d) for d in shape.split(", ")], float(fields[2]),
                               float(fields[4]))

    tensors = load_file(str(f32))
    assert set(tensors) == set(inspected), (set(tensors) ^ set(inspected))
    vocabulary_tables = {"decoder.embed_tokens.weight", "decoder.output_projection.weight"}
    assert ("decoder.output_projection.weight" in tensors) == (not tie)
    for name, array in tensors.items():
        shape, total, squares = inspected[name]
        assert array.dtype == np.float32, (name, array.dtype)
        if name in vocabulary_tables:
            assert list(array.shape) == [VOCAB, shape[1]], (name, array.shape, shape)
            continue
        assert list(array.shape) == shape, (name, array.shape, shape)
        values = array.astype(np.float64).ravel()
        got_total, got_squares = float(np.sum(values)), float(np.sum(values * values))
        for got, want in ((got_total, total), (got_squares, squares)):
            assert abs(got - want) <= 1e-9 * max(1.0, abs(want)), (name, got, want)

    halves = load_file(str(f16))
    assert set(halves) == set(tensors)
    for name, array in halves.items():
        assert array.dtype == np.float16, (name, array.dtype)
        assert np.array_equal(array, tensors[name].astype(np.float16)), name
    print(f"tie_embeddings={tie}: {len(tensors)} tensors read back")


def main():
    nf_launch, nf_ckpt = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        for tie in (True, False):
            check(nf_launch, nf_ckpt, pathlib.Path(work), tie)


if __name__ == "__main__":
    main()
