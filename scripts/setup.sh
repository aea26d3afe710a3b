#!/usr/bin/env bash
# Installs weft's build dependencies on Debian 12 (idempotent: apt runs only when a package is
# missing) and builds weft into build/. Used by scripts/run.sh, scripts/test.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build ccache libtorch-dev libopenmpi-dev openmpi-bin
      nlohmann-json3-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      libsentencepiece-dev fortunes libprotobuf-dev protobuf-compiler gnuplot-nox)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

JOBS=${WEFT_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
