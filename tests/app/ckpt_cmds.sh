#!/usr/bin/env bash
# `weft ckpt inspect|verify|diff` as a user runs them, exit codes included (app/cmd_ckpt.cpp:
# 0 ok/identical, 1 differences or corruption, 2 bad input). Two tiny training runs make the
# checkpoints: A on 2 ranks (two shard files, two chunks per key), C on 1 rank with another
# --lr and untied embeddings (every shared key differs a little; output_layer.* only in C).
# B is a byte copy of A; B then gets one flipped byte in a shard file's data.
# Usage: ckpt_cmds.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
dir=$(mktemp -d /tmp/weft-ckpt-cmds-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
model=(train --log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --seq-length 16 --vocab-size 64 --micro-batch-size 2 --global-batch-size 4
       --train-iters 2 --eval-interval 0)
"${mpirun[@]}" -np 2 "$weft" "${model[@]}" --save "$dir/a" > "$dir/a.log" 2>&1 ||
  { cat "$dir/a.log"; echo "FAIL: training A"; exit 1; }
"${mpirun[@]}" -np 1 "$weft" "${model[@]}" --lr 0.0002 --untie-embeddings-and-output-weights \
  --save "$dir/c" > "$dir/c.log" 2>&1 || { cat "$dir/c.log"; echo "FAIL: training C"; exit 1; }
cp -r "$dir/a" "$dir/b"
# The same command twice saves byte-identical checkpoints, metadata.json (with every rank's
# generator state) included: the generator is seeded from --seed, not left to the process.
"${mpirun[@]}" -np 2 "$weft" "${model[@]}" --save "$dir/a2" > "$dir/a2.log" 2>&1 ||
  { cat "$dir/a2.log"; echo "FAIL: training A again"; exit 1; }
if diff -r "$dir/a" "$dir/a2" > /dev/null; then echo "ok   (the same run twice: identical files)"
else echo "FAIL (the same run twice: the checkpoints' files differ)"; diff -r "$dir/a" "$dir/a2" | head -3; fails=$((fails + 1)); fi
rm -rf "$dir/a2"

out=""
# run WANT_RC DESCRIPTION ARGS...: runs `weft ARGS`, keeps stdout+stderr in $out, checks the code.
run() {
  local want=$1 what=$2 rc
  shift 2
  out=$("$weft" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL ($what): exit $rc, wanted $want; output:"
    printf '%s\n' "$out" | head -8
    fails=$((fails + 1))
    return 1
  fi
  echo "ok   ($what): exit $rc"
}
# has / hasnt NEEDLE DESCRIPTION: the last run's output does / does not contain NEEDLE.
has() {
  printf '%s\n' "$out" | grep -qF -- "$1" ||
    { echo "FAIL ($2): no '$1' in:"; printf '%s\n' "$out" | head -8; fails=$((fails + 1)); }
}
hasnt() {
  ! printf '%s\n' "$out" | grep -qF -- "$1" ||
    { echo "FAIL ($2): '$1' in:"; printf '%s\n' "$out" | grep -F -- "$1" | head -3
      fails=$((fails + 1)); }
}
count() {  # count PATTERN: lines of the last output matching the extended regex
  printf '%s\n' "$out" | grep -cE -- "$1"
}

# inspect: the iteration, the saving layout, every key with dtype, shape and chunk count.
run 0 "inspect A" ckpt inspect "$dir/a" && {
  has "iteration 2 | consumed samples 8" "inspect A"
  has '"dp":2' "inspect A layout"
  has '"world":2' "inspect A layout"
  printf '%s\n' "$out" | grep -qE '^  embedding\.word_embeddings\.weight +F32 \[64, 32\] 8192 bytes in 2 chunk\(s\)$' ||
    { echo "FAIL (inspect A): embedding line"; fails=$((fails + 1)); }
  has "56 keys, 281088 bytes" "inspect A totals"
}
run 0 "inspect C (an iter_ directory)" ckpt inspect "$dir/c/iter_0000002" && {
  has "output_layer.weight" "inspect C"
  has "in 1 chunk(s)" "inspect C"
  has "60 keys" "inspect C totals"
}
run 2 "inspect a missing directory" ckpt inspect "$dir/nothing" &&
  has "neither a checkpoint" "inspect missing"
run 2 "inspect without DIR" ckpt inspect

# verify: clean checkpoints pass.
run 0 "verify A" ckpt verify "$dir/a" && has "56 keys, 112 chunks, 281088 bytes: all checksums and coverage ok" "verify A"
run 0 "verify C" ckpt verify "$dir/c" && has "all checksums and coverage ok" "verify C"

# diff: identical copies, bitwise.
run 0 "diff A B (copy)" ckpt diff "$dir/a" "$dir/b" && has "0 key(s) differ (bitwise)" "diff A B"
# Another run: every shared key differs, the untied output layer is only in C.
run 1 "diff A C" ckpt diff "$dir/a" "$dir/c" && {
  has "differ: embedding.word_embeddings.weight (max abs diff" "diff A C"
  has "differ: decoder.layers.1.mlp.linear_fc2.weight" "diff A C"
  has "only in B: output_layer.weight" "diff A C"
  has "only in B: optimizer.exp_avg.output_layer.weight" "diff A C"
  n=$(count '^differ: ')
  [ "$n" -eq 56 ] || { echo "FAIL (diff A C): $n differing keys, wanted 56"; fails=$((fails + 1)); }
  has "60 key(s) differ (bitwise)" "diff A C total"
}
run 1 "diff C A" ckpt diff "$dir/c" "$dir/a" && has "only in A: output_layer.weight" "diff C A"
# With a tolerance the small differences pass, the missing keys do not.
run 1 "diff A C --atol 1" ckpt diff "$dir/a" "$dir/c" --atol 1 && {
  hasnt "differ: " "diff A C --atol 1"
  has "4 key(s) differ" "diff A C --atol 1"
  hasnt "(bitwise)" "diff A C --atol 1"
}
run 1 "diff A C --atol 1e-9" ckpt diff "$dir/a" "$dir/c" --atol 1e-9 &&
  has "differ: embedding.word_embeddings.weight" "diff A C --atol 1e-9"
# One model stored in two dtypes (import --dtype source of a bf16 export vs the fp32 default):
# every key differs by dtype only, and diff says the values are the same.
run 0 "export A bf16" ckpt export "$dir/a" "$dir/hf" --dtype bf16
run 0 "import fp32" ckpt import "$dir/hf" "$dir/i32"
run 0 "import source" ckpt import "$dir/hf" "$dir/isrc" --dtype source
run 1 "diff import fp32 vs source" ckpt diff "$dir/i32" "$dir/isrc" && {
  has "differ: embedding.word_embeddings.weight (dtype F32 vs BF16; the same values)" "diff dtypes"
  hasnt "the values differ too" "diff dtypes"
}
run 2 "import --dtype fp16" ckpt import "$dir/hf" "$dir/i16" --dtype fp16 && has "--dtype" "import --dtype fp16"
run 2 "diff with one DIR" ckpt diff "$dir/a"
run 2 "diff --rtol not a number" ckpt diff "$dir/a" "$dir/b" --rtol abc

# One flipped byte in the data of B's second shard file: verify names one bad chunk and exits 1.
f="$dir/b/iter_0000002/shard_00001.safetensors"
hdr=$(od -An -tu8 -N8 "$f" | tr -d ' ')
pos=$((8 + hdr + 100))
byte=$(od -An -tu1 -j "$pos" -N1 "$f" | tr -d ' ')
printf "\\$(printf '%03o' $((byte ^ 1)))" | dd of="$f" bs=1 seek="$pos" conv=notrunc status=none
cmp -s "$f" "$dir/a/iter_0000002/shard_00001.safetensors" &&
  { echo "FAIL: the byte flip did not change $f"; fails=$((fails + 1)); }
run 1 "verify B (flipped byte)" ckpt verify "$dir/b" && {
  has "1 corrupted chunk(s)" "verify B"
  n=$(count '^BAD ')
  [ "$n" -eq 1 ] || { echo "FAIL (verify B): $n BAD lines, wanted 1"; fails=$((fails + 1)); }
  hasnt "all checksums and coverage ok" "verify B"
}
run 0 "verify A after B was corrupted" ckpt verify "$dir/a"
# diff refuses to compare a corrupted chunk (exit 1, not a silent equal).
run 1 "diff A B (flipped byte)" ckpt diff "$dir/a" "$dir/b" && hasnt "0 key(s) differ" "diff A B"
# A shard file that is gone: every chunk in it is bad.
rm "$dir/b/iter_0000002/shard_00000.safetensors"
run 1 "verify B (missing shard)" ckpt verify "$dir/b" &&
  has "57 corrupted chunk(s)" "verify B missing shard"

# A key's recorded shape or dtype that is not its chunks': a damaged index (exit 2, as any
# metadata.json that does not read; the key named), even where every chunk and checksum is intact.
for field in shape dtype; do
  rm -rf "$dir/d"; cp -r "$dir/a" "$dir/d"
  python3 - "$dir/d/iter_0000002/metadata.json" "$field" <<'PY'
import json, sys
path, field = sys.argv[1], sys.argv[2]
m = json.load(open(path))
t = m["tensors"]["decoder.layers.0.mlp.linear_fc2.weight"]
if field == "shape": t["shape"][1] += 1
else: t["dtype"] = "BF16"
json.dump(m, open(path, "w"))
PY
  run 2 "verify a damaged $field record" ckpt verify "$dir/d" &&
    has "key 'decoder.layers.0.mlp.linear_fc2.weight' records $field" "verify damaged $field"
done

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all ckpt command checks passed"
