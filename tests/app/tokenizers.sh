#!/usr/bin/env bash
# The byte-level BPE tokenizers and NullTokenizer, through the weft command.
# 1. Against an independent reference (tests/data/bpe_reference.py, Python's `regex` and GPT-2's
#    merge loop): `weft data preprocess` with GPT2BPETokenizer (vocab.json + merges.txt) and
#    HuggingFaceTokenizer on three tokenizer.json pipelines (GPT-2's ByteLevel regex; Llama 3's
#    Split + ignore_merges + BOS template + added tokens with lstrip/rstrip; Qwen's NFC and
#    single digits) writes exactly the reference's tokens for a multilingual text set, with the
#    template's specials (Megatron's default since February 2026, --legacy-tokenizer) and
#    without (--tokenizer-hf-no-include-special-tokens).
# 2. Training on those datasets: the vocabulary is the tokenizer's padded to
#    --make-vocab-size-divisible-by, the checkpoint records the tokenizer, `weft generate
#    --prompt` encodes with it; NullTokenizer as Megatron's current class (V ids, eod V - 1 or
#    --null-tokenizer-eod-id) and its legacy one (V + 1 ids, eod V).
# 3. Bad tokenizer input: one error line naming the flag, file or key, exit 2.
# Usage: tokenizers.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"
here=$(cd "$(dirname "$0")" && pwd)
ref=$here/../data/bpe_reference.py

# The reference needs Python's `regex` module: the python3 on PATH, else Debian's (where apt's
# python3-regex lands when PATH leads to another Python).
py=python3
python3 -c 'import regex' 2>/dev/null || py=/usr/bin/python3
"$py" "$ref" make "$tmp" || { echo "the reference could not build its tokenizers"; exit 1; }

# --- 1. the tokens, against the reference ---------------------------------------------------------
pre() {  # pre NAME TOKENIZER-FLAGS...: preprocess texts.jsonl into $tmp/NAME_text_document
  local name=$1
  shift
  "$weft" data preprocess --input "$tmp/texts.jsonl" --output-prefix "$tmp/$name" --append-eod \
    --workers 2 "$@" >"$tmp/pre.log" 2>&1 || { bad "preprocess $name: $(tail -1 "$tmp/pre.log")"; return 1; }
}
gpt2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$tmp/gpt2/vocab.json"
      --merge-file "$tmp/gpt2/merges.txt")
# --legacy-tokenizer: Megatron's legacy GPT2Tokenizer, "<|endoftext|>" in a text is text
if pre g2 "${gpt2[@]}" --legacy-tokenizer; then
  "$py" "$ref" check gpt2 "$tmp/gpt2" "$tmp/texts.jsonl" "$tmp/g2_text_document.bin" &&
    ok "GPT2BPETokenizer --legacy-tokenizer equals the reference" ||
    bad "GPT2BPETokenizer --legacy-tokenizer differs from the reference"
fi
# Megatron's default system reads the files with transformers' GPT-2 tokenizer, for which
# "<|endoftext|>" is a special token: the ids of the tokenizer.json with it added (checked below).
pre g2_default "${gpt2[@]}" 
for k in hf_gpt2 hf_llama3 hf_qwen; do
  if pre "$k" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/$k" \
       --tokenizer-hf-include-special-tokens; then
    "$py" "$ref" check hf "$tmp/$k" "$tmp/texts.jsonl" "$tmp/${k}_text_document.bin" &&
      ok "HuggingFaceTokenizer $k equals the reference" || bad "HuggingFaceTokenizer $k differs"
  fi
done
cmp -s "$tmp/g2_default_text_document.bin" "$tmp/hf_gpt2_text_document.bin" &&
  ! cmp -s "$tmp/g2_default_text_document.bin" "$tmp/g2_text_document.bin" &&
  ok "GPT2BPETokenizer reads <|endoftext|> in a text as the token, --legacy-tokenizer as text" ||
  bad "GPT2BPETokenizer's <|endoftext|> in a text: default and --legacy-tokenizer not as Megatron's"

# Megatron's default since February 2026 includes the template's specials, as the flag does.
if pre default_llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3"; then
  cmp -s "$tmp/default_llama3_text_document.bin" "$tmp/hf_llama3_text_document.bin" &&
    ok "HuggingFaceTokenizer adds the template's specials by default" ||
    bad "HuggingFaceTokenizer's default encodes otherwise than --tokenizer-hf-include-special-tokens"
