#!/usr/bin/env bash
# Unpacks Debian's protobuf 3.21 (headers, libprotobuf(-lite), protoc) into DIR (default
# build-pb/, ignored by git) without installing it, for a machine that has no apt access and no
# libprotobuf-dev (the GPU machine): carry DIR there and build with
#   WEFT_PROTOBUF_PREFIX=$PWD/build-pb/usr bash bench/gpu/run.sh build tbcheck
# so that weft's TensorBoard module (libweft_tb.so) is built. Usage: protobuf_prefix.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-pb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download libprotobuf-dev libprotobuf-lite32 libprotobuf32 protobuf-compiler \
  libprotoc32 >/dev/null)
mkdir -p "$DIR"
for d in "$tmp"/*.deb; do dpkg -x "$d" "$DIR"; done
rm -rf "$DIR"/usr/share "$DIR"/usr/lib/*/*.a
echo "protobuf in $DIR/usr ($(du -sh "$DIR" | cut -f1)); protoc: $DIR/usr/bin/protoc"
