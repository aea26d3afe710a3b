#!/usr/bin/env bash
# `weft generate` as a user meets it. The same model trained with the same flags and seed on 1
# rank and on 4 ranks with pipeline 2 x data 2 (FSDP rows split over ranks), and a hybrid MoE
# model on 1 rank and with expert parallelism 2: each pair's checkpoints give the same greedy
# and the same seeded sampled continuation, while an earlier iteration of the same run gives
# another. A tokenizer recorded in the checkpoint is checked (another one is refused unless
# --force). Bad input ends with exit code 2 and one line naming the flag.
# Usage: generate.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"
train() {  # train NP DIR FLAGS...
  local np=$1 dir=$2
  shift 2
  "${mpirun[@]}" -np "$np" "$weft" train --threads 1 --save "$tmp/$dir" "$@" >"$tmp/$dir.log" 2>&1 ||
    { echo "FAIL: weft train -np $np $*"; tail -5 "$tmp/$dir.log"; exit 1; }
}
gen() { "$weft" generate --threads 1 "$@" 2>"$tmp/gen.err"; }

# --- the same continuation from every layout ---------------------------------------------------
dense=(--num-layers 4 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 32 --vocab-size 64 --micro-batch-size 2
       --global-batch-size 8 --train-iters 40 --save-interval 20 --lr 1e-2 --min-lr 1e-3 --seed 7)
train 1 dense1 "${dense[@]}"
train 4 dense4 "${dense[@]}" --pipeline-model-parallel-size 2
greedy1=$(gen --load "$tmp/dense1" --prompt-ids "1 2 3 4" --greedy --max-new-tokens 16)
greedy4=$(gen --load "$tmp/dense4" --prompt-ids "1 2 3 4" --greedy --max-new-tokens 16)
check "dense greedy, pp1 and pp2 x dp2" "$greedy4" "$greedy1"
[ "$(echo "$greedy1" | wc -w)" -eq 16 ] || { echo "FAIL: 16 ids wanted, got '$greedy1'"; fails=$((fails + 1)); }
sample1=$(gen --load "$tmp/dense1" --prompt-ids "1 2 3 4" --max-new-tokens 16 --top-p 0.9 --seed 3)
sample4=$(gen --load "$tmp/dense4" --prompt-ids "1 2 3 4" --max-new-tokens 16 --top-p 0.9 --seed 3)
check "dense sampled (seed 3), pp1 and pp2 x dp2" "$sample4" "$sample1"
other=$(gen --load "$tmp/dense1" --prompt-ids "1 2 3 4" --max-new-tokens 16 --top-p 0.9 --seed 4)
[ "$other" != "$sample1" ] && echo "ok   another seed samples another continuation" ||
  { echo "FAIL: seeds 3 and 4 sampled the same"; fails=$((fails + 1)); }
early=$(gen --load "$tmp/dense4" --ckpt-step 20 --prompt-ids "1 2 3 4" --max-new-tokens 16 --top-p 0.9 --seed 3)
[ "$early" != "$sample1" ] && echo "ok   --ckpt-step 20 samples another continuation: $early" ||
  { echo "FAIL: iteration 20 and 40 give the same continuation"; fails=$((fails + 1)); }
# Megatron's inference names: --top_k 1 is greedy, --top_p 0 is "off" (every token, as --top-p 1).
mgreedy=$(gen --load "$tmp/dense1" --prompt-ids "1 2 3 4" --top_k 1 --num-tokens-to-generate 16)
check "Megatron's --top_k 1 --num-tokens-to-generate 16 is greedy" "$mgreedy" "$greedy1"
all1=$(gen --load "$tmp/dense1" --prompt-ids "1 2 3 4" --max-new-tokens 16 --top-p 1 --seed 3)
off0=$(gen --load "$tmp/dense1" --prompt-ids "1 2 3 4" --max-new-tokens 16 --top_p 0 --seed 3)
check "Megatron's --top_p 0 keeps every token as --top-p 1" "$off0" "$all1"
[ "$all1" != "$sample1" ] || { echo "FAIL: --top-p 1 and 0.9 sampled the same"; fails=$((fails + 1)); }
grep -q "prompt 4 tokens | generated 16 tokens" "$tmp/gen.err" ||
  { echo "FAIL: no counts line"; cat "$tmp/gen.err"; fails=$((fails + 1)); }

hybrid=(--hybrid-layer-pattern "M*E-" --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 4
        --group-query-attention --num-query-groups 2 --mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2
        --num-experts 4 --moe-router-topk 2 --seq-length 32 --vocab-size 64 --micro-batch-size 2
        --global-batch-size 8 --train-iters 30 --lr 1e-2 --min-lr 1e-3 --seed 5)
train 1 hyb1 "${hybrid[@]}"
train 2 hyb2 "${hybrid[@]}" --expert-model-parallel-size 2
h1=$(gen --load "$tmp/hyb1" --prompt-ids "9 8 7" --greedy --max-new-tokens 16)
h2=$(gen --load "$tmp/hyb2" --prompt-ids "9 8 7" --greedy --max-new-tokens 16)
check "hybrid MoE greedy, ep1 and ep2" "$h2" "$h1"
h1=$(gen --load "$tmp/hyb1" --prompt-ids "9 8 7" --max-new-tokens 16 --seed 11)
h2=$(gen --load "$tmp/hyb2" --prompt-ids "9 8 7" --max-new-tokens 16 --seed 11)
check "hybrid MoE sampled (seed 11), ep1 and ep2" "$h2" "$h1"