fi
# --tokenizer-hf-no-include-special-tokens (Megatron's default before): no BOS from the template.
if pre plain_llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3" \
     --tokenizer-hf-no-include-special-tokens; then
  "$py" "$ref" check hf-plain "$tmp/hf_llama3" "$tmp/texts.jsonl" \
    "$tmp/plain_llama3_text_document.bin" &&
    ok "HuggingFaceTokenizer hf_llama3 without the template's specials equals the reference" ||
    bad "HuggingFaceTokenizer hf_llama3 without the template's specials differs"
fi
if pre legacy_llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3" \
     --legacy-tokenizer; then
  cmp -s "$tmp/legacy_llama3_text_document.bin" "$tmp/hf_llama3_text_document.bin" &&
    ok "--legacy-tokenizer adds the template's specials" ||
    bad "--legacy-tokenizer encodes otherwise than --tokenizer-hf-include-special-tokens"
fi
# The tokenizer.json file itself may be given instead of its directory.
if pre hf_file --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3/tokenizer.json" \
     --tokenizer-hf-include-special-tokens; then
  cmp -s "$tmp/hf_file_text_document.bin" "$tmp/hf_llama3_text_document.bin" &&
    ok "tokenizer.json given as a file" || bad "tokenizer.json as a file encodes differently"
fi

# --- 2. training, checkpoint, generate ------------------------------------------------------------
model=(--log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48
       --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 16 --micro-batch-size 2
       --global-batch-size 4 --train-iters 2 --lr 1e-3 --min-lr 1e-4 --threads 1
       --split 100,0,0 --eval-interval 0)
