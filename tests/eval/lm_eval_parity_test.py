"""lm-evaluation-harness on the Hugging Face export against nf-eval (issue 47).

A tiny NormFormer (2 layers, d 32, 4 heads; scale_attn, scale_heads and scale_fc on, sinusoidal
positions, scaled embeddings: the export is model_type "normformer" with remote code) is trained
200 steps with nf-launch on nf_eval_test's synthetic corpus and toy GPT-2 BPE, and exported with
`nf-ckpt export --format hf --tokenizer gpt2`. Then nf-eval and lm-evaluation-harness (the
`lm_eval` package, 0.4.13: HFLM, i.e. `--model hf`, offline) read the same files:

  - Tasks: the JSON Lines files nf-eval reads with --task, in the public datasets' fields
    (HellaSwag as Rowan/hellaswag writes it: ctx_a, ctx_b in lower case, ctx), and the harness's
    local tasks tests/eval/lm_eval_tasks/nf_* (hellaswag, piqa, winogrande, storycloze_2016 and
    lambada_openai's prompts, imported or copied from the harness, reading the files of the
    working directory). Checked: each request the harness sends the model (recorded) is the
    harness's prompt and its tokens are nf-eval's rule's (eval/sequences.h: nf_sequence below,
    the rule nf_eval_test checks nf-eval against), the HellaSwag context included, so the end-
    of-document token first and the truncation to the window agree; each choice's scored token
    count and its length in characters (acc_norm's) equal nf-eval's; each choice's
    log-likelihood within TOLERANCE_PER_TOKEN x its tokens; LAMBADA's greedy flags; acc and
    acc_norm of every task and LAMBADA's ppl.
  - Perplexity: nf-eval --dataset on documents written "<|endoftext|>" + text and preprocessed
    with --no-eod --parse-special-tokens (the token stream: the end-of-document token, then each
    document after its own) against the harness's rolling log-likelihood (its command line, task
    nf_perplexity) of that stream's text after its first token (the documents joined by
    "<|endoftext|>", which the Hugging Face tokenizer reads as the end-of-document token), the
    predicted tokens a multiple of the window: the harness's first window is predicted from its
    prefix token (<|endoftext|>), so both score the same tokens from the same contexts. The
    same token count, and the loss within TOLERANCE_PER_TOKEN.

The harness's model_args, each making it build nf-eval's requests:
  - add_bos_token=True: the harness puts nothing before a non-empty context unless the tokenizer
    adds a BOS (GPT-2's does not by default); nf-eval puts the end-of-document token first. With
    it encode(context) and encode(context + continuation) both start with <|endoftext|>, the
    export's bos, and the continuation is still the whole text's ids after the context's. The
    perplexity run leaves it out: the harness conditions a document's first window on its
    prefix token already, and a BOS added by the tokenizer would be scored as well.
  - max_length=S, nf-eval's window (the run's train.seq_len, 96 here; without it the harness
    takes config.json's max_position_embeddings, the model's max_seq_len 128): both keep the
    last S + 1 tokens of a request, and the harness's rolling windows hold S predictions.
  - dtype=float32, softmax_dtype=float64: the model in fp32 as nf-eval's default, the
    log-softmax in float64 from the fp32 logits as nf-eval forms it.

Tolerances. nf-eval and transformers compute the same fp32 model from the same fp32 parameters
in different summation orders: the logits agree to ~1e-6 of their scale (the export's logits
test), and a log-probability inherits that from its target logit and the log-sum-exp, so 2e-5
per token (what nf_eval_test allows nf-eval against float64) bounds it with room: measured 1.1e-6
per token at most. Accuracies are compared exactly, after checking that no prediction rests on a
near tie (NEAR_TIE) that rounding could flip. Measured differences are printed.

usage: lm_eval_parity_test.py NF_LAUNCH NF_CKPT NF_PREPROCESS NF_EVAL
"""
import glob
import json
import math
import os
import pathlib
import random
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
TASK_DIR = HERE / "lm_eval_tasks"
sys.path.insert(0, str(HERE))
import nf_eval_test as nfe  # noqa: E402  (its toy tokenizer, corpus and request rules)

TOLERANCE_PER_TOKEN = 2e-5
NEAR_TIE = 1e-3
MAX_SEQ_LEN = 128  # model.max_seq_len: config.json's max_position_embeddings
S = 96  # train.seq_len: nf-eval's window, and the harness's max_length
EOT = nfe.EOT
HARNESS_TASK = {"hellaswag": "nf_hellaswag", "piqa": "nf_piqa", "winogrande": "nf_winogrande",
                "storycloze": "nf_storycloze", "lambada": "nf_lambada"}
