"""nf-eval's scores against an independent float64 computation (issue 18).

A tiny NormFormer (2 layers, d 32, 4 heads) is trained 200 steps with nf-launch on a small
synthetic corpus tokenized by a toy GPT-2 BPE written here (the 256 byte symbols, a few merges,
<|endoftext|>), so that it has learned the corpus's words. It is exported with `nf-ckpt export
--format fairseq` and run by tests/checkpoint/fairseq_reference.py, a float64 numpy
transformer_lm. The reference side shares no code with nf-eval: Hugging Face `tokenizers`
tokenizes, the prompts and lm-evaluation-harness's request rules (trailing spaces move to the
continuation, continuation = encode(context + continuation) after len(encode(context)) ids,
the end-of-document token first, the oldest tokens cut to fit) are written again below, and the
dataset's .idx/.bin are read with numpy.

Checked on one process:
  - every choice's log-likelihood within TOLERANCE_PER_TOKEN x its scored tokens; token and
    character counts and LAMBADA's greedy flags exactly; acc, acc_norm and acc_token_norm of
    every task exactly (the test first checks that no prediction rests on a near tie);
  - a LAMBADA last word of several tokens, scored greedily correct (the model learned it) and
    one not; a HellaSwag context long enough to be truncated to the window;
  - perplexity on the validation part of the split the run recorded, in windows of its
    train.seq_len: windows and tokens exactly, the loss within TOLERANCE_PER_TOKEN,
    ppl = exp(loss); for an imported checkpoint (no recorded run) the default split and windows
    of model.max_seq_len;
  - the JSON's exact structure (keys, in order) and the per-example JSON lines.
Then the same evaluation on tensor parallel 2, pipeline parallel 2 and data parallel 2 under
mpirun: the same counts and accuracies, every score within LAYOUT_TOLERANCE of the one-process
run. And refusals: exit 2 for command-line mistakes, 1 for a task file or tokenizer that does not
fit, each naming what is wrong.

Last, a masked LM (deploy/configs/tiny-mlm.pbtxt shrunk to the corpus, 150 steps): its masked-LM
perplexity's windows and masked token count exactly as the masks' own count draws predict
(check_masked_lm), the same on tensor 2 x pipeline 2 and data 2 and on a repeat, another loss for
another --mask-seed, and its refusals (--task among them).

Tolerances. nf-eval computes the model in fp32 and each token's log-softmax in float64 from the
fp32 logits. The logits match the float64 reference to ~1e-6 of their scale
(checkpoint.fairseq_export_test: 2 layers, fp32 rounding amplified by LayerNorm); a
log-probability inherits that error from its target logit and the log-sum-exp, so 2e-5 per token
bounds it with room. Layouts change only the order of fp32 sums (tensor parallel's all-reduce,
micro-batch shapes): LAYOUT_TOLERANCE 1e-5 per token. Measured differences are printed.

usage: nf_eval_test.py NF_LAUNCH NF_CKPT NF_PREPROCESS NF_EVAL MPIRUN...
"""
import json
import math
import os
import pathlib
import random
import re
import sys
import tempfile

import numpy as np
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "checkpoint"))
import fairseq_reference  # noqa: E402
from fairseq_test_util import load, run  # noqa: E402

TOLERANCE_PER_TOKEN = 2e-5
LAYOUT_TOLERANCE = 1e-5
NEAR_TIE = 1e-3  # predictions closer than this are not asserted: the data must avoid them
EOT = "<|endoftext|>"
SEQ = 40  # model.max_seq_len
TRAIN_SEQ = 32  # train.seq_len: the window of perplexity and tasks for a run that records it

SUBJECTS = ["the cat", "the dog", "a bird", "my friend", "the teacher", "a child"]
VERBS = ["sat on", "looked at", "ran to", "jumped over", "walked past"]
OBJECTS = ["the mat", "the door", "a tree", "the river", "the house", "the garden"]


