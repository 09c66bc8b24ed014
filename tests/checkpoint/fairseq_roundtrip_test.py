"""nf-ckpt export --format fairseq and nf-ckpt import, both ways, as a user runs them.

Three trained checkpoints: BEFORE_OUT_PROJ with sinusoidal positions and a tied head trained on
tensor 2 x pipeline 2 ranks (mpirun), AFTER_OUT_PROJ with learned positions and an untied head,
and a bf16 one. For each, the fairseq export is imported on four layouts (1x1x1, tp2 x pp2,
pp2 x dp2 with ZeRO-1, tp2 x dp2 with ZeRO-1), and:
  - import then export gives the exported file's bytes again;
  - export then import is bit-exact: every parameter of the imported checkpoint (its plain
    export) equals the original's bit for bit, except that a BEFORE_OUT_PROJ model's head scales
    are folded into out_proj (c_attn 1), exactly as the fairseq file holds them;
  - the imported checkpoint verifies, says its layout, and keeps the exported step.
A run on tp2 x pp2 continues training from an import (checkpoint.load): steps 31 on, the
learning-rate schedule from its first update (the optimizer is fresh). The command line's
mistakes are refused.

usage: fairseq_roundtrip_test.py NF_LAUNCH NF_CKPT MPIRUN...
"""
import json
import re
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fairseq_test_util import config_text, raw_tensors, run, train  # noqa: E402

MODELS = [
    # name, model fields, tensor parallel, pipeline parallel
    ("before_sinusoidal_tied_tp2_pp2", "normformer { scale_resids: true }", 2, 2),
    ("after_learned_untied",
     "positions: LEARNED tie_embeddings: false "
     "normformer { head_scale_placement: AFTER_OUT_PROJ }", 1, 1),
]
LAYOUTS = [
    ["--tp", "1", "--pp", "1", "--dp", "1"],
    ["--tp", "2", "--pp", "2", "--dp", "1"],
    ["--tp", "1", "--pp", "2", "--dp", "2", "--zero1"],
    ["--tp", "2", "--pp", "1", "--dp", "2", "--zero1"],
]


def check_roundtrips(nf_ckpt, work, name, checkpoints):
    exported = work / f"{name}.safetensors"
    run(nf_ckpt, "export", checkpoints, "--format", "fairseq", "--out", exported)
    folded, metadata = raw_tensors(exported)
    step = metadata["step"]
    original_plain = work / f"{name}.plain.safetensors"
    run(nf_ckpt, "export", checkpoints, "--format", "safetensors", "--out", original_plain)
    original, _ = raw_tensors(original_plain)
    before = "BEFORE_OUT_PROJ" in metadata["normformer.head_scale_placement"]
    for i, layout in enumerate(LAYOUTS):
        imported = work / f"{name}.imported{i}"
        run(nf_ckpt, "import", exported, "--out", imported, *layout)
        run(nf_ckpt, "verify", imported)
        inspected = run(nf_ckpt, "inspect", imported).stdout
        assert f"step {step}," in inspected, inspected
        assert (f"tensor_parallel {layout[1]} x pipeline_parallel {layout[3]} x data_parallel "
                f"{layout[5]}") in inspected, inspected

        again = work / f"{name}.again{i}.safetensors"
        run(nf_ckpt, "export", imported, "--format", "fairseq", "--out", again)
        assert again.read_bytes() == exported.read_bytes(), (name, layout, "export differs")

        plain = work / f"{name}.imported{i}.plain.safetensors"
        run(nf_ckpt, "export", imported, "--format", "safetensors", "--out", plain)
        params, _ = raw_tensors(plain)
        assert set(params) == set(original), set(params) ^ set(original)
        for tensor, value in params.items():
            is_folded = before and tensor.endswith((".c_attn", ".out_proj.weight"))
            want = folded[tensor] if is_folded else original[tensor]
            assert value == want, (name, layout, tensor)
    folds = sum(1 for t in original if before and t.endswith(".c_attn"))
    print(f"{name}: {len(LAYOUTS)} layouts, import -> export byte-identical, export -> import "
          f"bit-exact ({len(original)} tensors, {2 * folds} of them as folded)")
    return exported


def check_continued_training(nf_launch, nf_ckpt, mpirun, work, exported):
    imported = work / "continue.imported"
    run(nf_ckpt, "import", exported, "--out", imported, "--tp", "2", "--pp", "2")
    config = work / "continue.pbtxt"
    config.write_text(config_text("normformer { scale_resids: true }", steps=34,
                                  parallel="tensor_parallel: 2 pipeline_parallel: 2")
                      + f'checkpoint {{ load: "{imported}" }}')
    result = run(*mpirun, "-np", "4", nf_launch, "--config", config, "--run-dir",
                 work / "continued")
    resumed = f"resumed from {imported} at step 30 (0 samples consumed)"
    assert resumed in result.stdout, result.stdout
    assert "warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert "step 34/34" in result.stdout, result.stdout
    # The fresh optimizer's first update: the schedule's first (warmup) learning rate again.
    continued = [json.loads(line) for line in (work / "continued" / "log.jsonl").open()]
    original = [json.loads(line) for line in (work / MODELS[0][0] / "log.jsonl").open()]
    assert continued[0]["step"] == 31 and continued[0]["lr"] == original[0]["lr"], continued[0]
    print("a tp2 x pp2 run trained steps 31-34 from an imported checkpoint, warming up again")