# The accuracies each harness task reports (nf-eval's WinoGrande acc_norm is not the harness's:
# see tests/eval/lm_eval_tasks/nf_winogrande.yaml).
METRICS = {"hellaswag": ("acc", "acc_norm"), "piqa": ("acc", "acc_norm"), "winogrande": ("acc",),
           "storycloze": ("acc", "acc_norm"), "lambada": ("acc",)}


def run(*args, cwd=None):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


# ---- the task files: the public datasets' lines (Hugging Face's copies) -------------------------

def hellaswag(activity, ctx_a, ctx_b, endings, label):
    """A Rowan/hellaswag line: ctx is ctx_a + " " + ctx_b as the dataset writes it, ctx_b in
    lower case as it mostly is there; the harness reads ctx_a and ctx_b.capitalize()."""
    return {"activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": f"{ctx_a} {ctx_b}" if ctx_b else ctx_a, "endings": endings, "label": str(label)}


TASKS = {
    "hellaswag": [
        hellaswag("Cats", "The cat sat on the", "", ["mat.", "river blue loudly.", "door.",
                                                     "zebra quickly."], 0),
        # An ending that starts with WikiHow markup: its choice starts with a space once cleaned.
        hellaswag("Birds", "A bird looked at a tree.", "the bird", [
            "sat on the mat.", "[title] ran to the garden.", "a xylophone.", "quantum mechanics."],
            1),
        hellaswag("Friends", "My friend looked at the house.", "the dog", [
            "ran to the door.", "sat on the mat.", "Jupiter moons.", "walked past the river."], 0),
        # Longer than the window: both drop the oldest context tokens.
        hellaswag("Teachers", nfe.LONG_CONTEXT, "the teacher walked past", [
            "the door.", "a tree.", "seventeen.", "the mat."], 0),
        hellaswag("Children", "A child jumped over the", "", ["river.", "house.", "  fence.",
                                                              "mat."], 2),
    ],
    "piqa": nfe.TASKS["piqa"],
    # The harness reads the answer as the string "1" or "2" (its preprocess_winogrande).
    "winogrande": [dict(line, answer=str(line["answer"])) for line in nfe.TASKS["winogrande"]],
    # A JSON column holds one type: LSDSem/story_cloze's integers.
    "storycloze": [dict(line, answer_right_ending=int(line["answer_right_ending"]))
                   for line in nfe.TASKS["storycloze"]],
    "lambada": nfe.TASKS["lambada"],
}


def write_tasks(work):
    for name, lines in TASKS.items():
        (work / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return {name: work / f"{name}.jsonl" for name in TASKS}


def harness_requests(name, line):
    """[(context, continuation)] per choice as lm-evaluation-harness 0.4.13's task configs build
    them (hellaswag/utils.py, piqa.yaml, winogrande/preprocess_winogrande.py,
    storycloze_2016.yaml, lambada_openai.yaml; target_delimiter " "), written again here."""
    if name == "hellaswag":
        ctx = nfe.hellaswag_clean(
            line["activity_label"] + ": " + line["ctx_a"] + " " + line["ctx_b"].capitalize())
        return [(ctx, " " + nfe.hellaswag_clean(e)) for e in line["endings"]]
    if name == "winogrande":
        blank = line["sentence"].index("_")
        after = " " + line["sentence"][blank + 1:].strip()
        return [(line["sentence"][:blank] + line[k], after) for k in ("option1", "option2")]
    return nfe.requests(name, line)[0]


def nf_sequence(tok, eod, context, continuation):
    """nf-eval's request (eval/sequences.h; nf_eval_test checks nf-eval against the same rule):
    (tokens, scored tokens, truncated)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tok.encode(context).ids
    whole = tok.encode(context + continuation).ids
    tokens = [eod] + context_ids + whole[len(context_ids):]
    return tokens[-(S + 1):], len(whole) - len(context_ids), len(tokens) > S + 1


# ---- the perplexity text ------------------------------------------------------------------------

def write_perplexity_text(tools, work, tok):
    """Three held-out documents, the last grown word by word until the stream's predictions (its
    tokens after the first end-of-document token) are a multiple of S: nf-eval's last window is
    then a whole one, as the harness's are (it slides its last window back to a full context)."""
    rng = random.Random(11)
    docs = [" ".join(nfe.sentence(rng) for _ in range(rng.randint(3, 6))) for _ in range(3)]
    words = []
    while True:
        text = EOT.join(docs)
        count = len(tok.encode(text).ids)
        if count % S == 0 and count >= 4 * S:
            break
        if not words:
            words = nfe.sentence(rng).split(" ")
        docs[-1] += " " + words.pop(0)
    (work / "perplexity.jsonl").write_text(json.dumps({"text": text}) + "\n")
    (work / "documents.jsonl").write_text(
        "".join(json.dumps({"text": EOT + doc}) + "\n" for doc in docs))
    run(tools["nf_preprocess"], "--input", work / "documents.jsonl", "--output-prefix",
        work / "documents", "--tokenizer", "gpt2", "--vocab-file", work / "vocab.json",
        "--merges-file", work / "merges.txt", "--no-eod", "--parse-special-tokens")
    stream = [t for doc in nfe.read_dataset(work / "documents") for t in doc]
    assert stream == [tok.token_to_id(EOT)] + tok.encode(text).ids, "the stream is not the text"
    return text, count


