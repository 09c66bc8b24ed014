#!/usr/bin/python3
"""scripts/experiment-normformer end to end on a corpus made here (random English words, half
of the documents dictionary entries "Headword, n. definition.", nf-preprocess with a 128-piece
SentencePiece vocabulary) with a 16-wide model shrunk by --set:
a sweep over depths 1 and 2 and learning rates 1e-2 and 30 (far past stable), then the
followup. Checks that
  - a time limit already reached (--hours 0) starts nothing; an arm that nf-launch stops with a
    checkpoint (exit 3, here at train.exit_interval) stops the driver, and the next invocation
    resumes that arm and goes on;
  - every arm ends with arm.json: lr 30 diverged (its training loss climbs above where it
    started), the others done with validation and test losses and the zero-shot headword
    choice's accuracy (nf-eval on RUNS/headword-choice.jsonl); a done arm whose accuracy is
    missing gets it on the next run without training;
  - the followup's seeds and ablations use each variant's lower-loss learning rate;
  - a rerun starts no training; bad arguments are one line and exit 2;
  - scripts/plot-experiment draws the three plots and tabulates every arm;
  - --objective masked (depth 1, rates 3e-3 and 1e-2, 256 steps of 64 sequences an arm)
    trains masked LMs (the run's config has MASKED_LM, the vocabulary plus <mask>) as arms
    mlm-VARIANT-...: the sweep, then the seeds only (no ablations, no headword choice); each
    done arm has nf-eval's masked-LM test perplexity (mask seed 1), which a rerun measures
    again where it is missing; scripts/plot-experiment-mlm draws its plots and tabulates every
    arm.

usage: experiment_normformer_test.py REPO_ROOT BUILD_DIR
"""
import json
import os
import random
import subprocess
import sys
import tempfile

WORDS = ("the a of to and in is it you that he was for on are with as I his they be at one have "
         "this from or had by word but what some we can out other were all there when up use "
         "your how said an each she which do their time if will way about many then them write "
         "would like so these her long make thing see him two has look more day could go come "
         "did number sound no most people my over know water than call first who may down side "
         "been now find")

SHRINK = ["model.d_model=16", "model.num_heads=2", "model.ffn_dim=32", "model.vocab_size=128",
          "model.max_seq_len=16", "train.seq_len=16", "train.micro_batch_size=2",
          "train.global_batch_size=4", "train.eval_iters=2", "data.split=80,10,10"]


def check(condition, message):
    if not condition:
        print("FAIL: " + message)
        sys.exit(1)


def make_corpus(root, build):
    """ROOT/c.{bin,idx,spm.model}: 400 documents, 128 SentencePiece pieces."""
    rng = random.Random(1)
    words = WORDS.split()
    with open(os.path.join(root, "c.jsonl"), "w", encoding="utf-8") as f:
        for k in range(400):
            if k % 2:
                text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 80)))
            else:
                definition = " ".join(rng.choice(words) for _ in range(3))  # fits seq 16
                text = f"{rng.choice(words).capitalize()}ness, n. {definition}."
            f.write(json.dumps({"text": text}) + "\n")
    corpus = os.path.join(root, "c")
    subprocess.run([os.path.join(build, "data", "nf-preprocess"), "--input",
                    corpus + ".jsonl", "--output-prefix", corpus, "--tokenizer",
                    "sentencepiece", "--spm-train-vocab-size", "128"],
                   check=True, capture_output=True)
    return corpus