train() {  # train NAME FLAGS...
  local name=$1
  shift
  timeout 200 "${mpirun[@]}" -np 1 "$weft" train "${model[@]}" --save "$tmp/ck_$name" "$@" \
    >"$tmp/train_$name.log" 2>&1
}
# the vocabulary size the checkpoint's config records
ckpt_vocab() { python3 -c "import json,sys,glob
m = json.load(open(glob.glob(sys.argv[1] + '/iter_*/metadata.json')[0]))
print(m['config']['model']['vocab_size'], m['tokenizer']['type'], m['tokenizer']['eod'])" "$1"; }

V=$(python3 -c "import json; print(len(json.load(open('$tmp/gpt2/vocab.json'))))")
if train g2 "${gpt2[@]}" --data-path "$tmp/g2_text_document"; then
  want="$(( (V + 127) / 128 * 128 )) GPT2BPETokenizer $((V - 1))"
  got=$(ckpt_vocab "$tmp/ck_g2")
  [ "$got" = "$want" ] && ok "GPT2BPETokenizer run: vocab, type, eod = $got" ||
    bad "GPT2BPETokenizer run recorded '$got', wanted '$want'"
  out=$("$weft" generate --load "$tmp/ck_g2" "${gpt2[@]}" --prompt "the model" \
        --max-new-tokens 3 --greedy 2>"$tmp/gen.err")
  [ $? -eq 0 ] && [ -n "$out" ] && ok "generate --prompt with GPT2BPETokenizer" ||
    bad "generate with GPT2BPETokenizer: $(tail -1 "$tmp/gen.err")"
  # another tokenizer (the Hugging Face one: other files) is refused without --force
  "$weft" generate --load "$tmp/ck_g2" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$tmp/hf_qwen" --prompt "x" --max-new-tokens 1 >/dev/null 2>"$tmp/gen.err"
  [ $? -eq 2 ] && grep -q "differs from the tokenizer the checkpoint was trained with" "$tmp/gen.err" &&
    ok "generate refuses another tokenizer" || bad "generate took another tokenizer: $(tail -1 "$tmp/gen.err")"
else
  bad "training with GPT2BPETokenizer: $(grep -m1 error "$tmp/train_g2.log")"
fi
# Megatron sizes the vocabulary from the tokenizer: --vocab-size has no effect beside a file
# tokenizer (a warning), --padded-vocab-size sets it, --no-pad-vocab-size leaves it unpadded.
vocab_case() {  # vocab_case NAME WANT FLAGS...
  local name=$1 want=$2
  shift 2
  if train "$name" "${gpt2[@]}" --data-path "$tmp/g2_text_document" "$@"; then
    local got
    got=$(ckpt_vocab "$tmp/ck_$name")
    [ "$got" = "$want GPT2BPETokenizer $((V - 1))" ] && ok "GPT2BPETokenizer $*: vocab $want" ||
      bad "GPT2BPETokenizer $* recorded '$got', wanted vocab $want"
  else
    bad "training with GPT2BPETokenizer $*: $(grep -m1 error "$tmp/train_$name.log")"
  fi
}
vocab_case g2v $(( (V + 127) / 128 * 128 )) --vocab-size 999
grep -q -- "--vocab-size 999 has no effect with --tokenizer-type GPT2BPETokenizer" "$tmp/train_g2v.log" &&
  ok "--vocab-size beside a file tokenizer warns" || bad "no warning for --vocab-size 999"
vocab_case g2p 600 --padded-vocab-size 600
vocab_case g2n "$V" --no-pad-vocab-size
if train llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3" \
     --data-path "$tmp/hf_llama3_text_document" --make-vocab-size-divisible-by 64; then
  got=$(ckpt_vocab "$tmp/ck_llama3")
  want="$(( (V + 3 + 63) / 64 * 64 )) HuggingFaceTokenizer $((V + 1))"
  [ "$got" = "$want" ] && ok "HuggingFaceTokenizer run: vocab, type, eod = $got" ||
    bad "HuggingFaceTokenizer run recorded '$got', wanted '$want'"
else
  bad "training with HuggingFaceTokenizer: $(grep -m1 error "$tmp/train_llama3.log")"
fi
# NullTokenizer: the text is ids. Megatron's current class: V = 201 gives 201 ids (eod 200),
# padded to 256; its legacy class (--legacy-tokenizer): V = 200 gives 201 ids (eod 200).
printf '{"text": "5 17 3 199"}\n{"text": "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"}\n' \
  >"$tmp/ids.jsonl"
for i in $(seq 1 40); do echo "{\"text\": \"$((i % 200)) $((i * 7 % 200)) $((i * 13 % 200)) 42 43 44 45 46 47 48\"}"; done >>"$tmp/ids.jsonl"
null_pre() {  # null_pre NAME WANT FLAGS...: preprocess ids.jsonl, check the first 5 ids
  local name=$1 want=$2
  shift 2
  if "$weft" data preprocess --input "$tmp/ids.jsonl" --output-prefix "$tmp/$name" --append-eod \
       --tokenizer-type NullTokenizer "$@" >"$tmp/pre.log" 2>&1; then
    local first
    first=$(od -An -t u2 -N 10 "$tmp/${name}_text_document.bin" | xargs)
    [ "$first" = "$want" ] && ok "NullTokenizer $*: $first" ||
      bad "NullTokenizer $* wrote '$first', wanted '$want'"
  else
    bad "NullTokenizer preprocess $*: $(tail -1 "$tmp/pre.log")"
  fi
}
null_pre null "5 17 3 199 200" --vocab-size 201
null_pre null_legacy "5 17 3 199 200" --vocab-size 200 --legacy-tokenizer
null_pre null_eod0 "5 17 3 199 0" --vocab-size 201 --null-tokenizer-eod-id 0
cmp -s "$tmp/null_text_document.bin" "$tmp/null_legacy_text_document.bin" ||
  bad "NullTokenizer V 201 and --legacy-tokenizer V 200 wrote different ids"
if train null --tokenizer-type NullTokenizer --vocab-size 201 --data-path "$tmp/null_text_document"; then
  got=$(ckpt_vocab "$tmp/ck_null")
  [ "$got" = "256 NullTokenizer 200" ] && ok "NullTokenizer run: vocab, type, eod = $got" ||
    bad "NullTokenizer run recorded '$got', wanted '256 NullTokenizer 200'"
  # generate takes V, the eod and the pad from the checkpoint
  out=$("$weft" generate --load "$tmp/ck_null" --tokenizer-type NullTokenizer --prompt "5 17 3" \
        --max-new-tokens 2 --greedy 2>"$tmp/gen.err")
  [ $? -eq 0 ] && [ -n "$out" ] && ok "generate --prompt with NullTokenizer" ||
    bad "generate with NullTokenizer: $(tail -1 "$tmp/gen.err")"
else
  bad "training with NullTokenizer: $(grep -m1 error "$tmp/train_null.log")"
fi
if train null_legacy --tokenizer-type NullTokenizer --vocab-size 200 --legacy-tokenizer \
     --data-path "$tmp/null_legacy_text_document"; then
  got=$(ckpt_vocab "$tmp/ck_null_legacy")
  [ "$got" = "256 NullTokenizer 200" ] && ok "NullTokenizer --legacy-tokenizer run: $got" ||
    bad "NullTokenizer --legacy-tokenizer run recorded '$got', wanted '256 NullTokenizer 200'"
else
  bad "training with NullTokenizer --legacy-tokenizer: $(grep -m1 error "$tmp/train_null_legacy.log")"
fi

# --- 3. bad input ---------------------------------------------------------------------------------
mkdir -p "$tmp/bad_unigram" "$tmp/bad_fallback" "$tmp/bad_meta" "$tmp/bad_eos" "$tmp/empty_dir" "$tmp/sep_eos" \
  "$tmp/bad_order" "$tmp/bad_type" "$tmp/bad_llama"
python3 - "$tmp" <<'EOF'
import json, sys
t = sys.argv[1]
tj = json.load(open(f"{t}/hf_qwen/tokenizer.json"))
def write(name, j, config={"eos_token": "<|endoftext|>"}):
    json.dump(j, open(f"{t}/{name}/tokenizer.json", "w"))
    json.dump(config, open(f"{t}/{name}/tokenizer_config.json", "w"))
write("bad_unigram", dict(tj, model={"type": "Unigram", "vocab": []}))
write("bad_fallback", dict(tj, model=dict(tj["model"], byte_fallback=True)))
write("bad_meta", dict(tj, pre_tokenizer={"type": "Metaspace", "replacement": "\u2581"}))
write("bad_eos", tj, {"bos_token": "<|endoftext|>"})
# Megatron's HuggingFaceTokenizer takes a sep_token as the eos where none is named (BERT-style).
qcfg = json.load(open(f"{t}/hf_qwen/tokenizer_config.json"))
qcfg["sep_token"] = qcfg.pop("eos_token")
write("sep_eos", tj, qcfg)
write("bad_order", dict(tj, pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
    {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False}]}))
