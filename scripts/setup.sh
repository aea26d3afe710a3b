#!/usr/bin/env bash
# Installs weft's build dependencies on Debian 12 (idempotent: apt runs only when a package is
# missing) and builds weft into build/. Used by scripts/run.sh, scripts/test.sh and .ci/run.
# Where a Python with a CUDA PyTorch and a GPU are found (scripts/detect_torch.sh; WEFT_PYTHON
# picks the interpreter, WEFT_CUDA=0 forces the CPU build), the CUDA path is built against that
# torch and its NCCL instead of Debian's CPU libtorch.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/detect_torch.sh
weft_detect_torch

PKGS=(build-essential cmake ninja-build ccache libopenmpi-dev openmpi-bin
      nlohmann-json3-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      libsentencepiece-dev libicu-dev fortunes libprotobuf-dev protobuf-compiler gnuplot-nox
      python3-regex)
[ "$WEFT_CUDA" = 1 ] || PKGS+=(libtorch-dev)

# A package also counts as present when what weft needs from it is there without dpkg (a GPU
# machine's venv brings cmake and ninja; headers may come from elsewhere).
present() {
  case $1 in
    build-essential) command -v g++ >/dev/null ;;
    cmake|ccache) command -v "$1" >/dev/null ;;
    ninja-build) command -v ninja >/dev/null ;;
    libopenmpi-dev) command -v mpicxx >/dev/null ;;
    openmpi-bin) command -v mpirun >/dev/null ;;
    nlohmann-json3-dev) [ -e /usr/include/nlohmann/json.hpp ] ;;
    libfmt-dev) [ -e /usr/include/fmt/format.h ] ;;
    libcli11-dev) [ -e /usr/include/CLI/CLI.hpp ] ;;
    libgtest-dev) [ -e /usr/include/gtest/gtest.h ] ;;
    libgmock-dev) [ -e /usr/include/gmock/gmock.h ] ;;
    libbenchmark-dev) [ -e /usr/include/benchmark/benchmark.h ] ;;
    libicu-dev) [ -e /usr/include/unicode/uregex.h ] ;;
    libprotobuf-dev) [ -e /usr/include/google/protobuf/message_lite.h ] ;;
    protobuf-compiler) command -v protoc >/dev/null ;;
    gnuplot-nox) command -v gnuplot >/dev/null ;;
    # the tokenizer tests' reference (tests/app/tokenizers.sh also tries Debian's python3)
    python3-regex) python3 -c 'import regex' 2>/dev/null ;;
    *) false ;;
  esac
}
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
  present "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  if ! { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
         $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; }; then
    # Optional parts (SentencePiece, fortunes) only narrow what runs; cmake names what is required.
    echo "setup: could not install ${missing[*]}; building with what is there" >&2
  fi
fi

weft_cmake_args
if [ "$WEFT_CUDA" = 1 ]; then
  echo "setup: CUDA build against torch $WEFT_TORCH_VERSION ($WEFT_PYTHON)"
fi
JOBS=${WEFT_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${WEFT_CMAKE_ARGS[@]}" >/dev/null
cmake --build build -j "$JOBS"
