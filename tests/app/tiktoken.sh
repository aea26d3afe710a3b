#!/usr/bin/env bash
# Megatron's --tokenizer-type TikTokenizer through the weft command.
# 1. Against an independent reference (tests/data/tiktoken_reference.py: Python's `regex` with
#    Megatron's patterns verbatim and tiktoken's rescanning merge loop): `weft data preprocess`
#    writes exactly the reference's tokens for texts with special tokens, vertical tab and NEL,
#    mixed case and slashes, with pattern v2 (default) and v1, Megatron's default special tokens
#    (matched in the text) and --legacy-tokenizer's (read as text), and a vocabulary cut by
#    --vocab-size.
# 2. Training on it: the model's vocabulary is --vocab-size padded, the checkpoint records the
#    tokenizer (eod </s> = 2), `weft generate --prompt` encodes with it and refuses another
#    pattern.
# 3. Bad input: one error line naming the flag or the file's entry, exit 2.
# Usage: tiktoken.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"
here=$(cd "$(dirname "$0")" && pwd)
ref=$here/../data/tiktoken_reference.py

py=python3
python3 -c 'import regex' 2>/dev/null || py=/usr/bin/python3
"$py" "$ref" make "$tmp" || { echo "the reference could not build its vocabulary"; exit 1; }
N=$("$py" -c "import json; print(len(json.load(open('$tmp/vocab.json'))))")

# --- 1. the tokens, against the reference ---------------------------------------------------------
pre() {  # pre NAME FLAGS...: preprocess texts.jsonl into $tmp/NAME_text_document
  local name=$1
  shift
  "$weft" data preprocess --input "$tmp/texts.jsonl" --output-prefix "$tmp/$name" --append-eod \
    --workers 2 --tokenizer-type TikTokenizer --tokenizer-model "$tmp/vocab.json" "$@" \
    >"$tmp/pre.log" 2>&1 || { bad "preprocess $name: $(tail -1 "$tmp/pre.log")"; return 1; }
}
compare() {  # compare NAME WHAT REFERENCE-FLAGS...
  local name=$1 what=$2
  shift 2
  if "$py" "$ref" check "$tmp/vocab.json" "$tmp/texts.jsonl" "$tmp/${name}_text_document.bin" "$@" \
       >"$tmp/ref.log" 2>&1; then
    ok "$what equals the reference ($(tail -1 "$tmp/ref.log"))"
  else
    bad "$what differs from the reference: $(cat "$tmp/ref.log")"
  fi
}
V=$((1000 + N))  # every rank of the file
pre v2 --vocab-size $V && compare v2 "pattern v2 (default)" --vocab-size $V
pre v1 --vocab-size $V --tiktoken-pattern v1 && compare v1 "pattern v1" --vocab-size $V --pattern v1
pre legacy --vocab-size $V --legacy-tokenizer &&
  compare legacy "--legacy-tokenizer (special tokens as text)" --vocab-size $V --legacy
# 16 special ids, a custom list, the vocabulary cut to 300 ranks (merges past it unused)
pre cut --vocab-size 316 --tiktoken-num-special-tokens 16 \
    --tokenizer-special-tokens "<unk>" "<s>" "</s>" "<mask>" "<pad>" "<cls>" "<sep>" "<sep>>" &&
  compare cut "16 special ids, a custom list, 300 ranks" --vocab-size 316 --num-special 16 \
    --special "<unk>" "<s>" "</s>" "<mask>" "<pad>" "<cls>" "<sep>" "<sep>>"
cmp -s "$tmp/v1_text_document.bin" "$tmp/v2_text_document.bin" &&
  bad "patterns v1 and v2 wrote the same tokens (the texts do not tell them apart)"

# --- 2. training, checkpoint, generate ------------------------------------------------------------
model=(--log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48
       --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 16 --micro-batch-size 2
       --global-batch-size 4 --train-iters 2 --lr 1e-3 --min-lr 1e-4 --threads 1
       --split 100,0,0 --eval-interval 0)