write("bad_type", dict(tj, added_tokens=[{"content": "<x>"}]))  # no id
llama = json.load(open(f"{t}/hf_llama3/tokenizer.json"))
write("bad_llama", llama, {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False,
                           "eos_token": "<|end_of_text|>", "bos_token": "<|begin_of_text|>"})
EOF
if pre sep_eos --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/sep_eos" \
     --tokenizer-hf-include-special-tokens; then
  cmp -s "$tmp/sep_eos_text_document.bin" "$tmp/hf_qwen_text_document.bin" &&
    ok "HuggingFaceTokenizer without an eos_token appends its sep_token, as Megatron's" ||
    bad "HuggingFaceTokenizer with a sep_token and no eos_token: not the eos tokenizer's files"
fi
# --tokenizer-special-tokens (Megatron's additional_special_tokens): the same ids as the
# tokenizer.json with those tokens written into added_tokens, as the tokenizers library assigns
# them (a new token: the model's vocabulary size, or the largest added id + 1 where larger; an
# added or vocabulary token: its id, now split out of the raw text), read by the reference.
# hf_qwen's added tokens lie after its vocabulary, hf_gpt2's inside it: both rules are used;
# hf_llama3's <|user|> (lstrip, rstrip) given again loses those flags, as in transformers.
for base in hf_qwen hf_gpt2 hf_llama3; do
python3 - "$tmp" "$base" <<'EOF2'
import json, os, sys
t, base = sys.argv[1], sys.argv[2]
tj = json.load(open(f"{t}/{base}/tokenizer.json"))
vocab = tj["model"]["vocab"]
word = next(w for w in ("ka", "lo", "the", "mi") if w in vocab)  # a vocabulary token
extra = ["<|tool|>", word, "<|endoftext|>", "<|tool|>", "<|end_tool|>"]
if base == "hf_llama3":
    extra.append("<|user|>")
added = [dict(a) for a in tj["added_tokens"]]
for text in extra:
    known = [a for a in added if a["content"] == text]
    for a in known:
        a["lstrip"] = a["rstrip"] = False
    if known:
        continue
    tid = vocab.get(text)
    if tid is None:
        big = [a["id"] for a in added if a["id"] >= len(vocab)]
        tid = max(big) + 1 if big else len(vocab)
    added.append({"id": tid, "content": text, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True})
