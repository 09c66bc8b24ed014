"""`nf-ckpt export --format hf` of a masked LM in the real Hugging Face transformers.

deploy/configs/tiny-mlm.pbtxt, shrunk with --set to 2 layers, d 16, 2 heads, F 32, 37 ids and
16 positions, is trained 30 steps at lr 1e-2 on its masked synthetic samples (so that LayerNorm
gains, head scales and the head's bias have moved from their initial values) in four variants:

  run              attn heads fc resids placement positions   tied scale_emb activation  <mask>
  normformer_tied   on   on   on   -     before    learned     yes  no        GELU         36
  preln_baseline    -    -    -    -       -       learned     yes  no        GELU         36
  untied_resids     on   on   on   on    after     sinusoidal  no   yes       RELU_SQUARED  5
                    (first_position 0)
  tp2_pp2           on   on   on   on    before    learned     no   no        GELU_TANH    36
                    (trained on tensor parallel 2 x pipeline parallel 2 under mpirun)

(<mask> 36 is model.mask_token -1, the last id; untied_resids sets model.mask_token 5.) Each is
exported with --model-type auto: preln_baseline is, but for its objective, what GPT-2 computes,
and must still come out as the normformer form. Checked:
  1. the directory: config.json's fields against the run's resolved model config (objective
     masked_lm, mask_token_id, architectures NormFormerForMaskedLM, auto_map's
     AutoModelForMaskedLM and no AutoModelForCausalLM, use_cache false), no
     generation_config.json, the head's tensors lm_head.{dense,layer_norm}.*, lm_head.bias [V]
     and lm_head.weight exactly when untied.
  2. AutoModelForMaskedLM.from_pretrained(DIR, trust_remote_code=True) loads NormFormerForMaskedLM
     with no missing, unexpected or mismatched tensor, its projection the embedding exactly when
     tied; in eval mode, fp32, its logits on four 16-token sequences with about 15% <mask> ids
     (sdpa, transformers' default, and eager attention) equal the project's own
     (checkpoint_logits, fp32, one rank) within TOLERANCE, and so does its MaskedLM loss with
     labels (-100 where no token was chosen) the project's loss of the same targets
     (checkpoint_logits TARGETS.txt: the model's own cross-entropy) within LOSS_TOLERANCE.
  3. padding: the same sequences cut to 10 tokens and padded to 16 on the right or on the left
     (attention_mask 0 there) give, at their real tokens, the project's logits of the 10-token
     sequences: padding is neither attended nor counted in positions.
  4. a fresh model (from_config) starts as RoBERTa's init_bert_params: biases 0, LayerNorms 1 / 0,
     weights and embeddings N(0, 0.02).
  5. the tokenizer's <mask>: exports with the tokenizer flags of GPT-2 byte-level BPE (vocab.json /
     merges.txt trained here by tokenizers' BpeTrainer) and of SentencePiece (models trained here
     by the sentencepiece library), both trained on sentences of 18 words drawn from 18:
       tokenizer  ids  special tokens                                      exported with
       plain      36   BPE <|endoftext|> 0; SPM <unk> <s> </s> 0-2         normformer_tied
                       (<mask> 36: one id past the tokenizer's)
       small      28   as plain (<mask> 36: eight ids past the tokenizer's) normformer_tied
       own        37   BPE <|endoftext|> <s> </s> <pad> <sep> <mask> 0-5;  untied_resids
                       SPM <unk> <s> </s> <pad> <sep> <mask> 0-5           (<mask> 5: its own)
     AutoTokenizer.from_pretrained(DIR) has mask_token "<mask>" and mask_token_id config.json's
     mask_token_id; every other special id is the causal export's (a 1-step causal run exported
     with the same tokenizer files, whose tokenizer knows no mask_token and which
     hf_export_test.py checks against nf-tokenize); 40 texts without <mask> encode as the causal
     export's tokenizer encodes them, and 46 with <mask> (words of sentences replaced; <mask>
     first, last, alone, twice in a row, without spaces, after two) give the mask id for each
     <mask> and between them the causal ids of the text, the spaces before a <mask> taken into it
     as RoBERTa's <mask> takes them. fill-mask end to end (plain and own: small leaves model ids
     that its tokenizer cannot decode): transformers' pipeline("fill-mask") on the export's model
     and tokenizer gives, at the <mask> of each of 8 texts, the project's FILL_MASK_TOP best tokens
     for the tokenizer's ids (checkpoint_logits; each within fp32 rounding of the rank's logit)
     with the project's softmax as scores, the first exactly its argmax where the top two logits
     differ by more than MIN_MARGIN (at least half the texts; measured: all).
  Round trips: export, import on tp 2 x pp 2, export again give the same weight files byte for
     byte and the same config.json (untied_resids; tp2_pp2 sharded by --max-shard-size 4096).
  Refusals, one line, exit 1, nothing written: --model-type gpt2 naming model.objective; imports
     of a masked directory whose config.json lacks mask_token_id, has one outside the vocabulary,
     says objective causal_lm (the recorded model config disagrees, naming model.objective), or
     whose weights lack lm_head.bias (naming objective "masked_lm"); exports, each tokenizer kind,
     naming model.mask_token, with a tokenizer (30 ids) whose own <mask> is another id than
     normformer_tied's 36, or whose end-of-document token is untied_resids' <mask> id 5.

Tolerances. Both sides compute in fp32 in different orders (GEMM blocking, fused vs separate ops,
sdpa's softmax); each operation rounds to a few units of 6e-8 relative, amplified by the
LayerNorms' 1/sigma, here one more than the causal head's (the head's own LayerNorm). Measured:
at most 6e-7 absolute on logits up to ~2 (printed per variant), so TOLERANCE = 2e-5 x max(1,
max |logits|) leaves a factor of ~60. What mistakes would give, measured on normformer_tied's
sequences: a causal mask 1.7e-2, positions numbered one off 3.3e-3, the head's bias left out
0.14, but the head's GELU computed as GELU_TANH only 5.3e-5 (the two differ by 4.7e-4 at most):
config.json's fields are therefore checked against the resolved config as well. The loss is a
mean of log-softmax terms of those logits: LOSS_TOLERANCE = 4e-5 x max(1, loss), as in
fairseq_roberta_test.py (measured: at most 4.8e-7).

usage: hf_masked_lm_test.py NF_LAUNCH NF_CKPT CHECKPOINT_LOGITS TINY_MLM_CONFIG MPIRUN...
"""
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_export_test  # noqa: E402
from fairseq_test_util import run  # noqa: E402