# ---- the toy tokenizer and the corpus ------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte -> character map from its definition: the printable bytes '!'..'~',
    '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68 take U+0100, U+0101, ... in order."""
    own = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in own:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def write_tokenizer(work):
    """vocab.json and merges.txt: byte b is id b (so id 1, fairseq's padding, is byte 0x01, which
    no text here holds), then the merges' tokens, then <|endoftext|>. Returns (eod, vocab size)."""
    sym = bytes_to_unicode()
    tokens = [sym[b] for b in range(256)]
    merges = []
    for left, right in [(" ", "t"), ("h", "e"), (" t", "he"), ("a", "t"), (" ", "s"),
                        (" s", "at"), ("o", "n"), (" ", "o"), (" o", "n"), ("e", "r"),
                        (" ", "a"), ("o", "o"), ("r", "e")]:
        left = "".join(sym[b] for b in left.encode())
        right = "".join(sym[b] for b in right.encode())
        merges.append(f"{left} {right}")
        tokens.append(left + right)
    tokens.append(EOT)
    vocab = {token: i for i, token in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    (work / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (work / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n",
                                     encoding="utf-8")
    return vocab[EOT], len(tokens)


def hf_tokenizer(work):
    tok = Tokenizer(models.BPE.from_file(str(work / "vocab.json"), str(work / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=True)])
    return tok


def sentence(rng):
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}.".capitalize()


def write_corpus(path, documents=300, seed=3):
    rng = random.Random(seed)
    with open(path, "w") as out:
        for _ in range(documents):
            text = " ".join(sentence(rng) for _ in range(rng.randint(2, 4)))
            out.write(json.dumps({"text": text}) + "\n")


# ---- the task files ------------------------------------------------------------------------------

LONG_CONTEXT = " ".join(["The dog ran to the house."] * 8)  # > TRAIN_SEQ tokens: truncated

TASKS = {
    "hellaswag": [
        {"ctx": "The cat sat on the", "endings": ["mat.", "river blue loudly.", "door.",
                                                 "zebra quickly."], "label": 0},
        {"ctx": "A bird ran to", "activity_label": "Birds", "endings": [
            "the tree.", "[title] the garden.", "a xylophone.", "quantum mechanics."],
         "label": "1"},
        {"ctx": "My friend looked at the", "endings": ["house.", "garden.", "Jupiter moons.",
                                                       "river."], "label": 3},
        {"ctx": LONG_CONTEXT + " The teacher walked past", "endings": [
            "the door.", "a tree.", "seventeen.", "the mat."], "label": 0},
        {"ctx": "A child jumped over the", "endings": ["river.", "house.", "  fence.", "mat."],
         "label": 2},
    ],
    "piqa": [
        {"goal": "Where did the cat sit?", "sol1": "The cat sat on the mat.",
         "sol2": "Quantum zebras vanish.", "label": 0},
        {"goal": "How to reach the river", "sol1": "Jump over xylophones.",
         "sol2": "Walk to the river.", "label": 1},
        {"goal": "What did the dog do?", "sol1": "The dog ran to the door.",
         "sol2": "It sang opera.", "label": 0},
        {"goal": "Find a tree", "sol1": "Look at a tree.", "sol2": "Ask a teacher.", "label": 1},
    ],
    "winogrande": [
        {"sentence": "The cat sat on the mat because _ was tired.", "option1": "the cat",
         "option2": "the mat", "answer": "1"},
        {"sentence": "The dog ran to the house but _ was closed.", "option1": "the dog",
         "option2": "the house", "answer": "2"},
        {"sentence": "My friend looked at a tree and _ sat on the mat.", "option1": "a bird",
         "option2": "the river", "answer": 1},
        {"sentence": "A child walked past the garden where _ ran to the door.",
         "option1": "the teacher", "option2": "the river", "answer": "1"},
    ],
    "storycloze": [
        {"input_sentence_1": "The cat sat on the mat.", "input_sentence_2": "The dog ran to the door.",
         "input_sentence_3": "A bird looked at a tree.", "input_sentence_4": "My friend walked past.",
         "sentence_quiz1": "The teacher sat on the mat.", "sentence_quiz2": "Zebras ate pianos.",
         "answer_right_ending": 1},
        {"input_sentence_1": "A child ran to the river.", "input_sentence_2": "The dog jumped over.",
         "input_sentence_3": "The bird sat on a tree.", "input_sentence_4": "The teacher looked.",
         "sentence_quiz1": "Violins hum quietly.", "sentence_quiz2": "The cat ran to the house.",
         "answer_right_ending": "2"},
        {"input_sentence_1": "My friend sat on the mat.", "input_sentence_2": "A bird ran to.",
         "input_sentence_3": "The cat looked at the door.", "input_sentence_4": "It rained.",
         "sentence_quiz1": "The dog walked past the garden.",
         "sentence_quiz2": "The dog walked past a tree.", "answer_right_ending": 1},
    ],
    "lambada": [
        {"text": "The cat sat on the mat. The dog walked past"},
        {"text": "A bird looked at"},
        {"text": "My friend jumped over the river"},
        {"text": "The child sat on the xylophone"},
        {"text": LONG_CONTEXT + " The dog ran to the house"},
    ],
}

# The fields each line of the JSON output holds, in order.
TOP_KEYS = ["checkpoint", "step", "tensor_parallel", "pipeline_parallel", "data_parallel", "dtype",
            "perplexity", "tasks"]
PERPLEXITY_KEYS = ["objective", "dataset", "part", "split", "first_document", "end_document",
                   "seq_len", "windows", "tokens", "loss", "ppl"]
CHOICE_TASK_KEYS = ["file", "examples", "truncated", "acc", "acc_norm", "acc_token_norm"]
LAMBADA_KEYS = ["file", "examples", "truncated", "acc", "ppl"]
EXAMPLE_KEYS = ["task", "index", "label", "loglik", "tokens", "characters", "greedy"]


def write_tasks(work):
    files = {}
    for name, lines in TASKS.items():
        files[name] = work / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(line) + "\n" for line in lines))
    return files