os.makedirs(f"{t}/extra_{base}", exist_ok=True)
json.dump(dict(tj, added_tokens=added), open(f"{t}/extra_{base}/tokenizer.json", "w"))
os.system(f"cp {t}/{base}/tokenizer_config.json {t}/extra_{base}/")
with open(f"{t}/extra.jsonl", "w") as f:
    for doc in (f"a <|tool|>{word}x {word} y<|end_tool|>z", "<|endoftext|> ka<|tool|> lo",
                f"{word}{word} <|end_tool|><|tool|>", "no special here", "<|tool|",
                "hi <|user|>  there <|user|>x"):
        f.write(json.dumps({"text": doc}) + "\n")
open(f"{t}/extra_args", "w").write("\n".join(extra))
EOF2
mapfile -t extra_tokens <"$tmp/extra_args"
if "$weft" data preprocess --input "$tmp/extra.jsonl" --output-prefix "$tmp/extra" --append-eod \
     --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/$base" \
     --tokenizer-special-tokens "${extra_tokens[@]}" >"$tmp/pre.log" 2>&1; then
  "$py" "$ref" check hf "$tmp/extra_$base" "$tmp/extra.jsonl" "$tmp/extra_text_document.bin" &&
    ok "--tokenizer-special-tokens ($base): the ids of the tokenizer with those tokens added" ||
    bad "--tokenizer-special-tokens ($base) differs from the tokenizer with those tokens added"
else
  bad "preprocess with --tokenizer-special-tokens ($base): $(tail -1 "$tmp/pre.log")"
fi
if [ $base = hf_gpt2 ]; then
  # Megatron's GPT2BPETokenizer is its HuggingFaceTokenizer on vocab.json + merges.txt: the same
  # additional special tokens give the same ids as the tokenizer.json of the same files.
  cp "$tmp/extra_text_document.bin" "$tmp/extra_hf_gpt2.bin"
  if "$weft" data preprocess --input "$tmp/extra.jsonl" --output-prefix "$tmp/extra_g2" --append-eod \
       "${gpt2[@]}" --tokenizer-special-tokens "${extra_tokens[@]}" >"$tmp/pre.log" 2>&1; then
    cmp -s "$tmp/extra_g2_text_document.bin" "$tmp/extra_hf_gpt2.bin" &&
      ok "GPT2BPETokenizer --tokenizer-special-tokens: the ids of HuggingFaceTokenizer gpt2's" ||
      bad "GPT2BPETokenizer --tokenizer-special-tokens differs from HuggingFaceTokenizer gpt2's"
  else
    bad "GPT2BPETokenizer preprocess with --tokenizer-special-tokens: $(tail -1 "$tmp/pre.log")"
  fi
fi
done
printf '#version: 0.2\nthis line has three\n' >"$tmp/bad_merges.txt"
printf '{"text": "1 2 x"}\n' >"$tmp/bad_ids.jsonl"
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
P=(data preprocess --input "$tmp/texts.jsonl" --output-prefix "$tmp/bad")
expect "--merge-file is required" "${P[@]}" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$tmp/gpt2/vocab.json"
expect "--vocab-file $tmp/none.json: no such file" "${P[@]}" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$tmp/none.json" --merge-file "$tmp/gpt2/merges.txt"
expect "line 2 is not two tokens" "${P[@]}" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$tmp/gpt2/vocab.json" --merge-file "$tmp/bad_merges.txt"
expect "--vocab-file $tmp/hf_qwen/tokenizer.json: the id of \"added_tokens\" is not an integer" "${P[@]}" \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$tmp/hf_qwen/tokenizer.json" \
  --merge-file "$tmp/gpt2/merges.txt"
expect "no tokenizer.json there" "${P[@]}" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/empty_dir"
expect "tokenizer.json model.type: \"Unigram\"" "${P[@]}" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/bad_unigram"
expect "--tokenizer-special-tokens is read by --tokenizer-type TikTokenizer, HuggingFaceTokenizer and GPT2BPETokenizer only" \
  "${P[@]}" --tokenizer-type NullTokenizer --vocab-size 100 --tokenizer-special-tokens "<x>"
expect "--tokenizer-special-tokens with --legacy-tokenizer" "${P[@]}" "${gpt2[@]}" --legacy-tokenizer \
  --tokenizer-special-tokens "<x>"
expect "--tokenizer-special-tokens: a token is empty" "${P[@]}" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/hf_qwen" --tokenizer-special-tokens "<x>" ""
expect "model.byte_fallback" "${P[@]}" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/bad_fallback"
expect "pre-tokenizer \"Metaspace\" is not supported" "${P[@]}" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/bad_meta"
expect "names an eos_token" "${P[@]}" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/bad_eos"
expect "a step after the ByteLevel step is not supported" "${P[@]}" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/bad_order"
expect "--tokenizer-model $tmp/bad_type: a tokenizer file holds a value" "${P[@]}" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/bad_type"
expect "add_bos_token false / add_eos_token false disagree with tokenizer.json's post-processor" \
  "${P[@]}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/bad_llama"
