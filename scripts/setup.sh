#!/usr/bin/env bash
# Installs the Debian packages normformer builds and tests with, only those that are missing
# (with --experiment also those of scripts/make-experiment-corpus).
# Does nothing (and needs no network) when everything is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  openmpi-bin libopenmpi-dev
  libprotobuf-dev protobuf-compiler
  libabsl-dev
  prometheus-cpp-dev
  libopenblas-dev
  libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libboost-context-dev  # the emulated GPU's kernel threads (tests/emulation)
  python3 python3-venv python3-numpy  # + the safetensors wheel in .venv, below
  fortunes  # English text for the demo corpus (scripts/make-demo-corpus.py)
  clang libclang-rt-14-dev  # libFuzzer, for the fuzz pass of scripts/test.sh
  slurmctld slurmd slurm-client munge  # a one-node Slurm for the requeue test (never started here)
  # promtool for the monitoring tests (deploy/prometheus); the package's own service is not
  # used by them (a container without systemd does not start it), and matplotlib for
  # scripts/plot-run (run by Debian's /usr/bin/python3)
  prometheus python3-matplotlib
  curl  # reads /metrics pages in the monitoring test and the user guide
  iproute2 util-linux  # ip, unshare: the multi-node tests' cluster of network namespaces
)

# --experiment: also the English text of the NormFormer vs Pre-LN experiment
# (scripts/make-experiment-corpus): a dictionary, the King James Bible and its reader.
for arg in "$@"; do
  case "$arg" in
    --experiment) packages+=(dict-gcide bible-kjv bible-kjv-text) ;;
    *) echo "setup: unknown argument '$arg' (known: --experiment)" >&2; exit 2 ;;
  esac
done

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done"
fi

# Hugging Face's safetensors reader (no Debian package), for the test that reads nf-ckpt's
# export with it: a virtual environment in .venv (git-ignored) over Debian's numpy.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if ! "$venv/bin/python" -c "import numpy" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"  # Debian's, which sees its numpy
fi
# The version transformers (below) needs.
if ! "$venv/bin/python" -c "import safetensors
assert safetensors.__version__ == '0.8.0'" 2>/dev/null; then
  echo "setup: installing safetensors into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "safetensors==0.8.0"
fi
# Hugging Face's tokenizers, what Megatron's HuggingFaceTokenizer runs GPT-2's BPE with, for the
# parity test of nf-preprocess's GPT-2 tokenizer (tests/data/hf_tokenizers_parity_test.py).
# --no-deps: only the tokenizer itself is used, not huggingface_hub's download client.
if ! "$venv/bin/python" -c "import tokenizers
assert tokenizers.__version__ == '0.23.3'" 2>/dev/null; then
  echo "setup: installing tokenizers into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "tokenizers==0.23.3"
fi
# The Python package sentencepiece, which users train and encode SentencePiece models with, for
# the test of nf-tokenize's ids against it (tests/data/sentencepiece_reference_test.py).
if ! "$venv/bin/python" -c "import sentencepiece
assert sentencepiece.__version__ == '0.2.3'" 2>/dev/null; then
  echo "setup: installing sentencepiece into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "sentencepiece==0.2.3"
fi
# TensorBoard, whose own event reader reads back the event files nf-launch writes
# (tests/launcher/tensorboard_test.py); with its dependencies (protobuf, grpcio, ...).
if ! "$venv/bin/python" -c "import tensorboard
assert tensorboard.__version__ == '2.18.0'" 2>/dev/null; then
  echo "setup: installing tensorboard into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "tensorboard==2.18.0"
fi
# The cuDNN frontend's C++ headers (core/cuda/cudnn_attention.cc; CMake finds them in .venv).
# --no-deps: only the headers are used, not the Python package's CUTLASS and TVM dependencies.
if ! "$venv/bin/python" -c "import importlib.metadata as m
assert m.version('nvidia-cudnn-frontend') == '1.32.0'" 2>/dev/null; then
  echo "setup: installing the cuDNN frontend headers into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "nvidia-cudnn-frontend==1.32.0"
fi
# Hugging Face's stack, for the tests of nf-ckpt's Hugging Face export and import against
# transformers and of nf-eval against lm-evaluation-harness (tests/checkpoint/hf_*,
# tests/eval/lm_eval_parity_test.py): PyTorch (run on the CPU; PyPI's wheel brings about 3 GB of
# CUDA libraries, 6 GB installed), transformers and lm-eval. It is installed once per machine,
# into a virtual environment under ~/.cache/normformer named by its pins (new pins, a new one),
# which every checkout's .venv reaches through a .pth file; it is built under a temporary name
# and renamed when complete, so an interrupted install is never taken for a finished one. The
# packages it shares with .venv have .venv's pins, so either copy is the same.
# pyarrow: lm-eval's datasets reads its task files with it, and pyarrow 26 refuses the numpy
# (1.26) that the rest resolves to.
hf_pins=(torch==2.15.0 transformers==5.25.0 lm-eval==0.4.13 accelerate==1.16.0
  safetensors==0.8.0 tokenizers==0.23.3 sentencepiece==0.2.3 pyarrow==25.0.1)
hf_key=$(printf '%s\n' "${hf_pins[@]}" | sha256sum | cut -c1-12)
hf_stack="${NF_HF_STACK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/normformer}/hf-stack-$hf_key"
if [[ ! -e "$hf_stack/complete" ]]; then
  echo "setup: installing PyTorch, transformers and lm-eval into $hf_stack (about 3 GB to fetch)"
  mkdir -p "$(dirname "$hf_stack")"
  staging="$hf_stack.tmp-$$"
  rm -rf "$staging"
  /usr/bin/python3 -m venv --system-site-packages "$staging"
  "$staging/bin/python" -m pip install -q --disable-pip-version-check "${hf_pins[@]}"
  touch "$staging/complete"
  rm -rf "$hf_stack"
  mv -T "$staging" "$hf_stack"
fi
hf_site=$("$hf_stack/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$hf_site" >"$venv_site/normformer-hf-stack.pth"
