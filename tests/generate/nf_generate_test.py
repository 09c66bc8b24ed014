"""nf-generate end to end (issue 18).

A tiny NormFormer (2 layers, d 32, 4 heads, every NormFormer operation on) is trained 200 steps (sequences of 64)
with nf-launch on a small synthetic corpus (documents of one or two sentences) tokenized by the toy GPT-2 BPE of
tests/eval/nf_eval_test.py, so its NormFormer scales have moved and it has learned the corpus's
words and where documents end.

Checked:
  - the KV cache: kv_cache_layout decodes 24 greedy tokens through the cache and compares every
    step's logits with a full forward of the whole prefix, on one process and under mpirun on
    tensor parallel 2 and pipeline parallel 2: the largest difference over every step and the
    whole vocabulary within KV_TOLERANCE, the same tokens on every layout;
  - nf-generate greedy on the three layouts: the same ids and text, the ids those of
    kv_cache_layout from the same context, the text the ids decoded by Hugging Face tokenizers
    (an independent GPT-2 byte-level decoder), a document that ends (the end-of-document token
    stops it and is not part of its ids) and --max-new-tokens;
  - seeded sampling (temperature, top-k, top-p) gives the same text on every layout, and another
    seed another text;
  - prompts from a plain file and a JSON Lines file; refusals (exit 2) of bad options;
  - train.samples: RUN/samples.jsonl holds each prompt's sample at every validation (steps 0,
    100, 200), decoded as HF decodes, and the last ones (greedy) are nf-generate's on the final
    checkpoint; the same for a 20-step run on tensor parallel 2 x pipeline parallel 2 (4 ranks),
    its checkpoint generated from on tensor parallel 2.

Tolerance. Both sides compute in fp32 and differ only in the order of their sums (a [1, keys]
score row instead of [seq, seq], a one-token GEMM instead of a [T, d] one, and on tensor
parallel the all-reduce's order): a few fp32 roundings of the logits' scale (~10), i.e. ~1e-6.
KV_TOLERANCE 2e-5 leaves room and is far below what a wrong position or mask gives (> 1e-2).

usage: nf_generate_test.py NF_LAUNCH NF_PREPROCESS NF_GENERATE KV_CACHE_LAYOUT MPIRUN...
"""
import json
import pathlib
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "eval"))
import nf_eval_test  # noqa: E402  (its toy tokenizer and corpus)
from tokenizers import decoders  # noqa: E402

KV_TOLERANCE = 2e-5
SEQ = 64
SAMPLE_TOKENS = 16  # train.samples.max_new_tokens
NEW = 48  # --max-new-tokens: room for a document's end after each prompt
LAYOUTS = {"one process": (1, 1), "tensor parallel 2": (2, 1), "pipeline parallel 2": (1, 2)}


def run(*args, check=True):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result



def write_corpus(path, documents=600, seed=3):
    """Documents of one or two of nf_eval_test's sentences: short enough that the model learns
    where they end, so greedy generation stops at the end-of-document token."""
    rng = random.Random(seed)
    with open(path, "w") as out:
        for _ in range(documents):
            text = " ".join(nf_eval_test.sentence(rng) for _ in range(rng.randint(1, 2)))
            out.write(json.dumps({"text": text}) + "\n")


def check_training_samples(run_dir, generate, hf, steps=(0, 100, 200), layout=False):
    lines = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [(line["step"], line["prompt"]) for line in lines] == \
        [(step, prompt) for step in steps for prompt in ["The cat", ""]], lines
    for line in lines:
        assert line["text"] == hf.decode(line["ids"]) and len(line["ids"]) <= SAMPLE_TOKENS, line
    name = "tensor parallel 2" if layout else "one process"
    checkpoint = ["--checkpoint", run_dir / "checkpoints"]
    _, generated = generate(name, *checkpoint, "--prompt", "The cat", "--prompt", "", "--greedy",
                            "--max-new-tokens", SAMPLE_TOKENS)
    assert [line["ids"] for line in lines[-2:]] == [g["ids"] for g in generated], (lines, generated)
    print(f"train.samples of {run_dir.name}, step {lines[-1]['step']}:",
          [line["prompt"] + line["text"] for line in lines[-2:]])


