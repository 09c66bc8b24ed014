#!/usr/bin/env bash
# The README's first command: installs what is missing, builds normformer, and runs the main
# job on its embedded default:
#   1. the demo corpus: the English text of Debian's `fortunes` package as JSONL (15k documents,
#      2.5 MB; scripts/make-demo-corpus.py), kept in corpora/demo/ (git-ignored);
#   2. nf-preprocess: a 512-piece SentencePiece tokenizer trained on it, and the tokens as a
#      Megatron-compatible .bin/.idx pair (both cached for later runs);
#   3. nf-launch: the tiny NormFormer (deploy/configs/tiny.pbtxt) trained on the CPU for 300
#      steps (about a minute on 2 cores) into runs/demo, ending with a checkpoint in
#      runs/demo/checkpoints/.
# Extra arguments go to nf-launch, e.g.
#   scripts/demo.sh --set train.train_iters=50 --set train.precision=BF16
# (The multi-rank demo and validation perplexity join with the launcher issue; multi-rank
# training itself: docs/parallelism.md.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${NF_JOBS:-2}" --target nf-launch nf-preprocess

corpus=corpora/demo/fortunes.jsonl
prefix=corpora/demo/fortunes_spm512
[[ -f "$corpus" ]] || python3 scripts/make-demo-corpus.py "$corpus"
if [[ ! -f "$prefix.idx" ]]; then
  # SentencePiece's trainer logs ~100 lines; keep them out of the way.
  build/data/nf-preprocess --input "$corpus" --output-prefix "$prefix" --workers 2 \
    --tokenizer sentencepiece --spm-train-vocab-size 512 2>corpora/demo/preprocess.log
fi

run_dir=runs/demo
rm -rf "$run_dir"
build/launcher/nf-launch --config deploy/configs/tiny.pbtxt --set data.path="$prefix" \
  --run-dir "$run_dir" "$@"
echo "demo: the run is in $run_dir (config.pbtxt, log.jsonl, checkpoints/); a uniform guess over the 512"
echo "      tokens would score a loss of ln 512 = 6.24"