def check_masked(repo, build, root, corpus):
    """--objective masked end to end, and scripts/plot-experiment-mlm on its arms."""
    runs = os.path.join(root, "mlm-runs")
    command = [os.path.join(repo, "scripts", "experiment-normformer"), "--objective", "masked",
               "--corpus", corpus, "--runs", runs, "--build", build, "--tokens", "262144",
               "--depths", "1", "--lrs", "3e-3,1e-2"]
    # 128 pieces and <mask>; more masked tokens a step than RoBERTa's 15% of 4 x 16, so that
    # the training loss is smooth enough for the driver's divergence test (a loss above the
    # first step's after warmup).
    for setting in SHRINK + ["model.vocab_size=129", "train.micro_batch_size=16",
                             "train.global_batch_size=64", "data.masked_lm.mask_prob=0.5"]:
        command += ["--set", setting]
    done = subprocess.run(command, capture_output=True, text=True)
    check(done.returncode == 0, f"masked: exit {done.returncode}: {done.stdout}{done.stderr}")
    check("every arm of the phases sweep,followup has finished" in done.stdout, done.stdout)
    arms = {}
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name, "arm.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                arms[name] = json.load(f)
    swept = {f"mlm-{v}-L1-lr{lr}-s1" for v in ("preln", "normformer") for lr in ("0.003", "0.01")}
    check(swept <= set(arms) and len(arms) == 8,
          f"masked: {sorted(arms)}: expected 4 swept + 4 seeds")
    best = {v: min((a for a in arms.values() if a["variant"] == v and a["seed"] == 1),
                   key=lambda a: a["final_valid_loss"])["lr"] for v in ("preln", "normformer")}
    for seed in (2, 3):
        for variant, lr in best.items():
            check(f"mlm-{variant}-L1-lr{lr:g}-s{seed}" in arms, f"masked: {variant} seed {seed}")
    for name, arm in arms.items():
        check(arm["status"] == "done", f"{name}: {arm['status']}")
        check(arm["final_valid_loss"] < arm["first_valid_loss"], f"{name}: no learning")
        check("headword_acc" not in arm, f"{name}: a masked LM got the headword choice")
        with open(os.path.join(runs, name, "config.pbtxt"), encoding="utf-8") as f:
            config = f.read()
        check("MASKED_LM" in config and "vocab_size: 129" in config, f"{name}: config {config}")
        with open(os.path.join(runs, name, "test.json"), encoding="utf-8") as f:
            test = json.load(f)["perplexity"]
        check(test["objective"] == "masked_lm" and test["mask_seed"] == 1
              and test["tokens"] > 0 and arm["test_loss"] == test["loss"],
              f"{name}: test {test}, arm {arm.get('test_loss')}")
    check(not os.path.exists(os.path.join(runs, "headword-choice.jsonl")),
          "masked: the headword choice was made")

    # A done arm without its test loss (an nf-eval that refused masked LMs) gets it back on a
    # rerun, which trains nothing.
    evaluated = os.path.join(runs, "mlm-preln-L1-lr0.01-s1", "arm.json")
    with open(evaluated, encoding="utf-8") as f:
        record = json.load(f)
    measured = record["test_loss"]
    record.update(test_loss=None, test_error="refused")
    with open(evaluated, "w", encoding="utf-8") as f:
        json.dump(record, f)
    again = subprocess.run(command, capture_output=True, text=True)
    check(again.returncode == 0 and "training" not in again.stdout, again.stdout + again.stderr)
    check("mlm-preln-L1-lr0.01-s1: test loss" in again.stdout, again.stdout)
    with open(evaluated, encoding="utf-8") as f:
        record = json.load(f)
    check(record["test_loss"] == measured and "test_error" not in record, f"{record}")
    listed = subprocess.run(command + ["--list"], capture_output=True, text=True)
    check(listed.returncode == 0 and "mlm-normformer-L1-lr0.003-s1: done" in listed.stdout,
          listed.stdout + listed.stderr)

    plots = os.path.join(root, "mlm-plots")
    table = os.path.join(root, "mlm-table.md")
    plotted = subprocess.run([os.path.join(repo, "scripts", "plot-experiment-mlm"), runs, "-o",
                              plots, "--table", table], capture_output=True, text=True)
    check(plotted.returncode == 0, f"plot-experiment-mlm: exit {plotted.returncode}: "
          f"{plotted.stderr}")
    for png in ("validation_ppl.png", "followup_ppl.png", "grad_norm_ratio.png"):
        path = os.path.join(plots, png)
        check(os.path.isfile(path) and os.path.getsize(path) > 5000, f"masked: {png} missing")
    with open(table, encoding="utf-8") as f:
        text = f.read()
    for name, arm in arms.items():
        check(f"| {name} | done |" in text, f"{name} not in the masked table:\n{text}")
    check("| learning rate | Pre-LN, 1 layers | NormFormer, 1 layers |" in text, text)
    for variant in ("Pre-LN", "NormFormer"):
        check(f"| {variant} (lr {best['preln' if variant == 'Pre-LN' else 'normformer']:g}, "
              "1 layers) | 1, 2, 3 |" in text, "masked seeds table:\n" + text)
    empty = subprocess.run([os.path.join(repo, "scripts", "plot-experiment-mlm"),
                            os.path.join(root, "nothing")], capture_output=True, text=True)
    check(empty.returncode == 2 and empty.stderr.count("\n") == 1, empty.stderr)