# ---- the model ----------------------------------------------------------------------------------

def train(tools, work):
    """nf_eval_test's corpus, tokenizer and model (its window and positions larger, so that
    most requests fit and only the long contexts are truncated)."""
    vocab = nfe.write_tokenizer(work)[1]
    nfe.write_corpus(work / "corpus.jsonl")
    run(tools["nf_preprocess"], "--input", work / "corpus.jsonl", "--output-prefix",
        work / "corpus", "--tokenizer", "gpt2", "--vocab-file", work / "vocab.json",
        "--merges-file", work / "merges.txt")
    (work / "run.pbtxt").write_text(f"""
      model {{ num_layers: 2 d_model: 32 num_heads: 4 ffn_dim: 64 vocab_size: {vocab}
              max_seq_len: {MAX_SEQ_LEN} dropout: 0 }}
      train {{ seq_len: {S} micro_batch_size: 4 global_batch_size: 8 train_iters: 200
              optimizer {{ lr: 1e-2 }} lr_schedule {{ warmup_iters: 5 }} }}
      data {{ path: "{work / 'corpus'}" split: "80,20,0" }}
    """)
    run(tools["nf_launch"], "--config", work / "run.pbtxt", "--run-dir", work / "run")


def export(tools, work):
    hf = work / "hf"
    run(tools["nf_ckpt"], "export", work / "run" / "checkpoints", "--format", "hf", "--out", hf,
        "--tokenizer", "gpt2", "--vocab-file", work / "vocab.json", "--merges-file",
        work / "merges.txt")
    config = json.loads((hf / "config.json").read_text())
    assert config["model_type"] == "normformer" and "auto_map" in config, config
    assert config["max_position_embeddings"] == MAX_SEQ_LEN, config
    return hf


# ---- nf-eval ------------------------------------------------------------------------------------

def run_nf_eval(tools, work, task_files):
    out, examples = work / "nf_eval.json", work / "nf_eval.examples.jsonl"
    command = [tools["nf_eval"], "--checkpoint", work / "run" / "checkpoints", "--dataset",
               work / "documents", "--part", "all", "--tokenizer", "gpt2", "--vocab-file",
               work / "vocab.json", "--merges-file", work / "merges.txt", "--out", out,
               "--examples-out", examples, "--batch-size", "3"]
    for task, path in task_files.items():
        command += ["--task", f"{task}={path}"]
    run(*command)
    by_task = {}
    for line in examples.read_text().splitlines():
        line = json.loads(line)
        by_task.setdefault(line["task"], []).append(line)
    return json.loads(out.read_text()), by_task


# ---- the harness --------------------------------------------------------------------------------

def model_args(hf, add_bos_token):
    args = {"pretrained": str(hf), "trust_remote_code": True, "max_length": S,
            "dtype": "float32", "softmax_dtype": "float64"}
    if add_bos_token:
        args["add_bos_token"] = True
    return args