# ---- the reference: prompts, requests, scores ---------------------------------------------------

def hellaswag_clean(text):
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def requests(name, line):
    """[(context, continuation)] per choice and the label, as tasks.h documents the prompts."""
    if name == "hellaswag":
        ctx = line["ctx"]
        if "activity_label" in line:
            ctx = line["activity_label"] + ": " + ctx
        return [(hellaswag_clean(ctx), " " + hellaswag_clean(e)) for e in line["endings"]], int(
            line["label"])
    if name == "piqa":
        context = f"Question: {line['goal']}\nAnswer:"
        return [(context, " " + line["sol1"]), (context, " " + line["sol2"])], int(line["label"])
    if name == "winogrande":
        blank = line["sentence"].index("_")
        after = " " + line["sentence"][blank + 1:].strip()
        return [(line["sentence"][:blank] + line[key], after) for key in ("option1", "option2")], \
            int(line["answer"]) - 1
    if name == "storycloze":
        context = " ".join(line[f"input_sentence_{i}"] for i in range(1, 5))
        return [(context, " " + line[key]) for key in ("sentence_quiz1", "sentence_quiz2")], \
            int(line["answer_right_ending"]) - 1
    context, word = line["text"].rsplit(" ", 1)
    return [(context, " " + word)], 0