def main():
    nf_launch, nf_preprocess, nf_generate, kv_cache_layout = sys.argv[1:5]
    mpirun = sys.argv[5:]
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        eod, vocab = nf_eval_test.write_tokenizer(work)
        write_corpus(work / "corpus.jsonl")
        tokenizer = ["--tokenizer", "gpt2", "--vocab-file", work / "vocab.json",
                     "--merges-file", work / "merges.txt"]
        run(nf_preprocess, "--input", work / "corpus.jsonl", "--output-prefix", work / "corpus",
            *tokenizer)
        samples = f"""samples {{ prompts: "The cat" prompts: "" max_new_tokens: {SAMPLE_TOKENS}
                    temperature: 0 tokenizer: "gpt2" vocab_file: "{work / 'vocab.json'}"
                    merges_file: "{work / 'merges.txt'}" }}"""
        (work / "run.pbtxt").write_text(f"""
          model {{ num_layers: 2 d_model: 32 num_heads: 4 ffn_dim: 64 vocab_size: {vocab}
                  max_seq_len: {SEQ} dropout: 0 }}
          train {{ seq_len: {SEQ} micro_batch_size: 4 global_batch_size: 8 train_iters: 200
                  optimizer {{ lr: 1e-2 }} lr_schedule {{ warmup_iters: 5 }}
                  eval_interval: 100 eval_iters: 2 {samples} }}
          data {{ path: "{work / 'corpus'}" }}
        """)
        run(nf_launch, "--config", work / "run.pbtxt", "--run-dir", work / "run")
        checkpoint = work / "run" / "checkpoints"
        latest = checkpoint / (checkpoint / "latest").read_text().strip()
        hf = nf_eval_test.hf_tokenizer(work)
        hf.decoder = decoders.ByteLevel()
        context = [eod] + hf.encode("The cat").ids

        # ---- the KV cache against full recomputes, on every layout
        cached_ids = {}
        for name, (tp, pp) in LAYOUTS.items():
            command = [kv_cache_layout, latest, tp, pp, 24, *context]
            if tp * pp > 1:
                command = [*mpirun, "-np", tp * pp, *command]
            result = json.loads(run(*command).stdout)
            print(f"KV cache vs full forward, {name}: max |difference| {result['max_abs_diff']:.3g}")
            assert result["max_abs_diff"] <= KV_TOLERANCE, (name, result)
            cached_ids[name] = result["ids"]
        assert len(set(map(tuple, cached_ids.values()))) == 1, cached_ids

        def generate(name, *args):
            tp, pp = LAYOUTS[name]
            out = work / f"out_{tp}_{pp}.jsonl"
            command = [nf_generate, "--checkpoint", checkpoint, *tokenizer, "--out", out, *args]
            if tp * pp > 1:
                command = [*mpirun, "-np", tp * pp, *command, "--tp", tp, "--pp", pp]
            stdout = run(*command).stdout
            return stdout, [json.loads(line) for line in out.read_text().splitlines()]

        # ---- greedy: the same on every layout, the cache check's tokens, decoded as HF does
        prompts = ["--prompt", "The cat", "--prompt", "A bird ran to the", "--prompt", ""]
        greedy = {name: generate(name, *prompts, "--greedy", "--max-new-tokens", NEW)
                  for name in LAYOUTS}
        stdout, lines = greedy["one process"]
        for name, (other_stdout, other) in greedy.items():
            assert other == lines and other_stdout == stdout, (name, other, lines)
        print(stdout)
        first = lines[0]
        assert first["prompt"] == "The cat" and first["prompt_ids"] == context[1:], first
        # The cache check fed 24 tokens past the context without stopping at the document's end.
        stop = cached_ids["one process"].index(eod) if eod in cached_ids["one process"] else 24
        assert first["ids"][:24] == cached_ids["one process"][:stop], (first, cached_ids)
        for line in lines:
            assert eod not in line["ids"]
            assert line["text"] == hf.decode(line["ids"]), line
            room = min(NEW, SEQ - 1 - len(line["prompt_ids"]))
            assert line["ended_document"] == (len(line["ids"]) < room), line
            assert stdout.count(line["prompt"] + line["text"]) >= 1
        assert any(line["ended_document"] for line in lines), "no document ended: retrain longer"
        _, short = generate("one process", *prompts, "--greedy", "--max-new-tokens", 3)
        assert [len(line["ids"]) for line in short] == [3, 3, 3]
        assert [line["ids"] for line in short] == [line["ids"][:3] for line in lines]

        # ---- seeded sampling: the same text on every layout; another seed, another text
        sampling = ["--temperature", "0.9", "--top-k", "20", "--top-p", "0.95",
                    "--max-new-tokens", NEW]
        sampled = {name: generate(name, *prompts, *sampling, "--seed", 5)[1] for name in LAYOUTS}
        base = sampled["one process"]
        assert all(other == base for other in sampled.values()), sampled
        other_seed = generate("one process", *prompts, *sampling, "--seed", 6)[1]
        assert [line["ids"] for line in other_seed] != [line["ids"] for line in base]

        # ---- prompt files
        (work / "prompts.txt").write_text("The cat\n\nA bird ran to the\n")
        from_file = generate("one process", "--prompt-file", work / "prompts.txt", "--greedy",
                             "--max-new-tokens", NEW)[1]
        assert from_file == lines[:2], from_file
        (work / "prompts.jsonl").write_text(
            json.dumps({"prompt": "The cat"}) + "\n" + json.dumps({"text": ""}) + "\n")
        from_jsonl = generate("one process", "--prompt-file", work / "prompts.jsonl", "--greedy",
                              "--max-new-tokens", NEW)[1]
        assert from_jsonl == [lines[0], lines[2]], from_jsonl

        # ---- train.samples: RUN/samples.jsonl at every validation; the last validation's greedy
        # samples are nf-generate's on the final checkpoint (the same parameters)
        check_training_samples(work / "run", generate, hf)
        (work / "tp2_pp2.pbtxt").write_text(
            (work / "run.pbtxt").read_text().replace("train_iters: 200", "train_iters: 20")
            .replace("eval_interval: 100", "eval_interval: 10")
            + "parallel { tensor_parallel: 2 pipeline_parallel: 2 }\n")
        run(*mpirun, "-np", 4, nf_launch, "--config", work / "tp2_pp2.pbtxt", "--run-dir",
            work / "tp2_pp2")
        check_training_samples(work / "tp2_pp2", generate, hf, steps=[0, 10, 20], layout=True)

        # ---- refusals
        for args, message in [([], "--tokenizer must be gpt2 or sentencepiece"),
                              ([*tokenizer, "--top-p", "0"], "--top-p must lie in (0, 1]"),
                              ([*tokenizer, "--temperature", "-1"], "--temperature must be"),
                              ([*tokenizer, "--greedy", "--temperature", "2"],
                               "give one of --greedy and --temperature, not both"),
                              ([*tokenizer, "--prompt-file", work], "is a directory"),
                              ([*tokenizer, "--tp", "2"], "needs 2 ranks"),
                              # --out never lands in a checkpoint or over an input (it used to
                              # exit 0 over a manifest, or replace `latest` with JSON).
                              ([*tokenizer, "--out", latest / "manifest.pb"],
                               f"is inside checkpoint {latest}"),
                              ([*tokenizer, "--out", checkpoint / "latest"],
                               "is inside the checkpoints directory"),
                              ([*tokenizer, "--out", work / "merges.txt"],
                               "is --merges-file")]:
            manifest = (latest / "manifest.pb").read_bytes()
            result = run(nf_generate, "--checkpoint", checkpoint, *args, check=False)
            assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
            assert (latest / "manifest.pb").read_bytes() == manifest, args
    print("OK")


if __name__ == "__main__":
    main()
