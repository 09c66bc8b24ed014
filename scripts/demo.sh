#!/usr/bin/env bash
# The README's first command: installs what is missing, builds normformer, and runs the main
# job on its embedded default:
#   1. the demo corpus: the English text of Debian's `fortunes` package as JSONL (15k documents,
#      2.5 MB; scripts/make-demo-corpus.py), kept in corpora/demo/ (git-ignored);
#   2. nf-preprocess: a 512-piece SentencePiece tokenizer trained on it, and the tokens as a
#      Megatron-compatible .bin/.idx pair (both cached for later runs);
#   3. mpirun -np 4 nf-launch: the tiny NormFormer (deploy/configs/tiny.pbtxt) trained on the
#      CPU with tensor parallel 2 x pipeline parallel 2 for 300 steps into runs/demo: stopped
#      at step 150 as a preempted job would be, resumed from its checkpoint by the same
#      command, validation perplexity against the untrained model (a few minutes on 2 cores);
#   4. nf-generate: a few lines from the trained model on the same 4 ranks (a KV cache per rank).
# Extra arguments go to nf-launch, e.g.
#   scripts/demo.sh --set train.precision=BF16 --set model.normformer.scale_fc=false
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${NF_JOBS:-2}" --target nf-launch nf-preprocess nf-ckpt nf-generate

corpus=corpora/demo/fortunes.jsonl
prefix=corpora/demo/fortunes_spm512
[[ -f "$corpus" ]] || python3 scripts/make-demo-corpus.py "$corpus"
if [[ ! -f "$prefix.idx" ]]; then
  # SentencePiece's trainer logs ~100 lines; keep them out of the way.
  build/tools/nf-preprocess --input "$corpus" --output-prefix "$prefix" --workers 2 \
    --tokenizer sentencepiece --spm-train-vocab-size 512 2>corpora/demo/preprocess.log
fi

run_dir=runs/demo
rm -rf "$run_dir"
# Four MPI ranks: tensor parallel 2 x pipeline parallel 2. Validation perplexity on the
# held-out documents before training and every 100 steps, a checkpoint every 100 steps.
launch=(mpirun --oversubscribe --allow-run-as-root -np 4
        build/tools/nf-launch --config deploy/configs/tiny.pbtxt --set data.path="$prefix"
        --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
        --set train.eval_interval=100 --set checkpoint.save_interval=100 --run-dir "$run_dir")
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers without ptrace permission

echo "demo: training on 4 ranks; the first run stops itself after step 150 (train.exit_interval),"
echo "      as a preempted job would, with a checkpoint and exit code 3"
status=0
"${launch[@]}" --set train.exit_interval=150 "$@" || status=$?
if ((status != 3)); then
  echo "demo: expected the first run to stop with exit code 3, got $status" >&2
  exit 1
fi
echo "demo: the same command again resumes from the latest checkpoint and finishes"
"${launch[@]}" "$@"
echo "demo: a few lines from the trained model (nf-generate, top-p 0.9, seed 1):"
mpirun --oversubscribe --allow-run-as-root -np 4 build/eval/nf-generate \
  --checkpoint "$run_dir/checkpoints" --tp 2 --pp 2 --tokenizer sentencepiece \
  --spm-model "$prefix.spm.model" --prompt "" --prompt "You will" --prompt "The secret of" \
  --max-new-tokens 40 --top-p 0.9 --seed 1
cat <<EOF
demo: done. Look at
  $run_dir/log.jsonl          one record per step (loss, lr, grad norm, tokens/s, ...) and
                               events ("stragglers" every log interval, spikes)
  $run_dir/validation.jsonl   validation loss and perplexity (step 0: the untrained model;
                               a uniform guess over the 512 tokens scores ln 512 = 6.24)
  $run_dir/checkpoints/       build/tools/nf-ckpt inspect $run_dir/checkpoints
  docs/parallelism.md, docs/checkpoints.md, docs/guide.md ("Generate text": nf-generate)
EOF
