#!/usr/bin/env bash
# Bad real-data input to `weft train` ends with exit code 2 and one line naming the flag or the
# file, and trains nothing: no "iteration" line, no checkpoint directory. Cases: a missing .idx,
# a truncated .bin, a wrong magic, pointers beyond .bin, an empty dataset, a split that leaves
# the valid split empty while evaluating, blend weights that are negative or do not parse, a
# tokenizer larger than --padded-vocab-size, --mock-data with --data-path, and another tokenizer on
# --load (which --override-tokenizer accepts). One good run must succeed and print its
# validation loss, so the script cannot pass by everything failing.
# The corpus is generated here (awk, no python), the tokenizers and datasets are made with
# `weft data train-tokenizer` and `weft data preprocess`, the broken files from them with dd.
# Usage: bad_data_input.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"

# --- a corpus, two tokenizers, a dataset ---------------------------------------------------------
# words from syllables, drawn by a fixed LCG so the corpus is the same on every machine
gen_text() {  # gen_text SEED LINES
  awk -v seed="$1" -v n="$2" 'BEGIN {
    split("ka lo mi ne ru ta so vi pe da fu ge ho ji ke la mo nu pi ra se ti vo wa ye zu", s, " ")
    x = seed
    for (l = 0; l < n; l++) {
      x = (x * 1103515245 + 12345) % 2147483648; words = 4 + x % 12; line = ""
      for (w = 0; w < words; w++) {
        x = (x * 1103515245 + 12345) % 2147483648; len = 1 + x % 3; word = ""
        for (k = 0; k < len; k++) {
          x = (x * 1103515245 + 12345) % 2147483648; word = word s[1 + int(x / 65536) % 26]
        }
        line = line (w ? " " : "") word
      }
      print line
    }
  }'
}
gen_text 7 400 >"$tmp/corpus.txt"
gen_text 99 300 >"$tmp/other.txt"
"$weft" data train-tokenizer --input "$tmp/corpus.txt" --vocab-size 300 \
  --output-prefix "$tmp/tokA" >"$tmp/tok.log" 2>&1 || { cat "$tmp/tok.log"; exit 1; }
"$weft" data train-tokenizer --input "$tmp/other.txt" --vocab-size 280 \
  --output-prefix "$tmp/tokB" >"$tmp/tok.log" 2>&1 || { cat "$tmp/tok.log"; exit 1; }
"$weft" data preprocess --input "$tmp/corpus.txt" --output-prefix "$tmp/d" \
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$tmp/tokA.model" --append-eod \
  >"$tmp/pre.log" 2>&1 || { cat "$tmp/pre.log"; exit 1; }
P=$tmp/d_text_document
[ -s "$P.idx" ] && [ -s "$P.bin" ] || { echo "preprocess wrote no dataset"; exit 1; }