TOLERANCE = 2e-5
LOSS_TOLERANCE = 4e-5
VOCAB = 37
SEQ = 16
SHORT = 10  # the padding check's real tokens
MASK = "<mask>"
EOT = "<|endoftext|>"
# fill-mask's top token is compared exactly where the project's top two logits differ by more
# (~170 times the logits' difference, 6e-7; else the two sides might break a near tie
# differently), its scores, probabilities of ~0.03, within SCORE_TOLERANCE of the project's
# softmax (measured: at most 1.5e-8; another position's probabilities differ from the <mask>'s
# by 3.3e-5 and more).
MIN_MARGIN = 1e-4
SCORE_TOLERANCE = 1e-6
FILL_MASK_TOP = 5

SHRINK = {
    "model.num_layers": 2, "model.d_model": 16, "model.num_heads": 2, "model.ffn_dim": 32,
    "model.vocab_size": VOCAB, "model.max_seq_len": SEQ, "train.seq_len": SEQ,
    "train.micro_batch_size": 2, "train.global_batch_size": 4, "train.train_iters": 30,
    "train.optimizer.lr": 1e-2, "train.lr_schedule.warmup_iters": 2,
}
OFF = {f"model.normformer.{s}": "false" for s in ("scale_attn", "scale_heads", "scale_fc",
                                                  "scale_resids")}