def sequence(tok, eod, context, continuation):
    """lm-evaluation-harness's request: (tokens, scored tokens, truncated)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation = context[-spaces:] + continuation
        context = context[:-spaces]
    context_ids = tok.encode(context).ids
    whole = tok.encode(context + continuation).ids
    tokens = [eod] + context_ids + whole[len(context_ids):]
    scored = len(whole) - len(context_ids)
    return tokens[-(TRAIN_SEQ + 1):], scored, len(tokens) > TRAIN_SEQ + 1


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def reference_score(model, tokens, scored):
    logprobs = log_softmax(model.logits(np.array([tokens[:-1]]))[0])
    positions = range(len(tokens) - 1 - scored, len(tokens) - 1)
    picked = [logprobs[p, tokens[p + 1]] for p in positions]
    # The margin of each target over the best other token: greedy when positive.
    margins = [logprobs[p, tokens[p + 1]] - np.delete(logprobs[p], tokens[p + 1]).max()
               for p in positions]
    return float(np.sum(picked)), margins


def argmax_with_margin(scores):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    margin = scores[order[0]] - scores[order[1]] if len(scores) > 1 else math.inf
    return order[0], margin


def reference_tasks(model, tok, eod):
    """Per task: examples [(label, [(loglik, tokens, characters, margins, truncated)])] and the
    three accuracies (or LAMBADA's acc and ppl)."""
    out = {}
    for name, lines in TASKS.items():
        examples = []
        for line in lines:
            choices, label = requests(name, line)
            scored_choices = []
            for context, continuation in choices:
                tokens, scored, truncated = sequence(tok, eod, context, continuation)
                loglik, margins = reference_score(model, tokens, scored)
                scored_choices.append((loglik, scored, len(continuation) - continuation.startswith(" "), margins,
                                       truncated))
            examples.append((label, scored_choices))
        out[name] = {"examples": examples}
        if name == "lambada":
            greedy = [all(m > 0 for m in c[0][3]) for _, c in examples]
            out[name]["acc"] = sum(greedy) / len(examples)
            out[name]["ppl"] = math.exp(-sum(c[0][0] for _, c in examples) / len(examples))
            continue
        for metric, length in (("acc", None), ("acc_norm", 2), ("acc_token_norm", 1)):
            right = 0
            for label, choices in examples:
                scores = [c[0] / (max(c[length], 1) if length else 1) for c in choices]
                best, margin = argmax_with_margin(scores)
                assert margin > NEAR_TIE, (name, metric, scores)
                right += best == label
            out[name][metric] = right / len(examples)
    return out


def read_dataset(prefix):
    """The documents of a Megatron .idx/.bin pair as lists of ids, read with numpy."""
    idx = pathlib.Path(str(prefix) + ".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtype_code = idx[17]
    sequences = int.from_bytes(idx[18:26], "little")
    doc_entries = int.from_bytes(idx[26:34], "little")
    offset = 34
    sizes = np.frombuffer(idx, np.int32, sequences, offset)
    offset += 4 * sequences
    pointers = np.frombuffer(idx, np.int64, sequences, offset)
    offset += 8 * sequences
    doc_index = np.frombuffer(idx, np.int64, doc_entries, offset)
    token_type = {8: np.uint16, 4: np.int32}[dtype_code]
    data = pathlib.Path(str(prefix) + ".bin").read_bytes()
    docs = []
    for d in range(doc_entries - 1):
        ids = []
        for s in range(doc_index[d], doc_index[d + 1]):
            ids += np.frombuffer(data, token_type, sizes[s], pointers[s]).astype(np.int64).tolist()
        docs.append(ids)
    return docs


def validation_stream(prefix, split):
    """(first document, end document, their tokens back to back) of the split's validation
    part."""
    docs = read_dataset(prefix)
    weights = [float(w) for w in split.split(",")]
    weights = [w / sum(weights) for w in weights]
    begin = round(len(docs) * weights[0])
    end = round(len(docs) * (weights[0] + weights[1]))
    return begin, end, [t for doc in docs[begin:end] for t in doc]


def reference_perplexity(model, prefix, split, seq):
    begin, end, stream = validation_stream(prefix, split)
    nll, count, windows = 0.0, 0, 0
    for start in range(0, len(stream) - 1, seq):
        window = stream[start:start + seq + 1]
        logprobs = log_softmax(model.logits(np.array([window[:-1]]))[0])
        nll -= sum(logprobs[p, window[p + 1]] for p in range(len(window) - 1))
        count += len(window) - 1
        windows += 1
    return {"first_document": begin, "end_document": end, "windows": windows, "tokens": count,
            "loss": nll / count}


# ---- running nf-eval ----------------------------------------------------------------------------

def evaluate(tools, work, name, *layout, ranks=1):
    nf_eval, mpirun = tools["nf_eval"], tools["mpirun"]
    out, examples = work / f"{name}.json", work / f"{name}.examples.jsonl"
    command = [nf_eval, "--checkpoint", work / "run" / "checkpoints", "--dataset",
               work / "corpus", "--tokenizer", "gpt2", "--vocab-file", work / "vocab.json",
               "--merges-file", work / "merges.txt", "--out", out, "--examples-out", examples,
               "--batch-size", "3", *layout]
    for task, path in tools["task_files"].items():
        command += ["--task", f"{task}={path}"]
    if ranks > 1:
        command = list(mpirun) + ["-np", str(ranks)] + command
    table = run(*command).stdout
    return json.loads(out.read_text()), [json.loads(line) for line in
                                         examples.read_text().splitlines()], table


def check_structure(result, lines):
    assert list(result) == TOP_KEYS, list(result)
    assert list(result["perplexity"]) == PERPLEXITY_KEYS, list(result["perplexity"])
    assert result["perplexity"]["objective"] == "causal_lm", result["perplexity"]
    assert list(result["tasks"]) == list(TASKS), list(result["tasks"])
    for name, entry in result["tasks"].items():
        assert list(entry) == (LAMBADA_KEYS if name == "lambada" else CHOICE_TASK_KEYS), entry
        assert entry["examples"] == len(TASKS[name]), entry
    assert len(lines) == sum(len(lines_) for lines_ in TASKS.values())
    for line in lines:
        assert list(line) == EXAMPLE_KEYS, line


def check_against_reference(result, lines, reference, ppl_reference):
    worst = 0.0
    by_task = {}
    for line in lines:
        by_task.setdefault(line["task"], []).append(line)
    for name, expected in reference.items():
        got = result["tasks"][name]
        truncated = 0
        for line, (label, choices) in zip(by_task[name], expected["examples"]):
            assert line["label"] == label, (name, line)
            for i, (loglik, scored, characters, margins, was_truncated) in enumerate(choices):
                assert line["tokens"][i] == scored, (name, line, i, scored)
                assert line["characters"][i] == characters, (name, line, i, characters)
                difference = abs(line["loglik"][i] - loglik)
                worst = max(worst, difference / scored)
                assert difference <= TOLERANCE_PER_TOKEN * scored, (name, line, i, loglik)
                if all(abs(m) > NEAR_TIE for m in margins):
                    assert line["greedy"][i] == all(m > 0 for m in margins), (name, line, i)
                truncated += was_truncated
        assert got["truncated"] == truncated, (name, got, truncated)
        for metric in ("acc", "acc_norm", "acc_token_norm"):
            if metric in expected:
                assert got[metric] == expected[metric], (name, metric, got, expected[metric])
        if name == "lambada":
            assert abs(got["ppl"] - expected["ppl"]) <= 1e-4 * expected["ppl"], (got, expected)
    ppl = result["perplexity"]
    for key in ("first_document", "end_document", "windows", "tokens"):
        assert ppl[key] == ppl_reference[key], (key, ppl, ppl_reference)
    loss_difference = abs(ppl["loss"] - ppl_reference["loss"])
    assert loss_difference <= TOLERANCE_PER_TOKEN, (ppl, ppl_reference)
    assert abs(ppl["ppl"] - math.exp(ppl["loss"])) <= 1e-12 * ppl["ppl"], ppl
    print(f"one process vs float64 reference: log-likelihood {worst:.2e} per token (tolerance "
          f"{TOLERANCE_PER_TOKEN:.0e}), perplexity loss {loss_difference:.2e}")


def check_same_as(name, base, base_lines, result, lines):
    worst = 0.0
    for line, other in zip(base_lines, lines):
        assert (line["task"], line["index"], line["tokens"], line["characters"], line["greedy"]) \
            == (other["task"], other["index"], other["tokens"], other["characters"],
                other["greedy"]), (name, line, other)
        for a, b, n in zip(line["loglik"], other["loglik"], line["tokens"]):
            worst = max(worst, abs(a - b) / n)
            assert abs(a - b) <= LAYOUT_TOLERANCE * n, (name, line, other)
    for task, entry in base["tasks"].items():
        for key, value in entry.items():
            if key != "ppl":
                assert result["tasks"][task][key] == value, (name, task, key)
    loss_difference = abs(result["perplexity"]["loss"] - base["perplexity"]["loss"])
    assert loss_difference <= LAYOUT_TOLERANCE, (name, result["perplexity"])
    print(f"{name} vs one process: log-likelihood {worst:.2e} per token, perplexity loss "
          f"{loss_difference:.2e} (tolerance {LAYOUT_TOLERANCE:.0e})")


def check_imported(tools, work, model, exported):
    """A checkpoint without a recorded run (an import of the fairseq export): perplexity on the
    default split's validation part in windows of model.max_seq_len."""
    run(tools["nf_ckpt"], "import", exported, "--out", work / "imported")
    out = work / "imported.json"
    run(tools["nf_eval"], "--checkpoint", work / "imported", "--dataset", work / "corpus", "--out",
        out)
    result = json.loads(out.read_text())["perplexity"]
    expected = reference_perplexity(model, work / "corpus", "969,30,1", SEQ)
    assert result["split"] == "969,30,1" and result["seq_len"] == SEQ, result
    for key in ("first_document", "end_document", "windows", "tokens"):
        assert result[key] == expected[key], (key, result, expected)
    assert abs(result["loss"] - expected["loss"]) <= TOLERANCE_PER_TOKEN, (result, expected)
    print(f"imported checkpoint: windows of {SEQ} on split 969,30,1, loss difference "
          f"{abs(result['loss'] - expected['loss']):.2e}")


def check_refusals(tools, work):
    nf_eval = tools["nf_eval"]
    checkpoint = work / "run" / "checkpoints"
    hellaswag = tools["task_files"]["hellaswag"]
    tokenizer = ["--tokenizer", "gpt2", "--vocab-file", work / "vocab.json", "--merges-file",
                 work / "merges.txt"]
    bad = work / "bad.jsonl"
    bad.write_text(json.dumps(TASKS["piqa"][0]) + "\n" + '{"goal": "x", "sol1": "a"}\n')
    big_vocab = work / "big"
    big_vocab.mkdir()
    write_tokenizer_with_extra(big_vocab, 300)
    cases = [
        (2, "--task hellaswag needs a tokenizer", ["--task", f"hellaswag={hellaswag}"],
         "--tokenizer"),
        (2, "unknown task", ["--task", f"mmlu={hellaswag}", *tokenizer], "unknown task 'mmlu'"),
        (2, "nothing to evaluate", [], "nothing to evaluate"),
        (2, "--tp without mpirun", ["--dataset", work / "corpus", "--tp", "2"], "mpirun -np 2"),
        (2, "a window longer than the model's", ["--dataset", work / "corpus", "--seq-len", "64"],
         "exceeds model.max_seq_len"),
        (1, "a bad task line", ["--task", f"piqa={bad}", *tokenizer], f"{bad}:2: piqa: no \"sol2\""),
        (1, "another tokenizer", ["--task", f"hellaswag={hellaswag}", "--tokenizer", "gpt2",
                                  "--vocab-file", big_vocab / "vocab.json", "--merges-file",
                                  big_vocab / "merges.txt"], "not the tokenizer the model"),
        (1, "a part without documents", ["--dataset", work / "corpus", "--part", "test"],
         "holds no documents"),
        (1, "a SentencePiece model that does not exist",
         ["--task", f"hellaswag={hellaswag}", "--tokenizer", "sentencepiece", "--spm-model",
          work / "missing.model"], "missing.model"),
        (2, "a report inside a checkpoint",
         ["--dataset", work / "corpus", "--out", checkpoint / "report.json"],
         "is inside the checkpoints directory"),
        (2, "a report over the dataset it reads",
         ["--dataset", work / "corpus", "--out", work / "corpus.idx"],
         "which this command reads"),
        (2, "examples over the task file they come from",
         ["--task", f"hellaswag={hellaswag}", *tokenizer, "--examples-out", hellaswag],
         "which this command reads"),
    ]
    for code, what, args, message in cases:
        result = run(nf_eval, "--checkpoint", checkpoint, *args, check=False)
        assert result.returncode == code and message in result.stderr, (what, result.returncode,
                                                                         result.stderr)
        # One line: a helper's own message (nf-tokenize's) is not printed before ours.
        assert code == 2 or len(result.stderr.splitlines()) == 1, (what, result.stderr)
    print(f"{len(cases)} refusals, each naming the problem")
    # A hard link at --out to a checkpoint's manifest is replaced by the report, never written
    # through (it used to be truncated and the checkpoint lost).
    latest = checkpoint / (checkpoint / "latest").read_text().strip()
    manifest = (latest / "manifest.pb").read_bytes()
    linked = work / "linked_report.json"
    os.link(latest / "manifest.pb", linked)
    run(nf_eval, "--checkpoint", checkpoint, "--dataset", work / "corpus", "--max-windows", 1,
        "--out", linked)
    assert (latest / "manifest.pb").read_bytes() == manifest
    assert json.loads(linked.read_text())["checkpoint"], linked.read_text()
    print("a hard link at --out to a manifest: replaced, the manifest unchanged")


def check_helper(tools, work):
    """nf-eval never loads SentencePiece and nf-tokenize never loads protobuf (the two protobufs
    crash one process: data/CMakeLists.txt); nf-tokenize refuses a malformed texts file."""
    nf_eval = pathlib.Path(tools["nf_eval"])
    nf_tokenize = nf_eval.parent / "nf-tokenize"
    assert "sentencepiece" not in run("ldd", nf_eval).stdout
    assert "protobuf" not in run("ldd", nf_tokenize).stdout
    texts = work / "texts"
    texts.write_bytes(b"5\nhello\n0\n\n")
    tokenizer = ["--tokenizer", "gpt2", "--vocab-file", work / "vocab.json", "--merges-file",
                 work / "merges.txt"]
    lines = run(nf_tokenize, *tokenizer, "--texts", texts).stdout.split("\n")
    assert lines[0].startswith("vocab_size ") and lines[2:] == ["", ""], lines
    texts.write_bytes(b"9\nhello\n")
    result = run(nf_tokenize, *tokenizer, "--texts", texts, check=False)
    assert result.returncode == 1 and "a malformed record at byte 0" in result.stderr, result
    print("nf-eval without SentencePiece, nf-tokenize without protobuf; protocol checked")


def write_tokenizer_with_extra(work, size):
    """A tokenizer whose vocabulary (`size` entries) exceeds the model's."""
    sym = bytes_to_unicode()
    tokens = [sym[b] for b in range(256)] + [f"extra{i}" for i in range(size - 257)] + [EOT]
    (work / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (work / "merges.txt").write_text("#version: 0.2\n")


# ---- the masked LM -------------------------------------------------------------------------------

MLM_SEED = 5  # the masked LM's train.seed: --mask-seed's default
# Its data.masked_lm.mask_prob, not the default 0.15: nf-eval must mask as the run recorded. A
# float field, widened to double as the masking reads it.
MLM_MASK_PROB = float(np.float32(0.2))
MLM_ITERS = 150
MASKED_KEYS = ["objective", "dataset", "part", "split", "first_document", "end_document",
               "seq_len", "mask_seed", "windows", "tokens", "loss", "ppl"]
MASKED_LM_STREAM = 0xFFFFFFFE  # data/masked_lm.h's kMaskedLmStream, the masks' key word


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al. 2011), written again from the paper's round function."""
    m0, m1, w0, w1, mask = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
    c, k = list(counter), list(key)
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & mask, (p0 >> 32) ^ c[3] ^ k[1], p0 & mask]
        k = [(k[0] + w0) & mask, (k[1] + w1) & mask]
    return c


def masked_count(seed, window, seq, mask_prob=MLM_MASK_PROB):
    """How many of window `window`'s `seq` tokens data::MaskSample chooses: fairseq's
    int(mask_prob * seq + u), u the top 53 of the first two words' 64 bits of Philox at counter
    {0, window low, window high, 0 (the count draw)} under key {seed, kMaskedLmStream}."""
    words = philox4x32_10([0, window & 0xFFFFFFFF, window >> 32, 0], [seed, MASKED_LM_STREAM])
    u = ((words[1] << 32 | words[0]) >> 11) * 2.0 ** -53
    return min(math.floor(mask_prob * seq + u), seq)


def train_masked_lm(tools, work, vocab):
    """deploy/configs/tiny-mlm.pbtxt shrunk to the corpus: the tokenizer's ids and <mask> (the
    last id), 4 layers of d 32 (4 heads and 4 layers: tensor 2 x pipeline 2 splits them), no
    dropout, windows of TRAIN_SEQ, train.seed MLM_SEED, mask_prob MLM_MASK_PROB. Into
    work/mlm."""
    config = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "configs" / "tiny-mlm.pbtxt"
    overrides = {"model.vocab_size": vocab + 1, "model.d_model": 32, "model.ffn_dim": 64,
                 "model.max_seq_len": SEQ, "model.dropout": 0, "train.seq_len": TRAIN_SEQ,
                 "train.micro_batch_size": 4, "train.global_batch_size": 8,
                 "train.train_iters": MLM_ITERS, "train.seed": MLM_SEED,
                 "train.optimizer.lr": 3e-3, "train.lr_schedule.warmup_iters": 5,
                 "data.path": work / "corpus", "data.split": "80,20,0",
                 "data.masked_lm.mask_prob": MLM_MASK_PROB}
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    run(tools["nf_launch"], "--config", config, *sets, "--run-dir", work / "mlm")


def evaluate_masked(tools, work, name, *args, ranks=1):
    out = work / f"{name}.json"
    command = [tools["nf_eval"], "--checkpoint", work / "mlm" / "checkpoints", "--dataset",
               work / "corpus", "--out", out, *args]
    if ranks > 1:
        command = list(tools["mpirun"]) + ["-np", str(ranks)] + command
    table = run(*command).stdout
    result = json.loads(out.read_text())
    assert list(result) == TOP_KEYS[:-1], list(result)
    assert list(result["perplexity"]) == MASKED_KEYS, list(result["perplexity"])
    assert result["perplexity"]["objective"] == "masked_lm", result
    return result["perplexity"], table


def check_masked_lm(tools, work, vocab):
    """Masked-LM perplexity (issue 48): the validation part's whole windows of TRAIN_SEQ tokens,
    window k masked by (mask seed, k). Checks the windows, and the masked token count against
    masked_count above, exactly; the same count and the loss within LAYOUT_TOLERANCE (fp32 sums
    reassociated: tensor parallel's all-reduce, other micro-batch shapes) on tensor 2 x pipeline 2
    and data 2 with other micro-batch sizes; the same bits on a repeat; another --mask-seed
    another loss; the refusals."""
    # Random123's known answer, so that a miscount is not this file's Philox.
    assert philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    train_masked_lm(tools, work, vocab)
    begin, end, stream = validation_stream(work / "corpus", "80,20,0")
    windows = len(stream) // TRAIN_SEQ  # the rest, shorter than a window, is skipped

    def expected(seed):
        return sum(masked_count(seed, k, TRAIN_SEQ) for k in range(windows))

    base, table = evaluate_masked(tools, work, "mlm_one", "--batch-size", "3")
    print(table, end="")
    assert (base["first_document"], base["end_document"], base["seq_len"]) == (
        begin, end, TRAIN_SEQ), base
    assert base["mask_seed"] == MLM_SEED and base["windows"] == windows, base
    assert base["tokens"] == expected(MLM_SEED), (base, expected(MLM_SEED))
    assert abs(base["ppl"] - math.exp(base["loss"])) <= 1e-12 * base["ppl"], base
    # Trained: well below the uniform guess's ln(vocab).
    assert base["loss"] < 0.8 * math.log(vocab + 1), base
    repeat, _ = evaluate_masked(tools, work, "mlm_repeat", "--batch-size", "3", "--mask-seed",
                                str(MLM_SEED))
    assert repeat == base, (repeat, base)
    worst = 0.0
    for name, layout, ranks in [("tensor 2 x pipeline 2", ["--tp", "2", "--pp", "2"], 4),
                                ("data 2", ["--batch-size", "5"], 2)]:
        result, _ = evaluate_masked(tools, work, "mlm_" + name.replace(" ", "_"), *layout,
                                    ranks=ranks)
        assert {k: v for k, v in result.items() if k not in ("loss", "ppl")} == \
            {k: v for k, v in base.items() if k not in ("loss", "ppl")}, (name, result, base)
        difference = abs(result["loss"] - base["loss"])
        assert difference <= LAYOUT_TOLERANCE, (name, result, base)
        worst = max(worst, difference)
    other, _ = evaluate_masked(tools, work, "mlm_seed", "--mask-seed", str(MLM_SEED + 1))
    assert other["mask_seed"] == MLM_SEED + 1 and other["tokens"] == expected(MLM_SEED + 1), other
    assert abs(other["loss"] - base["loss"]) > 1e-3, (other, base)
    print(f"masked LM: {base['tokens']} masked tokens in {windows} windows (expected "
          f"{expected(MLM_SEED)}), loss {base['loss']:.4f}; layouts within {worst:.2e} "
          f"(tolerance {LAYOUT_TOLERANCE:.0e}); --mask-seed {MLM_SEED + 1}: {other['tokens']} "
          f"tokens, loss {other['loss']:.4f}")

    checkpoint = work / "mlm" / "checkpoints"
    # A split whose validation part is one document shorter than a window of SEQ.
    docs = read_dataset(work / "corpus")
    short = next(d for d, doc in enumerate(docs) if len(doc) < SEQ)
    short_split = f"{short},1,{len(docs) - short - 1}"
    tokenizer = ["--tokenizer", "gpt2", "--vocab-file", work / "vocab.json", "--merges-file",
                 work / "merges.txt"]
    cases = [
        (1, "zero-shot tasks on a masked LM",
         [checkpoint, "--task", f"piqa={tools['task_files']['piqa']}", *tokenizer],
         "--task (zero-shot tasks score causally) needs a causal LM, and this model is a masked LM "
         "(model.objective MASKED_LM"),
        (2, "--mask-seed on a causal LM",
         [work / "run" / "checkpoints", "--dataset", work / "corpus", "--mask-seed", "3"],
         "--mask-seed is for a masked LM"),
        (2, "--mask-seed without --dataset",
         [checkpoint, "--task", f"piqa={tools['task_files']['piqa']}", *tokenizer,
          "--mask-seed", "3"], "--mask-seed are for --dataset"),
        (2, "a negative --mask-seed", [checkpoint, "--dataset", work / "corpus", "--mask-seed",
                                       "-1"], "--mask-seed takes an integer from 0 to 4294967295"),
        (1, "a part shorter than one window",
         [checkpoint, "--dataset", work / "corpus", "--split", short_split, "--seq-len", SEQ],
         f"tokens, fewer than one window of {SEQ} (--seq-len)"),
    ]
    for code, what, args, message in cases:
        result = run(tools["nf_eval"], "--checkpoint", *args, check=False)
        assert result.returncode == code and message in result.stderr, (what, result.returncode,
                                                                        result.stderr)
        assert code == 2 or len(result.stderr.splitlines()) == 1, (what, result.stderr)
    print(f"masked LM: {len(cases)} refusals, each naming the problem")


def main():
    nf_launch, nf_ckpt, nf_preprocess, nf_eval = sys.argv[1:5]
    mpirun = sys.argv[5:]
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        eod, vocab = write_tokenizer(work)
        write_corpus(work / "corpus.jsonl")
        run(nf_preprocess, "--input", work / "corpus.jsonl", "--output-prefix", work / "corpus",
            "--tokenizer", "gpt2", "--vocab-file", work / "vocab.json", "--merges-file",
            work / "merges.txt")
        split = "80,20,0"
        (work / "run.pbtxt").write_text(f"""
          model {{ num_layers: 2 d_model: 32 num_heads: 4 ffn_dim: 64 vocab_size: {vocab}
                  max_seq_len: {SEQ} dropout: 0 }}
          train {{ seq_len: {TRAIN_SEQ} micro_batch_size: 4 global_batch_size: 8 train_iters: 200
                  optimizer {{ lr: 1e-2 }} lr_schedule {{ warmup_iters: 5 }} }}
          data {{ path: "{work / 'corpus'}" split: "{split}" }}
        """)
        run(nf_launch, "--config", work / "run.pbtxt", "--run-dir", work / "run")
        exported = work / "model.safetensors"
        run(nf_ckpt, "export", work / "run" / "checkpoints", "--format", "fairseq", "--out",
            exported)
        tensors, metadata = load(exported)
        model = fairseq_reference.TransformerLM(metadata["fairseq.flags"], tensors)
        tok = hf_tokenizer(work)
        reference = reference_tasks(model, tok, eod)
        ppl_reference = reference_perplexity(model, work / "corpus", split, TRAIN_SEQ)
        lambada = reference["lambada"]["examples"]
        assert any(c[0][1] >= 2 and all(m > NEAR_TIE for m in c[0][3]) for _, c in lambada), \
            "no LAMBADA word of several tokens predicted greedily: retrain or change the data"
        assert any(not all(m > 0 for m in c[0][3]) for _, c in lambada)

        tools = {"nf_eval": nf_eval, "nf_ckpt": nf_ckpt, "nf_launch": nf_launch,
                 "mpirun": mpirun, "task_files": write_tasks(work)}
        base, base_lines, table = evaluate(tools, work, "one")
        print(table)
        check_structure(base, base_lines)
        assert base["perplexity"]["split"] == split and base["perplexity"]["seq_len"] == TRAIN_SEQ
        check_against_reference(base, base_lines, reference, ppl_reference)
        for name, layout in [("tensor parallel 2", ["--tp", "2"]),
                             ("pipeline parallel 2", ["--pp", "2"]),
                             ("data parallel 2", [])]:
            result, lines, _ = evaluate(tools, work, name.replace(" ", "_"), *layout, ranks=2)
            check_structure(result, lines)
            sizes = (result["tensor_parallel"], result["pipeline_parallel"],
                     result["data_parallel"])
            assert sizes == {"tensor parallel 2": (2, 1, 1), "pipeline parallel 2": (1, 2, 1),
                             "data parallel 2": (1, 1, 2)}[name], sizes
            check_same_as(name, base, base_lines, result, lines)
        check_imported(tools, work, model, exported)
        check_helper(tools, work)
        check_refusals(tools, work)
        check_masked_lm(tools, work, vocab)
    print("OK")


if __name__ == "__main__":
    main()