def check_command_line(nf_ckpt, work, exported):
    refusals = [
        (["import", exported], "import needs --out DIR", 2),
        (["import", exported, "--out", work / "x", "--set", "model.d_model=8"],
         "--set needs --config", 2),
        (["import", exported, "--out", work / "x", "--step", "-1"], "--step takes", 2),
        (["export", work, "--format", "onnx", "--out", work / "x"],
         "export needs --format safetensors, fairseq or hf", 2),
        (["export", work, "--format", "hf", "--out", work / "x", "--model-type", "bert"],
         "--model-type takes auto, normformer or gpt2", 2),
        (["export", work, "--format", "hf", "--out", work / "x", "--tokenizer", "gpt2",
          "--vocab-file", work / "vocab.json"], "--tokenizer gpt2 takes --vocab-file and", 2),
        (["export", work, "--format", "hf", "--out", work / "x", "--spm-model", work / "m"],
         "need --tokenizer", 2),
        (["export", work, "--format", "fairseq", "--out", work / "x", "--max-shard-size", "9"],
         "--max-shard-size is for --format hf", 2),
        (["import", work / "missing.safetensors", "--out", work / "x"], "missing.safetensors", 1),
    ]
    for args, message, code in refusals:
        result = run(nf_ckpt, *args, check=False)
        assert result.returncode == code and message in result.stderr, (args, result.stderr)
        assert not (work / "x").exists()
    run(nf_ckpt, "import", exported, "--out", work / "stepped", "--step", "0")
    assert "step 0," in run(nf_ckpt, "inspect", work / "stepped").stdout
    check_bad_model_configs(nf_ckpt, work, exported)


def with_model_config(exported, out, text):
    """A copy of the safetensors file `exported` whose normformer.model_config metadata is `text`."""
    data = pathlib.Path(exported).read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    header["__metadata__"]["normformer.model_config"] = text
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    out.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + length:])
    return out


def check_bad_model_configs(nf_ckpt, work, exported):
    """A model config that cannot be built is refused by import, naming the field, in one line
    (before, max_seq_len 0 was imported and verified, and nf-eval died of SIGFPE on it)."""
    _, metadata = raw_tensors(exported)
    recorded = metadata["normformer.model_config"]
    cases = [
        ("max_seq_len: 0", "model.max_seq_len must be positive (got 0)"),
        ("max_seq_len: -1", "model.max_seq_len must be positive (got -1)"),
        ("dropout: 5", "model.dropout must be in [0, 1)"),
        ("num_layers: 1000000000", "model.num_layers must be at most 4096"),
        ("d_model: {", "not a model config in text format"),
    ]
    for change, message in cases:
        field = change.split(":")[0]
        text = re.sub(rf"\b{field}: \S+", change, recorded)
        assert text != recorded, (change, recorded)
        spoilt = with_model_config(exported, work / "spoilt.safetensors", text)
        result = run(nf_ckpt, "import", spoilt, "--out", work / "x", check=False)
        assert result.returncode == 1, (change, result.returncode, result.stderr)
        assert message in result.stderr, (change, result.stderr)
        assert len(result.stderr.splitlines()) == 1, (change, result.stderr)
        assert not (work / "x").exists(), change
    print(f"import refused {len(cases)} model configs that cannot be built, each in one line")


def main():
    nf_launch, nf_ckpt = sys.argv[1:3]
    mpirun = sys.argv[3:]
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        exported = {}
        for name, model, tp, pp in MODELS:
            checkpoints = train(nf_launch, work, name, model, mpirun=mpirun, tp=tp, pp=pp)
            exported[name] = check_roundtrips(nf_ckpt, work, name, checkpoints)
        bf16_config = work / "bf16.pbtxt"
        bf16_config.write_text(config_text(steps=5))
        run(nf_launch, "--config", bf16_config, "--set", "train.precision=BF16", "--run-dir",
            work / "bf16")
        bf16 = check_roundtrips(nf_ckpt, work, "bf16", work / "bf16" / "checkpoints")
        tensors, _ = raw_tensors(bf16)
        assert tensors["decoder.layers.0.fc1.weight"][0] == "BF16", "the model dtype is kept"
        check_continued_training(nf_launch, nf_ckpt, mpirun, work,
                                 exported["before_sinusoidal_tied_tp2_pp2"])
        check_command_line(nf_ckpt, work, exported["after_learned_untied"])


if __name__ == "__main__":
    main()