VARIANTS = [
    # name, --set overrides of tiny-mlm.pbtxt, tensor parallel, pipeline parallel
    ("normformer_tied", {}, 1, 1),
    ("preln_baseline", OFF, 1, 1),
    ("untied_resids", {"model.normformer.scale_resids": "true",
                       "model.normformer.head_scale_placement": "AFTER_OUT_PROJ",
                       "model.positions": "SINUSOIDAL", "model.first_position": 0,
                       "model.tie_embeddings": "false", "model.scale_embedding": "true",
                       "model.activation": "RELU_SQUARED", "model.mask_token": 5}, 1, 1),
    ("tp2_pp2", {"model.normformer.scale_resids": "true", "model.tie_embeddings": "false",
                 "model.activation": "GELU_TANH"}, 2, 2),
]


class Tools:
    def __init__(self, argv):
        self.nf_launch, self.nf_ckpt, self.checkpoint_logits, self.config = argv[:4]
        self.mpirun = argv[4:]


def train(tools, work, name, overrides, tp, pp):
    sets = {**SHRINK, **overrides}
    if tp * pp > 1:
        sets.update({"parallel.tensor_parallel": tp, "parallel.pipeline_parallel": pp})
    command = [tools.nf_launch, "--config", tools.config, "--run-dir", work / name]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    if tp * pp > 1:
        command = list(tools.mpirun) + ["-np", str(tp * pp)] + command
    run(*command)
    return work / name / "checkpoints"


def resolved_model(run_dir):
    """The model section of the run's resolved config.pbtxt (every field named) as a dict."""
    text = (run_dir / "config.pbtxt").read_text().split("\ntrain {")[0]
    return dict(re.findall(r"(\w+): (\S+)", text))


def mask_id(model):
    return VOCAB - 1 if int(model["mask_token"]) == -1 else int(model["mask_token"])


