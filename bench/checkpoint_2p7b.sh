#!/usr/bin/env bash
# The checkpoint tools on a real 2.7B checkpoint (deploy/configs/normformer-2.7b.pbtxt: fp16
# parameters, fp32 master weights and both AdamW moments, 37 GB) on a machine with less memory
# than that: per command its wall time, peak resident memory (/usr/bin/time -v), the bytes it
# read and wrote, and the fraction of `dd` it reached on the same disk. The ceiling of a command
# is the time dd needs to read what it read and write what it wrote, at the rates dd reached
# right before it (4 GiB, one sequential stream, the write with fdatasync, the read after the
# page cache was dropped): the disk is shared and its rate drifts by 2x within minutes. Every
# command starts with the page cache dropped (needs root; without it the reads may come from
# memory and the script says so).
#
#   bench/checkpoint_2p7b.sh [DIR]          (default build/ckpt-2p7b; removed at the end)
#   NF_BENCH_KEEP=1 ...                      keeps DIR/zero1, the last checkpoint (for nf-eval)
#   NF_BUILD_DIR=DIR ...                     the tools of another build tree (default build)
#   NF_BENCH_LAYERS=4 bench/checkpoint_2p7b.sh   a quick check at 4 of the 32 layers (a multiple of 4)
#
# Sequence: nf-bench-init-file writes a freshly initialised model (GELU for relu^2, which
# fairseq files cannot name; the same tensors) as a fairseq-named fp16
# safetensors file (5.3 GB; not measured: it stands in for a file from elsewhere); then import
# (to tp 2 x pp 4), verify, inspect --tensors, export --format safetensors and --format fairseq,
# convert to tp 4 x pp 2, and convert that to tp 2 x pp 4 x dp 2 with ZeRO-1; then nf-eval and
# nf-generate on the last checkpoint, in bf16 (wall time and peak memory only). At most two
# checkpoints exist at once: the disk needs twice the checkpoint plus 2 GiB free (76 GB at 32
# layers); the script checks once the file is written. Needs a Release build in build/.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-build/ckpt-2p7b}
layers=${NF_BENCH_LAYERS:-32}
build=${NF_BUILD_DIR:-build}
ckpt=$build/tools/nf-ckpt
for tool in "$ckpt" "$build/bench/nf-bench-init-file"; do
  [[ -x $tool ]] || { echo "checkpoint_2p7b.sh: $tool is missing: build first" >&2; exit 1; }
done
[[ -x /usr/bin/time ]] || { echo "checkpoint_2p7b.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
[[ ! -e $dir ]] || { echo "checkpoint_2p7b.sh: $dir exists: remove it or name another" >&2; exit 1; }

mkdir -p "$dir"
if [[ -n ${NF_BENCH_KEEP:-} ]]; then
  trap 'find "$dir" -mindepth 1 -maxdepth 1 ! -name zero1 -exec rm -rf {} +' EXIT
else
  trap 'rm -rf "$dir"' EXIT
fi

drop_caches() {
  sync
  if ! echo 3 2>/dev/null > /proc/sys/vm/drop_caches; then
    [[ -n ${warned:-} ]] || echo "(cannot drop the page cache: not root; reads may come from memory)"
    warned=1
  fi
}
bytes() { du -sb "$@" | awk '{s += $1} END {printf "%.0f\n", s}'; }

dd_seconds() {  # dd's summary line -> seconds
  sed -E 's/.* copied, ([0-9.]+) s.*/\1/'
}
# dd's rates on this disk now: "write_bytes_per_s read_bytes_per_s".
dd_rates() {
  local file=$dir/dd.bin size=$((4 << 30))
  local ws rs
  ws=$(dd if=/dev/zero of="$file" bs=8M count=$((size >> 23)) conv=fdatasync 2>&1 | tail -1 | dd_seconds)
  drop_caches
  rs=$(dd if="$file" of=/dev/null bs=8M 2>&1 | tail -1 | dd_seconds)
  rm -f "$file"
  awk -v s="$size" -v w="$ws" -v r="$rs" 'BEGIN {printf "%.0f %.0f\n", s / w, s / r}'
}

rows=()
# measure NAME READ_BYTES OUTPUT -- COMMAND...: runs it under /usr/bin/time -v after dropping
# the page cache; the bytes written are OUTPUT's size afterwards.
measure() {
  local name=$1 read=$2 output=$3
  shift 4
  local dd_write dd_read
  read -r dd_write dd_read < <(dd_rates)
  drop_caches
  local report=$dir/time.txt
  echo "== $name: $*"
  /usr/bin/time -v -o "$report" "$@" > "$dir/out.txt" 2>&1 || {
    cat "$dir/out.txt" "$report" >&2
    echo "checkpoint_2p7b.sh: $name failed" >&2
    exit 1
  }
  tail -3 "$dir/out.txt"
  local wall rss written=0
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0;
                      for (i = 1; i <= n; ++i) s = s * 60 + t[i]; print s}' "$report")
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2 * 1024}' "$report")
  [[ -z $output ]] || written=$(bytes "$output")
  rows+=("$name|$wall|$rss|$read|$written|$dd_read|$dd_write")
}

echo "model: normformer-2.7b at $layers of its 32 layers; dir $dir"

