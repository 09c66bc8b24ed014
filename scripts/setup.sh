#!/usr/bin/env bash
# Installs the Debian packages normformer builds and tests with, only those that are missing.
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
  python3
  fortunes  # English text for the demo corpus (scripts/make-demo-corpus.py)
  clang libclang-rt-14-dev  # libFuzzer, for the fuzz pass of scripts/test.sh
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

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