expect "--tokenizer-type Foo is not supported" "${P[@]}" --tokenizer-type Foo
expect "NullTokenizer needs --vocab-size" "${P[@]}" --tokenizer-type NullTokenizer
expect "NullTokenizer: \"x\" is not an id in [0, 10]" data preprocess \
  --input "$tmp/bad_ids.jsonl" --output-prefix "$tmp/bad" --tokenizer-type NullTokenizer \
  --vocab-size 10 --legacy-tokenizer
expect "NullTokenizer: \"x\" is not an id in [0, 9]" data preprocess \
  --input "$tmp/bad_ids.jsonl" --output-prefix "$tmp/bad" --tokenizer-type NullTokenizer \
  --vocab-size 10
printf '{"text": "1 200"}\n' >"$tmp/bad_range.jsonl"
expect "NullTokenizer: \"200\" is not an id in [0, 199]" data preprocess --input "$tmp/bad_range.jsonl" \
  --output-prefix "$tmp/bad" --tokenizer-type NullTokenizer --vocab-size 200 --append-eod
expect "--null-tokenizer-eod-id 10 is outside the NullTokenizer's ids 0..9" data preprocess \
  --input "$tmp/ids.jsonl" --output-prefix "$tmp/bad" --tokenizer-type NullTokenizer \
  --vocab-size 10 --null-tokenizer-eod-id 10
expect "--null-tokenizer-pad-id is read by Megatron's current NullTokenizer, not its legacy" \
  data preprocess --input "$tmp/ids.jsonl" --output-prefix "$tmp/bad" \
  --tokenizer-type NullTokenizer --vocab-size 300 --legacy-tokenizer --null-tokenizer-pad-id 3
expect "--null-tokenizer-pad-id is read by --tokenizer-type NullTokenizer only" "${P[@]}" "${gpt2[@]}" \
  --null-tokenizer-pad-id 3
expect "--null-tokenizer-eod-id is read by --tokenizer-type NullTokenizer, which is not given" \
  train "${model[@]}" --mock-data --null-tokenizer-eod-id 3
expect "--tokenizer-hf-no-include-special-tokens contradicts --tokenizer-hf-include-special-tokens" \
  "${P[@]}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3" \
  --tokenizer-hf-include-special-tokens --tokenizer-hf-no-include-special-tokens
[ -e "$tmp/bad_text_document.bin" ] && bad "a refused preprocess left $tmp/bad_text_document.bin"
expect "--vocab-file and --merge-file are read by --tokenizer-type GPT2BPETokenizer only" \
  train "${model[@]}" --mock-data --tokenizer-type SentencePieceTokenizer \
  --vocab-file "$tmp/gpt2/vocab.json"
expect "--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file" \
  train "${model[@]}" --mock-data --tokenizer-type GPT2BPETokenizer
expect "NullTokenizer needs --vocab-size" train "${model[@]}" --mock-data \
  --tokenizer-type NullTokenizer
# The same tokenizer read without the template's specials: refused, naming the flag
expect "the checkpoint's run added the template's special tokens: drop --tokenizer-hf-no-include-special-tokens" \
  train "${model[@]}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3" \
  --data-path "$tmp/hf_llama3_text_document" --make-vocab-size-divisible-by 64 \
  --load "$tmp/ck_llama3" --train-iters 9 --tokenizer-hf-no-include-special-tokens
# The same files with other special tokens (here only <|user|>'s lstrip/rstrip change): refused
expect "differs from the tokenizer the checkpoint" \
  train "${model[@]}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_llama3" \
  --data-path "$tmp/hf_llama3_text_document" --make-vocab-size-divisible-by 64 \
  --load "$tmp/ck_llama3" --train-iters 9 --tokenizer-special-tokens "<|user|>"
expect "has $V tokens, more than --padded-vocab-size 100" train "${model[@]}" "${gpt2[@]}" \
  --data-path "$tmp/g2_text_document" --padded-vocab-size 100
expect "--padded-vocab-size must be >= 1 (got 0)" train "${model[@]}" --mock-data \
  --padded-vocab-size 0

finish