# GELU for relu^2: fairseq's transformer_lm cannot name relu^2, so neither the import (of
# fairseq files) nor the fairseq export takes it; the activation has no parameters, so every
# tensor and byte count is the 2.7B's.
"$build/bench/nf-bench-init-file" --config deploy/configs/normformer-2.7b.pbtxt \
  --set "model.num_layers=$layers" --set model.activation=GELU --out "$dir/init.safetensors"
file_bytes=$(bytes "$dir/init.safetensors")
# The peak: two checkpoints of 7 x the file's bytes (fp16 parameters; fp32 master weights and
# moments) during the first convert, the file removed by then; plus 2 GiB to spare.
need=$(( 14 * file_bytes + (2 << 30) ))
free=$(( $(df --output=avail -B1 "$dir" | tail -1) + file_bytes ))
if (( free < need )); then
  echo "checkpoint_2p7b.sh: $dir's disk has $((free >> 30)) GiB free; two checkpoints of $layers layers need $((need >> 30)) GiB (try NF_BENCH_LAYERS=N)" >&2
  exit 1
fi

measure "import (file -> tp 2 x pp 4)" "$file_bytes" "$dir/tp2pp4" -- \
  "$ckpt" import "$dir/init.safetensors" --tp 2 --pp 4 --out "$dir/tp2pp4"
ckpt_bytes=$(bytes "$dir/tp2pp4")
# The parameters' pieces alone (what inspect --tensors and the exports read): 2 of 14 bytes.
param_bytes=$(( ckpt_bytes / 7 ))
measure "verify" "$ckpt_bytes" "" -- "$ckpt" verify "$dir/tp2pp4"
measure "inspect --tensors" "$param_bytes" "" -- "$ckpt" inspect "$dir/tp2pp4" --tensors
measure "export --format safetensors" "$param_bytes" "$dir/plain.safetensors" -- \
  "$ckpt" export "$dir/tp2pp4" --format safetensors --out "$dir/plain.safetensors"
rm "$dir/plain.safetensors"
measure "export --format fairseq" "$param_bytes" "$dir/fairseq.safetensors" -- \
  "$ckpt" export "$dir/tp2pp4" --format fairseq --out "$dir/fairseq.safetensors"
# What came in goes out: the fairseq export of the imported file is the file, byte for byte.
cmp "$dir/init.safetensors" "$dir/fairseq.safetensors"
echo "export --format fairseq gave back the imported file byte for byte"
rm "$dir/fairseq.safetensors" "$dir/init.safetensors"
measure "convert tp 2 x pp 4 -> tp 4 x pp 2" "$ckpt_bytes" "$dir/tp4pp2" -- \
  "$ckpt" convert "$dir/tp2pp4" --tp 4 --pp 2 --dp 1 --out "$dir/tp4pp2"
rm -r "$dir/tp2pp4"
measure "convert -> tp 2 x pp 4 x dp 2, ZeRO-1" "$ckpt_bytes" "$dir/zero1" -- \
  "$ckpt" convert "$dir/tp4pp2" --tp 2 --pp 4 --dp 2 --zero1 --out "$dir/zero1"
"$ckpt" verify "$dir/zero1" | tail -1

# Using the checkpoint without training memory: perplexity and a generated line in bf16, on a
# SentencePiece tokenizer trained on the docs (the model's embedding has 50,257 rows; a smaller
# vocabulary uses the first ones). The values are a fresh initialisation's: the point is what
# it takes to load and run the model, not the text.
cat docs/*.md > "$dir/corpus.txt"
"$build/tools/nf-preprocess" --input "$dir/corpus.txt" --format paragraphs \
  --output-prefix "$dir/docs" --tokenizer sentencepiece --spm-train-vocab-size 4000 \
  > "$dir/preprocess.log" 2>&1 || { cat "$dir/preprocess.log" >&2; exit 1; }
measure "nf-eval --dtype bf16 (2 windows of 256 tokens)" - "" -- \
  "$build/eval/nf-eval" --checkpoint "$dir/zero1" --dataset "$dir/docs" --part all \
  --max-windows 2 --seq-len 256 --batch-size 1 --dtype bf16
measure "nf-generate --dtype bf16 (16 tokens)" - "" -- \
  "$build/eval/nf-generate" --checkpoint "$dir/zero1" --tokenizer sentencepiece \
  --spm-model "$dir/docs.spm.model" --prompt "A checkpoint of" --max-new-tokens 16 --greedy \
  --dtype bf16

echo
echo "normformer-2.7b at $layers layers: checkpoint $ckpt_bytes bytes, file $file_bytes bytes"
echo
echo "| command | wall s | peak RSS MiB | read GB | written GB | MB/s | dd read, write MB/s | of dd |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  IFS='|' read -r name wall rss read written dr dw <<< "$row"
  if [[ $read == - ]]; then  # computes: no disk ceiling
    awk -v n="$name" -v t="$wall" -v m="$rss" \
      'BEGIN {printf "| %s | %.1f | %.0f | - | - | - | - | - |\n", n, t, m / 1048576}'
    continue
  fi
  awk -v n="$name" -v t="$wall" -v m="$rss" -v r="$read" -v w="$written" -v dr="$dr" -v dw="$dw" '
    BEGIN {
      ceiling = r / dr + w / dw
      printf "| %s | %.1f | %.0f | %.2f | %.2f | %.0f | %.0f, %.0f | %.2f |\n", n, t,
             m / 1048576, r / 1e9, w / 1e9, (r + w) / t / 1e6, dr / 1e6, dw / 1e6, ceiling / t
    }'
done