def run_harness_tasks(work, hf):
    """simple_evaluate on the five tasks, recording every request's tokens. Returns (results,
    {task: {doc_id: [(loglik, greedy)] per choice}}, {(context, continuation): (context ids,
    continuation ids)})."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    recorded = {}

    class RecordingHFLM(HFLM):
        def _loglikelihood_tokens(self, requests, **kwargs):
            for strings, context, continuation in requests:
                recorded[tuple(strings)] = (list(context), list(continuation))
            return super()._loglikelihood_tokens(requests, **kwargs)

    lm = RecordingHFLM(batch_size=3, device="cpu", **model_args(hf, add_bos_token=True))
    output = lm_eval.simple_evaluate(
        model=lm, tasks=list(HARNESS_TASK.values()),
        task_manager=TaskManager(include_path=str(TASK_DIR), include_defaults=False),
        log_samples=True, bootstrap_iters=0)
    scores = {}
    for name, task in HARNESS_TASK.items():
        scores[name] = {s["doc_id"]: [(float(r[0][0]), bool(r[0][1])) for r in s["resps"]]
                        for s in output["samples"][task]}
        assert sorted(scores[name]) == list(range(len(TASKS[name]))), (name, scores[name])
    return output["results"], scores, recorded


def run_harness_perplexity(work, hf):
    """The harness's command line, as docs/checkpoints.md gives it: the rolling log-likelihood of
    perplexity.jsonl's one document."""
    args = ",".join(f"{k}={v}" for k, v in model_args(hf, add_bos_token=False).items())
    run(sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", args,
        "--include_path", TASK_DIR, "--tasks", "nf_perplexity", "--device", "cpu",
        "--batch_size", "3", "--output_path", work / "harness_ppl", "--log_samples", cwd=work)
    samples = glob.glob(str(work / "harness_ppl" / "**" / "samples_nf_perplexity_*.jsonl"),
                        recursive=True)
    assert len(samples) == 1, samples
    lines = [json.loads(line) for line in pathlib.Path(samples[0]).read_text().splitlines()]
    assert len(lines) == 1, lines
    return float(lines[0]["resps"][0][0])


# ---- the checks ---------------------------------------------------------------------------------

def check_requests(tok, eod, recorded, nf_lines):
    """The harness's requests are nf-eval's: its prompts, and each request's tokens (context ids
    + continuation ids, the last S + 1 of them) are nf-eval's rule's."""
    truncated = {}
    for name, lines in TASKS.items():
        for index, (line, nf_line) in enumerate(zip(lines, nf_lines[name])):
            for choice, (context, continuation) in enumerate(harness_requests(name, line)):
                assert (context, continuation) in recorded, (name, index, context, continuation)
                context_ids, continuation_ids = recorded[(context, continuation)]
                tokens, scored, was_truncated = nf_sequence(tok, eod, context, continuation)
                harness = (context_ids + continuation_ids)[-(S + 1):]
                assert harness == tokens and len(continuation_ids) == scored, (
                    name, index, choice, harness, tokens)
                assert nf_line["tokens"][choice] == scored, (name, index, nf_line, scored)
                truncated[name] = truncated.get(name, 0) + was_truncated
                if name not in ("winogrande", "lambada"):
                    # acc_norm's length: the harness's len(choice), the continuation without the
                    # target delimiter.
                    assert nf_line["characters"][choice] == len(continuation) - 1, (
                        f"{name} example {index} choice {choice}: nf-eval's length "
                        f"{nf_line['characters'][choice]}, the harness's len(choice) "
                        f"{len(continuation) - 1} ({continuation[1:]!r})")
    print(f"{len(recorded)} harness requests: the same tokens as nf-eval's rule; truncated "
          f"{truncated}")
    return truncated


def argmax_margin(scores):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[0], (scores[order[0]] - scores[order[1]]) if len(scores) > 1 else math.inf