tik=(--tokenizer-type TikTokenizer --tokenizer-model "$tmp/vocab.json")
if timeout 200 "${mpirun[@]}" -np 1 "$weft" train "${model[@]}" "${tik[@]}" --vocab-size $V \
     --data-path "$tmp/v2_text_document" --save "$tmp/ck" >"$tmp/train.log" 2>&1; then
  got=$(python3 -c "import json,sys,glob
m = json.load(open(glob.glob(sys.argv[1] + '/iter_*/metadata.json')[0]))
t = m['tokenizer']
print(m['config']['model']['vocab_size'], t['type'], t['eod'], t['bos'], t['pad'], t['tiktoken_pattern'])" "$tmp/ck")
  want="$(( (V + 127) / 128 * 128 )) TikTokenizer 2 1 4 v2"
  [ "$got" = "$want" ] && ok "TikTokenizer run: vocab, type, eod, bos, pad, pattern = $got" ||
    bad "TikTokenizer run recorded '$got', wanted '$want'"
  out=$("$weft" generate --load "$tmp/ck" "${tik[@]}" --prompt "the model" --max-new-tokens 3 \
        --greedy 2>"$tmp/gen.err")
  [ $? -eq 0 ] && [ -n "$out" ] && ok "generate --prompt with TikTokenizer (recorded vocabulary size)" ||
    bad "generate with TikTokenizer: $(tail -1 "$tmp/gen.err")"
  "$weft" generate --load "$tmp/ck" "${tik[@]}" --tiktoken-pattern v1 --prompt "x" \
    --max-new-tokens 1 >/dev/null 2>"$tmp/gen.err"
  [ $? -eq 2 ] && grep -q "differs from the tokenizer the checkpoint was trained with" "$tmp/gen.err" &&
    ok "generate refuses pattern v1 on a v2 checkpoint" ||
    bad "generate took another pattern: $(tail -1 "$tmp/gen.err")"
else
  bad "training with TikTokenizer: $(grep -m1 error "$tmp/train.log")"
fi

# --- 3. bad input ---------------------------------------------------------------------------------
python3 - "$tmp" <<'EOF'
import json, sys
t = sys.argv[1]
v = json.load(open(f"{t}/vocab.json"))
json.dump(v[:5] + [dict(v[5], rank=9)] + v[6:], open(f"{t}/bad_rank.json", "w"))
json.dump([dict(v[0], token_bytes="AQ==")] + v[1:], open(f"{t}/bad_byte.json", "w"))
json.dump(v + [dict(v[300], rank=len(v))], open(f"{t}/bad_dup.json", "w"))
json.dump({"a": 1}, open(f"{t}/bad_shape.json", "w"))
EOF
expect() {  # expect NEEDLE ARGS...: exit 2, one error line holding NEEDLE
  local needle=$1
  shift
  local err rc lines
  "$weft" "$@" >/dev/null 2>"$tmp/err"
  rc=$?
  err=$(cat "$tmp/err")
  lines=$(printf '%s\n' "$err" | grep -c '^weft: error')
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -qF -- "$needle"; then
    bad "($*): exit $rc, $lines error line(s), wanted '$needle'; stderr: $(head -3 "$tmp/err")"
  else
    ok "($(printf '%s' "$err" | grep '^weft: error'))"
  fi
}
P=(data preprocess --input "$tmp/texts.jsonl" --output-prefix "$tmp/bad" --tokenizer-type TikTokenizer)
expect "--tiktoken-pattern v3: must be v1 or v2" "${P[@]}" --tokenizer-model "$tmp/vocab.json" \
  --vocab-size $V --tiktoken-pattern v3
expect "holds $N tokens, fewer than --vocab-size" "${P[@]}" --tokenizer-model "$tmp/vocab.json"
expect "entry 5 has rank 9" "${P[@]}" --tokenizer-model "$tmp/bad_rank.json" --vocab-size $V
expect "entry 0 must be the single byte 0" "${P[@]}" --tokenizer-model "$tmp/bad_byte.json" \
  --vocab-size $V
expect "repeats the bytes of an earlier entry" "${P[@]}" --tokenizer-model "$tmp/bad_dup.json" \
  --vocab-size $((V + 1))
expect "not Megatron's tiktoken vocabulary" "${P[@]}" --tokenizer-model "$tmp/bad_shape.json"
expect "--tokenizer-special-tokens must include </s>" "${P[@]}" --tokenizer-model "$tmp/vocab.json" \
  --vocab-size $V --tokenizer-special-tokens "<unk>" "<s>"
expect "--tiktoken-num-special-tokens 4: must be at least the 7 special tokens" "${P[@]}" \
  --tokenizer-model "$tmp/vocab.json" --vocab-size $V --tiktoken-num-special-tokens 4
expect "--tokenizer-model $tmp/none.json: cannot open" "${P[@]}" --tokenizer-model "$tmp/none.json"
expect "--tiktoken-pattern is read by --tokenizer-type TikTokenizer only" data preprocess \
  --input "$tmp/texts.jsonl" --output-prefix "$tmp/bad" --tokenizer-type NullTokenizer \
  --vocab-size 100 --tiktoken-pattern v1
[ -e "$tmp/bad_text_document.bin" ] && bad "a refused preprocess left $tmp/bad_text_document.bin"

finish