# u64 at OFFSET of FILE; write COUNT little-endian bytes of VALUE at OFFSET
u64() { od -An -t u8 -j "$2" -N 8 "$1" | tr -d ' '; }
put() {  # put FILE OFFSET VALUE BYTES
  local v=$3 s="" i
  for ((i = 0; i < $4; i++)); do s+=$(printf '\\x%02x' $((v & 255))); v=$((v >> 8)); done
  printf "$s" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
copy() { cp "$P.idx" "$tmp/$1.idx"; cp "$P.bin" "$tmp/$1.bin"; }

copy noidx && rm "$tmp/noidx.idx"
copy trunc && truncate -s $(($(stat -c %s "$P.bin") / 2)) "$tmp/trunc.bin"
copy magic && printf 'X' | dd of="$tmp/magic.idx" bs=1 seek=0 conv=notrunc status=none
copy ptr
S=$(u64 "$P.idx" 18)
put "$tmp/ptr.idx" $((34 + 4 * S + 8 * (S - 1))) $((1 << 40)) 8  # the last sequence's pointer
# an empty dataset: no sequence, one document index entry (0)
{ printf 'MMIDIDX\0\0'; } >"$tmp/empty.idx"
put "$tmp/empty.idx" 9 1 8; put "$tmp/empty.idx" 17 8 1; put "$tmp/empty.idx" 18 0 8
put "$tmp/empty.idx" 26 1 8; put "$tmp/empty.idx" 34 0 8
: >"$tmp/empty.bin"
[ "$(stat -c %s "$tmp/empty.idx")" -eq 42 ] || { echo "empty.idx is not 42 bytes"; exit 1; }

model=(--log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
       --train-iters 4 --lr 1e-3 --min-lr 1e-4 --threads 1 --split 90,10,0
       --eval-interval 2 --eval-iters 1)
tokA=(--tokenizer-type SentencePieceTokenizer --tokenizer-model "$tmp/tokA.model")
tokB=(--tokenizer-type SentencePieceTokenizer --tokenizer-model "$tmp/tokB.model")

# expect NP NEEDLE FLAGS... : exit 2, one error line holding NEEDLE, nothing trained or saved
n=0
expect() {
  local np=$1 needle=$2
  shift 2
  n=$((n + 1))
  local ck=$tmp/ck$n out err rc lines
  out=$(timeout 120 "${mpirun[@]}" -np "$np" "$weft" train "${model[@]}" --save "$ck" "$@" \
        2>"$tmp/err")
  rc=$?
  err=$(cat "$tmp/err")
  lines=$(printf '%s\n' "$err" | grep -c '^weft: error')
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -qF -- "$needle"; then
    bad "(np $np $*): exit $rc, $lines error line(s), wanted '$needle'; stderr:"
    printf '%s\n' "$err" | head -5
  elif printf '%s\n' "$err" | grep -q '\[rank [0-9]*\] \[rank'; then
    bad "(np $np $*): the rank prefix is repeated: $(printf '%s\n' "$err" | grep '^weft: error')"
  elif printf '%s\n' "$out" | grep -q 'iteration'; then
    bad "(np $np $*): trained before failing: $(printf '%s\n' "$out" | grep -m1 iteration)"
  elif [ -e "$ck" ]; then
    bad "(np $np $*): left $ck behind"
  else
    echo "ok   (np $np $*): $(printf '%s\n' "$err" | grep '^weft: error')"
  fi
}

expect 1 "$tmp/noidx.idx" "${tokA[@]}" --data-path "$tmp/noidx"
expect 1 "$tmp/trunc." "${tokA[@]}" --data-path "$tmp/trunc"
expect 1 "$tmp/magic.idx" "${tokA[@]}" --data-path "$tmp/magic"
expect 1 "$tmp/ptr." "${tokA[@]}" --data-path "$tmp/ptr"
expect 1 "$tmp/empty.idx" "${tokA[@]}" --data-path "$tmp/empty"
expect 1 "--split" "${tokA[@]}" --data-path "$P" --split 100,0,0
expect 2 "--split" "${tokA[@]}" --data-path "$P" --split 100,0,0
expect 1 "--data-path" "${tokA[@]}" --data-path -0.5 "$P" 1 "$P"
expect 1 "--data-path" "${tokA[@]}" --data-path abc "$P"
expect 1 "--data-path" "${tokA[@]}" --data-path 0.5 "$P" x1 "$P"
expect 1 "the weights' sum is not finite" "${tokA[@]}" --data-path 1e308 "$P" 1e308 "$P"
expect 1 "--split \"1e308,1e308,0\": the weights' sum is not finite" "${tokA[@]}" --data-path "$P" \
  --split 1e308,1e308,0
expect 1 "--padded-vocab-size 128" "${tokA[@]}" --data-path "$P" --padded-vocab-size 128
expect 1 "--mock-data" "${tokA[@]}" --data-path "$P" --mock-data
expect 2 "$tmp/noidx.idx" "${tokA[@]}" --data-path "$tmp/noidx"

# --- the good run, then another tokenizer on --load ----------------------------------------------
good=$tmp/good
if "${mpirun[@]}" -np 1 "$weft" train "${model[@]}" "${tokA[@]}" --data-path "$P" \
     --save "$good" >"$tmp/good.log" 2>&1 && grep -q "validation loss" "$tmp/good.log" &&
   [ -s "$good/latest_checkpointed_iteration.txt" ]; then
  echo "ok   good run: $(grep -m1 'validation loss' "$tmp/good.log" | sed 's/^ *//')"
else
  bad "the good run did not succeed with a validation loss:"
  tail -5 "$tmp/good.log"
fi
expect 1 "--tokenizer-model" "${tokB[@]}" --data-path "$P" --load "$good" --train-iters 6
# the refusal left the checkpoint as it was
[ "$(cat "$good/latest_checkpointed_iteration.txt" 2>/dev/null)" = 4 ] ||
  bad "the refused load changed $good"
if "${mpirun[@]}" -np 1 "$weft" train "${model[@]}" "${tokB[@]}" --data-path "$P" --load "$good" \
     --train-iters 6 --override-tokenizer >"$tmp/over.log" 2>&1 &&
   grep -q "iteration        6/" "$tmp/over.log"; then
  echo "ok   --override-tokenizer loads and trains: $(grep -m1 'warning' "$tmp/over.log")"
else
  bad "--override-tokenizer did not load and train:"
  tail -5 "$tmp/over.log"
fi
# Other data on --load (here another --split) trains on, with one warning naming the change;
# the same data gives none.
"${mpirun[@]}" -np 1 "$weft" train "${model[@]}" "${tokA[@]}" --data-path "$P" --load "$good" \
  --train-iters 5 --split 80,20,0 >"$tmp/other.log" 2>&1
"${mpirun[@]}" -np 1 "$weft" train "${model[@]}" "${tokA[@]}" --data-path "$P" --load "$good" \
  --train-iters 5 >"$tmp/same.log" 2>&1
if grep -q "iteration        5/" "$tmp/other.log" &&
   grep -q "warning: --load .*trained on other data" "$tmp/other.log" &&
   grep -q "iteration        5/" "$tmp/same.log" && ! grep -q "trained on other data" "$tmp/same.log"; then
  echo "ok   other data on --load: $(grep -m1 -o 'warning: --load [^(]*' "$tmp/other.log")"
else
  bad "other data on --load: no warning, or one for the same data:"
  grep -h "warning\|error" "$tmp/other.log" "$tmp/same.log" | head -4
fi
# preprocess_data.py's flags: --partitions with --keep-sequential-samples, --lang and
# --keep-newlines change no output byte; the refused ones exit 2 naming the flag.
pre=(data preprocess --input "$tmp/corpus.txt" --tokenizer-type SentencePieceTokenizer
     --tokenizer-model "$tmp/tokA.model" --append-eod)
if "$weft" "${pre[@]}" --output-prefix "$tmp/parts" --partitions 4 --keep-sequential-samples \
     --lang english --keep-newlines > /dev/null 2>&1 &&
   cmp -s "$tmp/parts_text_document.bin" "$P.bin" && cmp -s "$tmp/parts_text_document.idx" "$P.idx"; then
  echo "ok   preprocess --partitions 4 --keep-sequential-samples --lang --keep-newlines: the same files"
else
  bad "preprocess with Megatron's partition flags wrote other files (or failed)"
fi
for case in "--partitions 2|--partitions 2 without --keep-sequential-samples" \
            "--split-sentences|--split-sentences is not implemented" \
            "--json-keys text text|--json-keys: \"text\" is given twice"; do
  flags=${case%%|*} needle=${case#*|}
  n=$((n + 1))
  # shellcheck disable=SC2086
  err=$("$weft" "${pre[@]}" --output-prefix "$tmp/refused" $flags 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -eq 2 ] && printf '%s' "$err" | grep -qF -- "$needle" && ! ls "$tmp"/refused* >/dev/null 2>&1; then
    echo "ok   preprocess $flags: $err"
  else
    bad "preprocess $flags: exit $rc, wanted 2 and '$needle', nothing written: $err"
  fi
done
# Python's json.loads (Megatron's preprocess_data.py) reads NaN, Infinity and numbers beyond
# float64 in other fields: the same dataset as without them. A text key holding one is refused.
printf '{"text": "1 2 3", "n": 1e309, "s": NaN}\n{"text": "4 5", "t": [Infinity, -Infinity]}\n' \
  > "$tmp/py.jsonl"
printf '{"text": "1 2 3"}\n{"text": "4 5"}\n' > "$tmp/strict.jsonl"
for c in py strict; do
  "$weft" data preprocess --input "$tmp/$c.jsonl" --output-prefix "$tmp/$c" \
    --tokenizer-type NullTokenizer --vocab-size 64 >/dev/null 2>"$tmp/$c.err" ||
    bad "preprocess $c.jsonl: $(cat "$tmp/$c.err")"
done
cmp -s "$tmp/py_text_document.bin" "$tmp/strict_text_document.bin" &&
  cmp -s "$tmp/py_text_document.idx" "$tmp/strict_text_document.idx" &&
  [ -s "$tmp/py_text_document.bin" ] && echo "ok   NaN, Infinity and 1e309 beside the text" ||
  bad "NaN, Infinity or 1e309 beside the text changed the dataset"
printf '{"text": NaN}\n' > "$tmp/nan.jsonl"
err=$("$weft" data preprocess --input "$tmp/nan.jsonl" --output-prefix "$tmp/nan" \
      --tokenizer-type NullTokenizer --vocab-size 64 2>&1 >/dev/null)
[ $? -eq 2 ] && printf '%s' "$err" | grep -qF "$tmp/nan.jsonl:1: key \"text\" is neither a string" &&
  echo "ok   a text that is NaN: $err" || bad "NaN as the text: $err"
printf '{"text": "a b", "n": 1e309 x}\n' > "$tmp/bad.jsonl"
err=$("$weft" data preprocess --input "$tmp/bad.jsonl" --output-prefix "$tmp/bad" \
      --tokenizer-type NullTokenizer --vocab-size 64 2>&1 >/dev/null)
[ $? -eq 2 ] && printf '%s' "$err" | grep -qF "$tmp/bad.jsonl:1: not valid JSON" &&
  echo "ok   not JSON even so: $err" || bad "a broken line with 1e309: $err"
[ "$fails" -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all $n refusals and the good runs behave"