def check_scores(nf_result, nf_lines, harness_results, harness_scores, truncated):
    """Every choice's log-likelihood, LAMBADA's greedy flags, and each task's accuracies.
    Returns the docs' table: per task (examples, acc, acc_norm, the largest log-likelihood
    difference of a choice and per token)."""
    table = {}
    for name in TASKS:
        worst, worst_per_token = 0.0, 0.0
        for nf_line in nf_lines[name]:
            index = nf_line["index"]
            harness = harness_scores[name][index]
            assert len(harness) == len(nf_line["loglik"]), (name, nf_line, harness)
            for i, (loglik, greedy) in enumerate(harness):
                difference = abs(loglik - nf_line["loglik"][i])
                worst = max(worst, difference)
                worst_per_token = max(worst_per_token, difference / nf_line["tokens"][i])
                assert difference <= TOLERANCE_PER_TOKEN * nf_line["tokens"][i], (
                    f"{name} example {index} choice {i}: the harness's log-likelihood {loglik}, "
                    f"nf-eval's {nf_line['loglik'][i]} ({nf_line['tokens'][i]} tokens)")
                if name == "lambada":
                    assert greedy == bool(nf_line["greedy"][i]), (name, nf_line, greedy)
            if name != "lambada":
                # Exact accuracies need predictions that fp32 rounding cannot flip.
                for length in (None, "characters"):
                    scores = [ll / (nf_line[length][i] if length else 1)
                              for i, ll in enumerate(nf_line["loglik"])]
                    assert argmax_margin(scores)[1] > NEAR_TIE, (name, nf_line, length)
        nf_task = nf_result["tasks"][name]
        assert nf_task["truncated"] == truncated.get(name, 0), (name, nf_task, truncated)
        harness_task = harness_results[HARNESS_TASK[name]]
        row = {"examples": nf_task["examples"], "worst": worst, "worst_per_token": worst_per_token}
        for metric in METRICS[name]:
            assert harness_task[f"{metric},none"] == nf_task[metric], (
                name, metric, harness_task, nf_task)
            row[metric] = nf_task[metric]
        if name == "lambada":
            greedy = [flag for line in nf_lines[name] for flag in line["greedy"]]
            assert any(greedy) and not all(greedy), ("LAMBADA's words must be predicted greedily "
                                                     "and not: retrain or change the data", greedy)
            ppl = harness_task["perplexity,none"]
            assert abs(ppl - nf_task["ppl"]) <= 1e-4 * nf_task["ppl"], (ppl, nf_task)
            row["ppl"] = (ppl, nf_task["ppl"])
        table[name] = row
    print("task        examples  acc (both)  acc_norm (both)  largest |log-likelihood difference|"
          " (per token)")
    for name, row in table.items():
        acc_norm = f"{row['acc_norm']:15.4f}" if "acc_norm" in row else f"{'-':>15}"
        print(f"{name:11} {row['examples']:8}  {row['acc']:10.4f}  {acc_norm}  "
              f"{row['worst']:.2e} ({row['worst_per_token']:.2e}; tolerance "
              f"{TOLERANCE_PER_TOKEN:.0e} per token)")
    print(f"LAMBADA ppl: harness {table['lambada']['ppl'][0]:.6f}, nf-eval "
          f"{table['lambada']['ppl'][1]:.6f}")
    return table


def check_perplexity(nf_result, harness_loglik, count):
    ppl = nf_result["perplexity"]
    assert ppl["tokens"] == count and ppl["windows"] == count // S, (ppl, count)
    harness_loss = -harness_loglik / count
    difference = abs(harness_loss - ppl["loss"])
    assert difference <= TOLERANCE_PER_TOKEN, (harness_loss, ppl)
    print(f"perplexity over {count} tokens in {count // S} windows: harness "
          f"{math.exp(harness_loss):.6f}, nf-eval {ppl['ppl']:.6f} (loss difference "
          f"{difference:.2e}, tolerance {TOLERANCE_PER_TOKEN:.0e})")


def main():
    nf_launch, nf_ckpt, nf_preprocess, nf_eval = sys.argv[1:5]
    tools = {"nf_launch": nf_launch, "nf_ckpt": nf_ckpt, "nf_preprocess": nf_preprocess,
             "nf_eval": nf_eval}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        # Offline, and every cache (datasets, the remote code's module copy) in the temp dir.
        os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                          HF_HOME=str(work / "hf_home"), TOKENIZERS_PARALLELISM="false")
        import torch
        torch.set_num_threads(1)

        train(tools, work)
        hf = export(tools, work)
        tok = nfe.hf_tokenizer(work)
        eod = tok.token_to_id(EOT)
        task_files = write_tasks(work)
        text, count = write_perplexity_text(tools, work, tok)
        nf_result, nf_lines = run_nf_eval(tools, work, task_files)
        os.chdir(work)  # the task files name their data relative to the working directory
        harness_results, harness_scores, recorded = run_harness_tasks(work, hf)
        truncated = check_requests(tok, eod, recorded, nf_lines)
        check_scores(nf_result, nf_lines, harness_results, harness_scores, truncated)
        check_perplexity(nf_result, run_harness_perplexity(work, hf), count)
        os.chdir(HERE)
    print("OK")


if __name__ == "__main__":
    main()