# --- the tokenizer ---------------------------------------------------------------------------------
words=(the cat sat on a mat and dog ran to park with big red ball while sun was high in blue sky)
for i in $(seq 300); do
  line=""
  for j in $(seq 10); do line="$line ${words[$(((i * 7 + j * 13 + i * j) % ${#words[@]}))]}"; done
  echo "$line"
done >"$tmp/a.txt"
head -150 "$tmp/a.txt" | tr 'aeiou' 'uoiea' >"$tmp/b.txt"
"$weft" data train-tokenizer --input "$tmp/a.txt" --vocab-size 60 --output-prefix "$tmp/tokA" >/dev/null 2>&1 &&
  "$weft" data train-tokenizer --input "$tmp/b.txt" --vocab-size 50 --output-prefix "$tmp/tokB" >/dev/null 2>&1 ||
  { echo "FAIL: weft data train-tokenizer"; exit 1; }
train 1 tok "${dense[@]}" --train-iters 2 --tokenizer-model "$tmp/tokA.model"
text=$(gen --load "$tmp/tok" --tokenizer-model "$tmp/tokA.model" --prompt "the cat sat" --max-new-tokens 8 --ignore-eos)
rc=$?
[ $rc -eq 0 ] && [ -n "$text" ] && echo "ok   --prompt with the checkpoint's tokenizer: '$text'" ||
  { echo "FAIL: --prompt with the tokenizer: exit $rc"; cat "$tmp/gen.err"; fails=$((fails + 1)); }
# stdout is the continuation alone (docs/generate.md): not the prompt again.
[[ "$text" != "the cat sat"* ]] && echo "ok   --prompt: the continuation alone" ||
  { echo "FAIL: --prompt: stdout repeats the prompt: '$text'"; fails=$((fails + 1)); }
gen --load "$tmp/tok" --tokenizer-model "$tmp/tokB.model" --prompt "the cat" --max-new-tokens 4 --force >/dev/null
check "another tokenizer with --force: exit code" "$?" 0

# --- bad input: exit 2, one line naming the flag --------------------------------------------------
expect() {  # expect NEEDLE FLAGS...
  local needle=$1
  shift
  local err rc lines
  err=$("$weft" generate "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c '^weft: error')
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -qF -- "$needle"; then
    echo "FAIL ($*): exit $rc, $lines error line(s), wanted '$needle'; stderr:"
    printf '%s\n' "$err" | head -5
    fails=$((fails + 1))
  else
    echo "ok   ($*): $(printf '%s\n' "$err" | grep '^weft: error')"
  fi
}
d=$tmp/dense1
expect "--load $tmp/none: $tmp/none: no such directory" --load "$tmp/none" --prompt-ids 1
expect "no checkpoint of iteration 999" --load "$d" --ckpt-step 999 --prompt-ids 1
expect "exactly one of --prompt and --prompt-ids" --load "$d"
expect "exactly one of --prompt and --prompt-ids" --load "$d" --prompt x --prompt-ids 1
expect "--prompt needs a tokenizer: --tokenizer-model" --load "$d" --prompt "hello"
expect "more than weft generate's limit of 16777216" --load "$d" --prompt-ids "1 2" \
  --max-new-tokens 2147483647 --allow-past-seq-length
expect "more than weft generate's limit of 16777216" --load "$d" --prompt-ids "1" \
  --max-new-tokens 9223372036854775807
expect "--prompt-ids: token id 64 is outside the model's vocabulary [0, 64)" --load "$d" \
  --prompt-ids "1 2 64"
expect "--prompt-ids: '2x' is not an integer" --load "$d" --prompt-ids "1 2x"
long=$(seq -s ' ' 1 20)
expect "--prompt-ids gives 20 tokens; with --max-new-tokens 16 that is 36 positions, more than the model's --seq-length 32" \
  --load "$d" --prompt-ids "$long" --max-new-tokens 16
expect "--max-new-tokens must be >= 1" --load "$d" --prompt-ids 1 --max-new-tokens 0
expect "--temperature must be a finite number >= 0" --load "$d" --prompt-ids 1 --temperature -1
expect "--top-k must be >= 0" --load "$d" --prompt-ids 1 --top-k -3
expect "--top-p must be in [0, 1]" --load "$d" --prompt-ids 1 --top-p 1.5
expect "--top-p must be in [0, 1]" --load "$d" --prompt-ids 1 --top_p -0.1
expect "--device must be cpu or cuda" --load "$d" --prompt-ids 1 --device tpu
expect "--tokenizer-model $tmp/tokB.model differs from the tokenizer the checkpoint was trained with" \
  --load "$tmp/tok" --tokenizer-model "$tmp/tokB.model" --prompt "the cat"
cp -r "$d/iter_0000040" "$tmp/corrupt"
# One byte of the embedding's master copy (a weight generate reads; it reads no moments).
python3 - "$tmp/corrupt/shard_00000.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    entry = json.loads(f.read(n))["optimizer.fp32_param.embedding.word_embeddings.weight@0"]
    at = 8 + n + entry["data_offsets"][0] + 5
    f.seek(at)
    b = f.read(1)[0]
    f.seek(at)
    f.write(bytes([b ^ 0x10]))
PY
expect "checksum mismatch" --load "$tmp/corrupt" --prompt-ids 1 --max-new-tokens 4

# Past the trained length only when asked for: rotary rows exist for every position.
past=$(gen --load "$d" --prompt-ids "$long" --greedy --max-new-tokens 16 --allow-past-seq-length)
check "--allow-past-seq-length: ids generated" "$(echo "$past" | wc -w)" 16

finish
