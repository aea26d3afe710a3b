#!/usr/bin/env bash
# weft with --device cuda added to `train` (for running tests/app scripts on the GPU machine).
b=$(cd "$(dirname "$0")/../.." && pwd)/build-cuda/app/weft
if [ "$1" = train ]; then shift; exec "$b" train --device cuda "$@"; fi
exec "$b" "$@"
