"""`nf-ckpt export --format fairseq` of a masked LM computes, in fairseq's RoBERTa, what the
checkpoint computes here.

For each Pre-LN masked LM below (trained 30 steps at lr 1e-2 on masked samples; one on tensor 2 x
pipeline 2 ranks under mpirun), the export is loaded by fairseq's names into
fairseq_roberta_reference.py, a float64 numpy RoBERTa built from the arguments the file's
metadata records, strictly (every name the model has, nothing else); its logits for four token
sequences, some of their tokens <mask>, are compared with the project's own (checkpoint_logits,
fp32, one rank), and so is the masked-LM loss (fairseq's masked_lm criterion) at the masked
positions.

Tolerance: |ours - reference| <= 2e-5 x max(1, max |reference|), as for the decoder export
(fairseq_export_test.py): fp32 through 2 layers and the head, each op a few units of 6e-8
relative amplified by LayerNorm's 1/sigma; the loss, a mean of log-softmax terms of those logits,
within 4e-5 x max(1, loss).

What the export must get right is checked to matter: without encoder.sentence_encoder.version
fairseq drops the final LayerNorm (the strict load then fails); under roberta_base's own default
layernorm_embedding the strict load fails too (the args the metadata records are needed).
Refusals: the NormFormer operations, which fairseq's encoder layer lacks, are refused naming the
field, nothing written.

usage: fairseq_roberta_test.py NF_LAUNCH NF_CKPT CHECKPOINT_LOGITS MPIRUN...
"""
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fairseq_roberta_reference as reference  # noqa: E402
from fairseq_test_util import (VOCAB, expect_refused_export, load, project_logits,  # noqa: E402
                               run, token_sequences, train)

TOLERANCE = 2e-5
LOSS_TOLERANCE = 4e-5
MASK = VOCAB - 1  # model.mask_token -1: the last id

PRE_LN = ("objective: MASKED_LM "
          "normformer { scale_attn: false scale_heads: false scale_fc: false }")
CASES = [
    # name, model fields, tensor parallel, pipeline parallel
    ("learned_tied_unscaled", PRE_LN + " positions: LEARNED scale_embedding: false", 1, 1),
    ("sinusoidal_untied_gelu_tanh",
     PRE_LN + " tie_embeddings: false activation: GELU_TANH", 1, 1),
    ("learned_untied_scaled_tp2_pp2", PRE_LN + " positions: LEARNED tie_embeddings: false", 2, 2),
]


def masked_inputs(seed=7):
    """Token sequences with about 15% of their tokens replaced by <mask>, and the targets: the
    original token there, -1 elsewhere."""
    tokens = token_sequences(seed=seed)
    rng = np.random.default_rng(seed + 1)
    chosen = rng.random(tokens.shape) < 0.15
    chosen[:, 0] = True  # at least one per sequence
    inputs = np.where(chosen, MASK, tokens)
    return inputs, np.where(chosen, tokens, -1)


def build(tensors, args_text):
    return reference.Roberta(reference.parse_args(args_text), tensors)


def check_case(tools, work, name, model, tp, pp):
    nf_launch, nf_ckpt, checkpoint_logits, mpirun = tools
    checkpoints = train(nf_launch, work, name, model, mpirun=mpirun, tp=tp, pp=pp)
    exported = work / f"{name}.roberta.safetensors"
    run(nf_ckpt, "export", checkpoints, "--format", "fairseq", "--out", exported)
    tensors, metadata = load(exported)
    version = tensors["encoder.sentence_encoder.version"]
    assert version.dtype == np.float32 and list(version) == [3], version
    args = metadata["fairseq.roberta_args"]
    assert "arch='roberta'" in args and "layernorm_embedding=False" in args, metadata
    for key in ("normformer.model_config", "normformer.positions", "step"):
        assert key in metadata, (key, metadata)

    inputs, targets = masked_inputs()
    ours = project_logits(checkpoint_logits, checkpoints, inputs, work)
    expected = build(tensors, args).logits(inputs)
    worst = float(np.max(np.abs(ours - expected)))
    scale = max(1.0, float(np.max(np.abs(expected))))
    assert worst <= TOLERANCE * scale, (name, worst, scale)
    our_loss = reference.masked_lm_loss(ours, targets)
    fairseq_loss = reference.masked_lm_loss(expected, targets)
    assert abs(our_loss - fairseq_loss) <= LOSS_TOLERANCE * max(1.0, fairseq_loss), (
        name, our_loss, fairseq_loss)

    findings = []
    without_version = {k: v for k, v in tensors.items() if k != "encoder.sentence_encoder.version"}
    for what, state, args_text in [
            ("without encoder.sentence_encoder.version", without_version, args),
            ("with roberta_base's layernorm_embedding",
             tensors, args.replace("layernorm_embedding=False", ""))]:
        try:
            build(state, args_text)
        except ValueError as refused:
            findings.append(f"{what}: {str(refused)[:60]}...")
            continue
        raise AssertionError(f"{name}: {what} fairseq would still have loaded the file")
    print(f"{name}: max |logit difference| {worst:.3g} (logits up to {scale:.3g}); masked-LM "
          f"loss {our_loss:.6f} here, {fairseq_loss:.6f} in fairseq "
          f"({int((targets >= 0).sum())} masked tokens); strict load refused {'; '.join(findings)}")


def check_refusals(tools, work):
    nf_launch, nf_ckpt = tools[0], tools[1]
    refused = [
        ("normformer", "objective: MASKED_LM", "model.normformer.scale_attn"),
        ("head_scales_only",
         "objective: MASKED_LM normformer { scale_attn: false scale_fc: false }",
         "model.normformer.scale_heads"),
        ("relu_squared", PRE_LN + " activation: RELU_SQUARED", "model.activation"),
    ]
    for name, model, field in refused:
        checkpoints = train(nf_launch, work, name, model, steps=2)
        refusal = expect_refused_export(nf_ckpt, checkpoints, work / f"{name}.safetensors",
                                        field, "RoBERTa")
        print(f"refused {name}: {refusal}")


def main():
    nf_launch, nf_ckpt, checkpoint_logits = sys.argv[1:4]
    mpirun = sys.argv[4:]
    tools = (nf_launch, nf_ckpt, checkpoint_logits, mpirun)
    with tempfile.TemporaryDirectory() as work:
        for name, model, tp, pp in CASES:
            check_case(tools, pathlib.Path(work), name, model, tp, pp)
        check_refusals(tools, pathlib.Path(work))


if __name__ == "__main__":
    main()
