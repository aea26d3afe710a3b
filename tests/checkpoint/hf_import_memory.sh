#!/usr/bin/env bash
# `weft ckpt import` streams: a 470M-parameter Llama-shaped model (1.88 GB in float32, two bf16
# shards, embedding and output layer of 128 MiB each in float32, more than one 64 MiB write
# block) imports with a peak host memory under half its float32 size (an import that held every
# weight, as before, peaked above 2.3 GB), and the values arrive exactly.
# Usage: hf_import_memory.sh WEFT
set -euo pipefail
weft=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
params=$(python3 "$here/hf_import_memory.py" "$dir/hf" 24 1024 4096 32768)
out=$("$weft" ckpt import "$dir/hf" "$dir/ck")
echo "$out"
peak=$(sed -n 's/.*peak host memory \([0-9.]*\) GB.*/\1/p' <<< "$out")
[ -n "$peak" ] || { echo "FAIL: no peak host memory in the import's output"; exit 1; }
python3 - "$peak" "$params" <<'PY'
import sys
peak, params = float(sys.argv[1]), int(sys.argv[2])
limit = params * 4e-9 / 2
print(f"peak {peak:.2f} GB, limit {limit:.2f} GB (half of {params} float32 parameters)")
sys.exit(0 if peak < limit else 1)
PY
python3 "$here/hf_import_memory.py" check "$dir/hf" "$dir/ck"
"$weft" ckpt verify "$dir/ck"
echo PASS
