#!/usr/bin/env bash
# `weft ckpt import` and `export` stream: a 470M-parameter Llama-shaped model (1.88 GB in
# float32, two bf16 shards, embedding and output layer of 128 MiB each in float32, more than one
# 64 MiB write block) imports with a peak host memory under half its float32 size (an import
# that held every weight, as before, peaked at 2.43 GB), the values arrive exactly, and the
# export back to bf16 (three shards) peaks under half too and gives every tensor's bytes back.
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
below_half() {
  python3 - "$1" "$params" "$2" <<'PY'
import sys
peak, params, what = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
limit = params * 4e-9 / 2
print(f"{what}: peak {peak:.2f} GB, limit {limit:.2f} GB (half of {params} float32 parameters)")
sys.exit(0 if peak < limit else 1)
PY
}
below_half "$peak" import
python3 "$here/hf_import_memory.py" check "$dir/hf" "$dir/ck"
"$weft" ckpt verify "$dir/ck"
out=$("$weft" ckpt export --dtype bf16 --max-shard-size 400MB "$dir/ck" "$dir/hf2")
echo "$out"
peak=$(sed -n 's/.*peak host memory \([0-9.]*\) GB.*/\1/p' <<< "$out")
[ -n "$peak" ] || { echo "FAIL: no peak host memory in the export's output"; exit 1; }
below_half "$peak" export
ls "$dir/hf2"
python3 "$here/hf_import_memory.py" same "$dir/hf" "$dir/hf2"
echo PASS