def main():
    repo, build = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as root:
        corpus = make_corpus(root, build)
        runs = os.path.join(root, "runs")
        command = [os.path.join(repo, "scripts", "experiment-normformer"), "--corpus", corpus,
                   "--runs", runs, "--build", build, "--tokens", "262144", "--depths", "1,2",
                   "--lrs", "1e-2,30"]
        for setting in SHRINK:
            command += ["--set", setting]

        # A time limit already reached starts nothing.
        none = subprocess.run(command + ["--hours", "0"], capture_output=True, text=True)
        check(none.returncode == 0 and "time limit (--hours) is reached" in none.stdout,
              f"--hours 0: exit {none.returncode}: {none.stdout}{none.stderr}")
        check(not os.path.exists(os.path.join(runs, "preln-L1-lr0.01-s1", "log.jsonl")),
              "--hours 0 trained")
        # The first arm stops at step 1000 with a checkpoint (nf-launch exit 3, as at a time
        # limit or a signal): the driver stops there.
        first = subprocess.run(command + ["--set", "train.exit_interval=1000"],
                               capture_output=True, text=True)
        check(first.returncode == 0, f"stopped run: exit {first.returncode}: {first.stderr}")
        check("preln-L1-lr0.01-s1: stopped with a checkpoint" in first.stdout, first.stdout)
        stopped = os.path.join(runs, "preln-L1-lr0.01-s1")
        check(not os.path.exists(os.path.join(stopped, "arm.json")), "a stopped arm has arm.json")

        done = subprocess.run(command, capture_output=True, text=True)
        check(done.returncode == 0, f"exit {done.returncode}: {done.stderr}")
        check("every arm of the phases sweep,followup has finished" in done.stdout, done.stdout)
        with open(os.path.join(stopped, "log.jsonl"), encoding="utf-8") as f:
            steps = [json.loads(line)["step"] for line in f]
        check(steps[-1] == 4096, f"the resumed arm ended at step {steps[-1]}")
        check(steps[0] == 1 and len(steps) >= 4096, "the resumed arm's log lacks steps")

        arms = {}
        for name in sorted(os.listdir(runs)):
            path = os.path.join(runs, name, "arm.json")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    arms[name] = json.load(f)
        check(len(arms) == 16, f"{len(arms)} arms finished, expected 8 swept + 8 followup: "
              f"{sorted(arms)}")
        for name, arm in arms.items():
            if arm["lr"] == 30:
                check(arm["status"] == "diverged", f"{name}: lr 30 {arm['status']}")
            else:
                check(arm["status"] == "done", f"{name}: {arm['status']}")
                check(arm["final_valid_loss"] < arm["first_valid_loss"], f"{name}: no learning")
                check(os.path.isfile(os.path.join(runs, name, "test.json")), f"{name}: no test")
                check(arm["headword_examples"] > 10 and 0 <= arm["headword_acc"] <= 1,
                      f"{name}: headword choice {arm.get('headword_acc')} on "
                      f"{arm.get('headword_examples')} examples")
        for seed in (2, 3):
            check(f"preln-L2-lr0.01-s{seed}" in arms and f"normformer-L2-lr0.01-s{seed}" in arms,
                  f"seed {seed} arms missing at the best learning rate")
        for ablation in ("no-post-attn-ln", "no-head-scale", "no-ffn-ln", "fairseq-placement"):
            check(f"normformer-{ablation}-L2-lr0.01-s1" in arms, f"{ablation} missing")

        with open(os.path.join(runs, "headword-choice.jsonl"), encoding="utf-8") as f:
            task = [json.loads(line) for line in f]
        check(len(task) == arms["preln-L1-lr0.01-s1"]["headword_examples"], "task size")
        check(all(t["sentence"].startswith("_ ") and t["option1"] != t["option2"]
                  and t["answer"] in ("1", "2") for t in task), f"task format: {task[0]}")

        # A done arm without the accuracy gets it back; nothing trains again.
        evaluated = os.path.join(runs, "normformer-L1-lr0.01-s1", "arm.json")
        with open(evaluated, encoding="utf-8") as f:
            record = json.load(f)
        accuracy = record.pop("headword_acc")
        with open(evaluated, "w", encoding="utf-8") as f:
            json.dump(record, f)
        outs = {n: os.path.getsize(os.path.join(runs, n + ".out")) for n in arms}
        again = subprocess.run(command, capture_output=True, text=True)
        check(again.returncode == 0 and "training" not in again.stdout, again.stdout)
        check(outs == {n: os.path.getsize(os.path.join(runs, n + ".out")) for n in arms},
              "a rerun trained again")
        check("normformer-L1-lr0.01-s1: headword choice" in again.stdout, again.stdout)
        with open(evaluated, encoding="utf-8") as f:
            check(json.load(f)["headword_acc"] == accuracy, "the re-evaluated accuracy differs")

        # scripts/plot-experiment on these arms: three plots and the tables.
        plots = os.path.join(root, "plots")
        table = os.path.join(root, "table.md")
        plotted = subprocess.run([os.path.join(repo, "scripts", "plot-experiment"), runs, "-o",
                                  plots, "--table", table], capture_output=True, text=True)
        check(plotted.returncode == 0, f"plot-experiment: exit {plotted.returncode}: "
              f"{plotted.stderr}")
        for png in ("validation_ppl.png", "followup_ppl.png", "grad_norm_ratio.png"):
            path = os.path.join(plots, png)
            check(os.path.isfile(path) and os.path.getsize(path) > 5000, f"{png} missing")
        with open(table, encoding="utf-8") as f:
            text = f.read()
        for name, arm in arms.items():
            status = "diverged" if arm["lr"] == 30 else "done"
            check(f"| {name} | {status} |" in text, f"{name} not in the table as {status}")
            if status == "done":
                check(f"| {arm['headword_acc']:.3f} |" in text, f"{name}: no accuracy in the table")
        check("| 2 | NormFormer | 0.01 | 30 |" in text, "stable rates table:\n" + text)
        check("| learning rate | Pre-LN, 1 layers | NormFormer, 1 layers | Pre-LN, 2 layers | "
              "NormFormer, 2 layers |" in text and "| 30 | diverged | diverged | diverged | "
              "diverged |" in text, "learning-rate table:\n" + text)
        check("Pre-LN (lr 0.01, 2 layers) | 1, 2, 3 |" in text, "seeds table:\n" + text)
        # Exported (logs gzipped) and plotted again from the export: the same tables.
        evidence = os.path.join(root, "evidence")
        again_table = os.path.join(root, "again.md")
        exported = subprocess.run([os.path.join(repo, "scripts", "plot-experiment"), runs, "-o",
                                   plots, "--export", evidence], capture_output=True, text=True)
        check(exported.returncode == 0, exported.stderr)
        check(os.path.isfile(os.path.join(evidence, "preln-L1-lr0.01-s1", "log.jsonl.gz")),
              "the export has no gzipped log")
        replotted = subprocess.run([os.path.join(repo, "scripts", "plot-experiment"), evidence,
                                    "-o", os.path.join(root, "plots2"), "--table", again_table],
                                   capture_output=True, text=True)
        check(replotted.returncode == 0, replotted.stderr)
        with open(again_table, encoding="utf-8") as f:
            check(f.read() == text, "the export's tables differ from the runs'")
        empty = subprocess.run([os.path.join(repo, "scripts", "plot-experiment"),
                                os.path.join(root, "nothing")], capture_output=True, text=True)
        check(empty.returncode == 2 and empty.stderr.count("\n") == 1, empty.stderr)

        bad = subprocess.run(command + ["--depths", "4,x"], capture_output=True, text=True)
        check(bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--depths" in bad.stderr,
              f"bad --depths: exit {bad.returncode}: {bad.stderr}")
        missing = subprocess.run(command + ["--corpus", os.path.join(root, "none")],
                                 capture_output=True, text=True)
        check(missing.returncode == 2 and "none.idx is missing" in missing.stderr,
              f"missing corpus: exit {missing.returncode}: {missing.stderr}")
        check_masked(repo, build, root, corpus)
    print("experiment-normformer: ok")


if __name__ == "__main__":
    main()
