"""nf-ckpt import of GPT-2 directories that transformers itself wrote, against transformers' logits.

A GPT2LMHeadModel with random parameters (every one, LayerNorms included, so that each is seen
in the logits) is saved with save_pretrained: float32 in one file (gelu_new) and in shards with
an index (gelu, max_shard_size small), and bfloat16. nf-ckpt import makes a checkpoint of each
(the shards on tensor 2 x pipeline 2), tests/checkpoint/checkpoint_logits_main.cc computes the
project's fp32 logits, and they must equal transformers' fp32 logits of the same parameters
within fp32 rounding:

    max |ours - transformers| <= 2^-16 * (1 + max |transformers|)

(2^-16 is 128 float32 ulps of a value of magnitude 1: both sides round at every operation, in
different orders, through two layers of attention, MLP, LayerNorm and the head's dot product
over d; the differences measured are about 5 such ulps.) A bfloat16 save must come out as bfloat16
parameters, and its logits are transformers' logits of the model in float32 with those
parameters. A directory holding only a pickle (pytorch_model.bin) is refused, and --config is
refused for a directory.

usage: hf_import_test.py NF_CKPT CHECKPOINT_LOGITS
"""
import pathlib
import sys
import tempfile

import numpy as np
import torch
import transformers

from fairseq_test_util import run  # the checkpoint tests' subprocess runner

TOLERANCE = 2.0 ** -16
VOCAB, POSITIONS = 64, 16


def random_gpt2(activation, seed):
    """A GPT2LMHeadModel whose every parameter is random (a LayerNorm's weight around 1)."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=32,
                                     n_layer=2, n_head=4, activation_function=activation,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            base = 1.0 if ".ln_" in name and name.endswith(".weight") else 0.0
            parameter.copy_(base + 0.3 * torch.randn_like(parameter))
    return model


def check_logits(tools, work, name, model, tokens, import_flags=()):
    nf_ckpt, checkpoint_logits = tools
    out = work / f"{name}.ckpt"
    run(nf_ckpt, "import", work / name, "--out", out, *import_flags)
    tokens_file = work / f"{name}.tokens"
    tokens_file.write_text("\n".join(" ".join(map(str, row)) for row in tokens) + "\n")
    run(checkpoint_logits, out, tokens_file, work / f"{name}.npy")
    ours = np.load(work / f"{name}.npy")
    with torch.no_grad():
        theirs = model.float()(torch.tensor(tokens)).logits.numpy()
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    difference = float(np.abs(ours - theirs).max())
    bound = TOLERANCE * (1.0 + float(np.abs(theirs).max()))
    assert difference <= bound, f"{name}: logits differ by {difference}, more than {bound}"
    print(f"{name}: logits within {difference:.3g} of transformers' (bound {bound:.3g})")
    return out


def main():
    tools = (pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
    tokens = np.random.default_rng(47).integers(0, VOCAB, size=(3, POSITIONS)).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        single = random_gpt2("gelu_new", seed=1)
        single.save_pretrained(work / "single")
        assert (work / "single" / "model.safetensors").exists()
        check_logits(tools, work, "single", single, tokens)

        sharded = random_gpt2("gelu", seed=2)
        sharded.save_pretrained(work / "sharded", max_shard_size="16KB")
        assert (work / "sharded" / "model.safetensors.index.json").exists()
        assert len(list((work / "sharded").glob("model-*.safetensors"))) > 1
        check_logits(tools, work, "sharded", sharded, tokens, ("--tp", "2", "--pp", "2"))

        half = random_gpt2("gelu_new", seed=3).to(torch.bfloat16)
        half.save_pretrained(work / "bf16")
        out = check_logits(tools, work, "bf16", half, tokens)
        listing = run(tools[0], "inspect", out, "--tensors").stdout
        params = [line for line in listing.splitlines() if line.startswith("decoder.")]
        assert params and all(" bf16 " in line for line in params), listing

        # Only a pickle: refused in one line, nothing written, the pickle never loaded.
        pickled = work / "pickled"
        pickled.mkdir()
        (pickled / "config.json").write_text((work / "single" / "config.json").read_text())
        torch.save(single.state_dict(), pickled / "pytorch_model.bin")
        refused = run(tools[0], "import", pickled, "--out", work / "from_pickle", check=False)
        assert refused.returncode == 1, refused
        assert "pytorch_model.bin, a pickle" in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert not (work / "from_pickle").exists()
        usage = run(tools[0], "import", work / "single", "--out", work / "x", "--config", "c",
                    check=False)
        assert usage.returncode == 2 and "config.json" in usage.stderr, usage
        print("a directory of pickles and --config for a directory are refused")


if __name__ == "__main__":
    main()