def masked_inputs(mask, seed=7):
    """Four [SEQ] sequences of random ids, about 15% of them (at least the first of each)
    replaced by <mask>, and the targets: the original id there, -1 elsewhere."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(4, SEQ))
    chosen = rng.random(tokens.shape) < 0.15
    chosen[:, 0] = True
    return np.where(chosen, mask, tokens), np.where(chosen, tokens, -1)


def project(tools, checkpoints, tokens, work, name, targets=None):
    """The project's fp32 logits [n, S, V] (float64 here) and, with targets, its loss: the mean
    cross-entropy at the targets, as the model computes it in training."""
    tokens_file = work / f"{name}.tokens.txt"
    np.savetxt(tokens_file, tokens, fmt="%d")
    out = work / f"{name}.logits.npy"
    args = [tools.checkpoint_logits, checkpoints, tokens_file, out]
    if targets is not None:
        np.savetxt(work / f"{name}.targets.txt", targets, fmt="%d")
        args.append(work / f"{name}.targets.txt")
    stdout = run(*args).stdout.split()
    loss = None
    if targets is not None:
        assert stdout[0] == "loss_sum" and stdout[2] == "tokens", stdout
        assert int(stdout[3]) == int((targets >= 0).sum()), stdout
        loss = float(stdout[1]) / int(stdout[3])
    return np.load(out).astype(np.float64), loss


def export(tools, checkpoints, out, *flags):
    run(tools.nf_ckpt, "export", checkpoints, "--format", "hf", "--out", out, *flags)
    return out


def expected_config(model):
    """What config.json holds for the masked LM (docs/checkpoints.md "Hugging Face"): the causal
    normformer form's fields with the masked LM's architecture, objective and mask id."""
    expected = hf_export_test.expected_config(model, "normformer")
    expected.update({"architectures": ["NormFormerForMaskedLM"], "objective": "masked_lm",
                     "mask_token_id": mask_id(model), "use_cache": False})
    return expected


def check_directory(hf_dir, model, name):
    config = json.loads((hf_dir / "config.json").read_text())
    expected = expected_config(model)
    wrong = {key: (config.get(key), value) for key, value in expected.items()
             if not (config.get(key) == value or (isinstance(value, float) and
                                                  abs(config.get(key) - value) <= 1e-6 * value))}
    assert not wrong, (name, "config.json (has, expected)", wrong)
    assert config["auto_map"] == {
        "AutoConfig": "configuration_normformer.NormFormerConfig",
        "AutoModel": "modeling_normformer.NormFormerModel",
        "AutoModelForMaskedLM": "modeling_normformer.NormFormerForMaskedLM"}, config["auto_map"]
    files = sorted(p.name for p in hf_dir.iterdir())
    assert "generation_config.json" not in files, (name, files)  # a masked LM does not generate
    assert [f for f in files if f.endswith(".py")] == ["configuration_normformer.py",
                                                       "modeling_normformer.py"], files
    with safe_open(str(hf_dir / "model.safetensors"), "np") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    d = int(model["d_model"])
    head = {"lm_head.dense.weight": (d, d), "lm_head.dense.bias": (d,),
            "lm_head.layer_norm.weight": (d,), "lm_head.layer_norm.bias": (d,),
            "lm_head.bias": (VOCAB,)}
    if model["tie_embeddings"] == "false":
        head["lm_head.weight"] = (VOCAB, d)
    assert {k: v for k, v in shapes.items() if k.startswith("lm_head.")} == head, (name, shapes)
    return config


def load(hf_dir, **kwargs):
    """NormFormerForMaskedLM in eval mode; asserts that every tensor loaded and none was left."""
    import transformers
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(
        hf_dir, trust_remote_code=True, output_loading_info=True, **kwargs)
    problems = {key: value for key, value in info.items() if value}
    assert not problems, (hf_dir, problems)
    assert type(model).__name__ == "NormFormerForMaskedLM", type(model)
    return model.eval()


def forward(model, tokens, attention_mask=None, labels=None):
    import torch
    kwargs = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.tensor(attention_mask)
    if labels is not None:
        kwargs["labels"] = torch.tensor(np.where(labels >= 0, labels, -100))
    with torch.no_grad():
        out = model(torch.tensor(tokens), **kwargs)
    return out.logits.double().numpy(), (None if out.loss is None else float(out.loss))


def check_padding(tools, work, name, checkpoints, model, tokens):
    """Right and left padding to SEQ with attention_mask 0: the real tokens' logits are those of
    the unpadded SHORT-token sequences."""
    short = tokens[:, :SHORT]
    ours, _ = project(tools, checkpoints, short, work, f"{name}.short")
    pad = np.zeros((len(short), SEQ - SHORT), dtype=short.dtype)
    ones, zeros = np.ones_like(short), np.zeros_like(pad)
    worst = 0.0
    for side, padded, mask, real in (
            ("right", np.hstack([short, pad]), np.hstack([ones, zeros]), slice(0, SHORT)),
            ("left", np.hstack([pad, short]), np.hstack([zeros, ones]), slice(SEQ - SHORT, SEQ))):
        theirs, _ = forward(model, padded, attention_mask=mask)
        difference = float(np.max(np.abs(theirs[:, real] - ours)))
        assert difference <= TOLERANCE * max(1.0, float(np.max(np.abs(ours)))), (
            name, side, difference)
        worst = max(worst, difference)
    return worst


def check_variant(tools, work, name, overrides, tp, pp):
    checkpoints = train(tools, work, name, overrides, tp, pp)
    model_fields = resolved_model(work / name)
    assert model_fields["objective"] == "MASKED_LM", model_fields
    hf_dir = export(tools, checkpoints, work / f"{name}.hf")  # --model-type auto
    config = check_directory(hf_dir, model_fields, name)
    tokens, targets = masked_inputs(mask_id(model_fields))
    ours, our_loss = project(tools, checkpoints, tokens, work, name, targets)
    scale = max(1.0, float(np.max(np.abs(ours))))
    results = []
    for attention in ("sdpa", "eager"):
        model = load(hf_dir, attn_implementation=attention)
        embedding = model.model.embed_tokens.weight
        assert (model.lm_head.weight.data_ptr() == embedding.data_ptr()) == \
            config["tie_word_embeddings"], name
        theirs, loss = forward(model, tokens, labels=targets)
        worst = float(np.max(np.abs(theirs - ours)))
        assert worst <= TOLERANCE * scale, (name, attention, worst, scale)
        assert abs(loss - our_loss) <= LOSS_TOLERANCE * max(1.0, our_loss), (name, loss, our_loss)
        padding = check_padding(tools, work, name, checkpoints, model, tokens)
        results.append(f"{attention} {worst:.2g} (padded {padding:.2g})")
    print(f"{name}: max |transformers - project| logit {', '.join(results)}, logits up to "
          f"{scale:.3g}; MaskedLM loss {loss:.6f}, project {our_loss:.6f} (|difference| "
          f"{abs(loss - our_loss):.2g}) at {int((targets >= 0).sum())} masked positions",
          flush=True)
    return {"checkpoints": checkpoints, "hf_dir": hf_dir, "config": config}


# ---- the tokenizer's <mask> --------------------------------------------------------------------

WORDS = "the cat sat on mat a dog ate hat bat and rat that is fat man ran can".split()
# name: (BpeTrainer's vocab_size and special tokens (ids 0, 1, ...), sentencepiece's trainer
# arguments). "refused" has its end-of-document token at id 5, untied_resids' <mask>, and its own
# <mask> at another id than normformer_tied's 36.
TOKENIZERS = {
    "plain": ((36, [EOT]), {"vocab_size": 36}),
    "small": ((28, [EOT]), {"vocab_size": 28}),
    "own": ((VOCAB, [EOT, "<s>", "</s>", "<pad>", "<sep>", MASK]),
            {"vocab_size": VOCAB, "pad_id": 3, "user_defined_symbols": ["<sep>", MASK]}),
    "refused": ((30, ["<s>", "</s>", "<pad>", "<sep>", MASK, EOT]),
                {"vocab_size": 30, "eos_id": 5, "user_defined_symbols": [MASK]}),
}
# The masked runs exported with each tokenizer (model.mask_token -1: 36; untied_resids: 5), and
# whether fill-mask runs: not where the model has ids that the tokenizer cannot decode.
WITH_TOKENIZER = [("normformer_tied", "plain", True), ("normformer_tied", "small", False),
                  ("untied_resids", "own", True)]
FILL_MASK_TEXTS = ["the cat <mask> on the mat", "a dog <mask> the hat", "<mask> man ran",
                   "that fat rat <mask>", "the man <mask> a bat", "is <mask> can",
                   "a hat and <mask> dog", "the <mask> sat on a mat"]


def sentences(count, seed=3):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=18)) for _ in range(count)]


def tokenizer_files(work):
    """{(kind, name): tokenizer flags} for kind "bpe" and "spm" and each of TOKENIZERS."""
    import sentencepiece
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    texts = sentences(300, seed=0)
    flags = {}
    for name, ((bpe_size, specials), spm_arguments) in TOKENIZERS.items():
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=bpe_size, special_tokens=specials, show_progress=False))
        (work / f"bpe_{name}").mkdir()
        bpe.model.save(str(work / f"bpe_{name}"))
        flags["bpe", name] = ["--tokenizer", "gpt2", "--vocab-file",
                              work / f"bpe_{name}" / "vocab.json", "--merges-file",
                              work / f"bpe_{name}" / "merges.txt"]
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_prefix=str(work / f"spm_{name}"),
            minloglevel=2, num_threads=1, **spm_arguments)
        flags["spm", name] = ["--tokenizer", "sentencepiece", "--spm-model",
                              work / f"spm_{name}.model"]
    return flags


def masked_texts():
    """Texts with <mask>: words of sentences replaced (about 15%, at least one), and the edges:
    <mask> first, last, alone, twice in a row, without spaces around it, after two spaces."""
    rng = np.random.default_rng(5)
    texts = []
    for sentence in sentences(40):
        words = sentence.split()
        chosen = rng.random(len(words)) < 0.15
        chosen[rng.integers(len(words))] = True
        texts.append(" ".join(MASK if c else w for w, c in zip(words, chosen)))
    return texts + [f"{MASK} cat", f"the {MASK}", MASK, f"a {MASK}{MASK} b", f"the cat{MASK}on",
                    f"the  {MASK} mat"]


def with_masks(causal, text, mask_id):
    """What a mask token that takes in the spaces before it gives: each part of the text between
    <mask>s as the causal tokenizer encodes it (a part before a <mask> without its trailing
    spaces), the mask id between the parts."""
    parts = text.split(MASK)
    ids = []
    for i, part in enumerate(parts):
        if i:
            ids.append(mask_id)
        ids += causal(part if i + 1 == len(parts) else part.rstrip(),
                      add_special_tokens=False)["input_ids"]
    return ids


def check_fill_mask(tools, work, label, checkpoints, hf_dir, tokenizer):
    """pipeline("fill-mask") at the <mask> against the project's logits for the tokenizer's ids:
    its FILL_MASK_TOP tokens are the project's best (within fp32 rounding of its logits), with the
    project's softmax as scores, the first the project's argmax where no near tie hides it.
    Returns how many texts compared the argmax exactly."""
    from transformers import pipeline
    fill = pipeline("fill-mask", model=load(hf_dir), tokenizer=tokenizer)
    exact = 0
    for i, text in enumerate(FILL_MASK_TEXTS):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) <= SEQ and ids.count(tokenizer.mask_token_id) == 1, (label, text, ids)
        ours, _ = project(tools, checkpoints, np.array([ids]), work, f"{label}.fill{i}")
        logits = ours[0, ids.index(tokenizer.mask_token_id)]
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        best = np.sort(logits)[::-1]
        slack = 2 * TOLERANCE * max(1.0, float(np.max(np.abs(logits))))
        predicted = fill(text, top_k=FILL_MASK_TOP)
        for rank, p in enumerate(predicted):
            assert logits[p["token"]] >= best[rank] - slack, (label, text, rank, p, best)
            assert abs(p["score"] - probabilities[p["token"]]) <= SCORE_TOLERANCE, (
                label, text, p, probabilities[p["token"]])
        if best[0] - best[1] > MIN_MARGIN:
            assert predicted[0]["token"] == int(np.argmax(logits)), (label, text, predicted)
            exact += 1
    assert exact >= len(FILL_MASK_TEXTS) // 2, (label, exact)
    return exact


def check_tokenizers(tools, work, cases):
    """The exported tokenizer's <mask> (5. above), against a causal export's tokenizer."""
    from transformers import AutoTokenizer
    flags = tokenizer_files(work)
    causal = train(tools, work, "causal", {"model.objective": "CAUSAL_LM",
                                           "train.train_iters": 1,
                                           "train.lr_schedule.warmup_iters": 1}, 1, 1)
    plain_texts, texts = sentences(40, seed=4), masked_texts()
    for name, tokenizer, fill_mask in WITH_TOKENIZER:
        for kind in ("bpe", "spm"):
            label = f"{name}.{kind}_{tokenizer}"
            checkpoints = cases[name]["checkpoints"]
            hf_dir = export(tools, checkpoints, work / f"{label}.hf", *flags[kind, tokenizer])
            theirs = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
            reference = AutoTokenizer.from_pretrained(
                export(tools, causal, work / f"causal.{kind}_{tokenizer}.hf",
                       *flags[kind, tokenizer]), trust_remote_code=True)
            assert reference.mask_token is None, (label, reference.mask_token)
            mask_id = json.loads((hf_dir / "config.json").read_text())["mask_token_id"]
            assert (theirs.mask_token, theirs.mask_token_id) == (MASK, mask_id), (
                label, theirs.mask_token, theirs.mask_token_id, mask_id)
            for special in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"):
                assert getattr(theirs, special) == getattr(reference, special), (label, special)
            for text in plain_texts:
                assert theirs(text, add_special_tokens=False)["input_ids"] == reference(
                    text, add_special_tokens=False)["input_ids"], (label, text)
            for text in texts:
                ids = theirs(text, add_special_tokens=False)["input_ids"]
                expected = with_masks(reference, text, mask_id)
                assert ids == expected, (label, text, ids, expected)
            filled = ""
            if fill_mask:
                exact = check_fill_mask(tools, work, label, checkpoints, hf_dir, theirs)
                filled = (f"; fill-mask's top {FILL_MASK_TOP} and scores == the project's on "
                          f"{len(FILL_MASK_TEXTS)} texts, the top token its argmax exactly on "
                          f"{exact}")
            print(f"{label}: mask_token {theirs.mask_token!r} id {theirs.mask_token_id} == "
                  f"config.json's ({len(reference)} tokenizer ids); {len(plain_texts)} texts as "
                  f"the causal export's tokenizer, {len(texts)} with <mask> as it with the mask "
                  f"id between{filled}", flush=True)
    return flags


def check_fresh_init(hf_dir):
    """A model made from the config alone starts as init_bert_params (docs/design.md 4.8)."""
    import torch
    import transformers
    config = transformers.AutoConfig.from_pretrained(hf_dir, trust_remote_code=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForMaskedLM.from_config(config, trust_remote_code=True)
    stds = []
    for name, p in model.named_parameters():
        if "layer_norm" in name or "attn_ln" in name or "ffn_layernorm" in name:
            expected = 1.0 if name.endswith(".weight") else 0.0
            assert torch.all(p == expected), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        elif name.endswith("c_attn") or name.endswith("w_resid"):
            assert torch.all(p == 1), name
        else:  # weights and embeddings: N(0, 0.02); 256 to 1024 draws each
            stds.append(float(p.detach().std()))
            assert 0.014 < stds[-1] < 0.026, (name, stds[-1])
    print(f"fresh NormFormerForMaskedLM: biases 0, LayerNorms 1 / 0, weight stds "
          f"{min(stds):.4f} to {max(stds):.4f} (init_bert_params: 0.02)", flush=True)


def check_round_trip(tools, work, name, case, *flags):
    first = export(tools, case["checkpoints"], work / f"{name}.trip1.hf", *flags)
    run(tools.nf_ckpt, "import", first, "--tp", 2, "--pp", 2, "--out", work / f"{name}.imported")
    second = export(tools, work / f"{name}.imported", work / f"{name}.trip2.hf", *flags)
    files = sorted(p.name for p in first.iterdir() if p.name.endswith(".safetensors"))
    assert files == sorted(p.name for p in second.iterdir() if p.name.endswith(".safetensors"))
    for file in files:
        assert (first / file).read_bytes() == (second / file).read_bytes(), (name, file)
    assert (first / "config.json").read_text() == (second / "config.json").read_text(), name
    print(f"{name}: export, import on tp 2 x pp 2, export: the same {len(files)} weight file(s) "
          f"byte for byte and config.json {' '.join(map(str, flags))}", flush=True)


def refuse(args, out, expected):
    before = sorted(p.name for p in out.parent.iterdir())
    result = run(*args, check=False)
    assert result.returncode == 1, (args, result.returncode, result.stderr)
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
        expected, result.stderr)
    assert sorted(p.name for p in out.parent.iterdir()) == before, (out, "left something")
    print(f"refused: {result.stderr.strip()}", flush=True)


def check_refusals(tools, work, cases, tokenizer_flags):
    baseline = cases["preln_baseline"]
    refuse([tools.nf_ckpt, "export", baseline["checkpoints"], "--format", "hf", "--out",
            work / "refused.hf", "--model-type", "gpt2"], work / "refused.hf", "model.objective")
    for kind, file, eod in (("bpe", "vocab.json", EOT), ("spm", "spm_refused.model", "</s>")):
        flags = tokenizer_flags[kind, "refused"]
        refuse([tools.nf_ckpt, "export", cases["normformer_tied"]["checkpoints"], "--format",
                "hf", "--out", work / "refused.hf", *flags], work / "refused.hf",
               f"{file}: the masked LM's <mask> (model.mask_token) is id {VOCAB - 1} but the "
               "tokenizer's <mask> is id ")
        refuse([tools.nf_ckpt, "export", cases["untied_resids"]["checkpoints"], "--format", "hf",
                "--out", work / "refused.hf", *flags], work / "refused.hf",
               f"{file}: the masked LM's <mask> (model.mask_token) is id 5, the tokenizer's "
               f"end-of-document token {eod}")
    source = cases["normformer_tied"]["hf_dir"]

    def broken(name, edit_config=None, drop_tensor=None):
        directory = work / f"broken_{name}"
        shutil.copytree(source, directory)
        if edit_config:
            config = json.loads((directory / "config.json").read_text())
            edit_config(config)
            (directory / "config.json").write_text(json.dumps(config, indent=2))
        if drop_tensor:
            from safetensors.numpy import save_file
            with safe_open(str(directory / "model.safetensors"), "np") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys() if k != drop_tensor}
                metadata = f.metadata()
            save_file(tensors, str(directory / "model.safetensors"), metadata=metadata)
        return directory

    broken_directories = [
        ("no_mask", {"edit_config": lambda c: c.pop("mask_token_id")},
         '"mask_token_id" is missing'),
        ("mask_outside", {"edit_config": lambda c: c.update(mask_token_id=VOCAB)},
         f'"mask_token_id" is {VOCAB}, not an id of [0, vocab_size {VOCAB})'),
        ("causal", {"edit_config": lambda c: (c.update(objective="causal_lm"),
                                              c.pop("mask_token_id"))},
         "model.objective is CAUSAL_LM by config.json, MASKED_LM by the metadata"),
        ("no_bias", {"drop_tensor": "lm_head.bias"},
         'has no lm_head.bias (config.json\'s objective "masked_lm")'),
    ]
    for name, edits, expected in broken_directories:
        directory = broken(name, **edits)
        out = work / f"refused_{name}"
        refuse([tools.nf_ckpt, "import", directory, "--out", out], out, expected)


def main():
    tools = Tools(sys.argv[1:])
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        # transformers copies a directory's remote code into its modules cache: keep it here.
        os.environ["HF_MODULES_CACHE"] = str(work / "hf_modules")
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as torch below
        import torch
        import transformers
        torch.set_num_threads(1)
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()

        cases = {}
        for name, overrides, tp, pp in VARIANTS:
            cases[name] = check_variant(tools, work, name, overrides, tp, pp)
        tokenizer_flags = check_tokenizers(tools, work, cases)
        check_fresh_init(cases["untied_resids"]["hf_dir"])
        check_round_trip(tools, work, "untied_resids", cases["untied_resids"])
        check_round_trip(tools, work, "tp2_pp2", cases["tp2_pp2"], "--max-shard-size", 4096)
        check_refusals(tools, work, cases, tokenizer_flags)
    print(f"hf_masked_lm_test: {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
