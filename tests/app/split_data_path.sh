#!/usr/bin/env bash
# --train-data-path, --valid-data-path, --test-data-path (Megatron's blend per split) end to end,
# on three NullTokenizer corpora A, B, C:
# - training on --train-data-path A is training on --data-path A --split 1,0,0 bit for bit (the
#   training split is all of A's documents either way), also on 2 ranks;
# - the evaluations read B (valid) and C (test): with --lr 0 the model never changes, so the
#   validation losses differ from those of a run that validates on A, and the test line is
#   there only with --test-data-path and reads it, pp 2 evaluates as 1 rank, a blend by
#   weights per split trains, a resume that adds a validation set does not warn of other data;
# - Megatron's --data-args-path and --per-split-data-args-path give the same runs as the flags
#   they stand for;
# - refusals name the flag: --data-path beside them, --valid-data-path without
#   --train-data-path, --mock-data or --split beside them, a missing prefix, a test set too
#   small for one sample.
# Usage: split_data_path.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"

null_corpus A 3 300
null_corpus B 4 300
null_corpus C 5 300
A=$tmp/A_text_document B=$tmp/B_text_document C=$tmp/C_text_document
model=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --seq-length 16 --vocab-size 64 --micro-batch-size 2 --global-batch-size 4
       --train-iters 4 --log-interval 1 --threads 1 --eval-iters 1 --seed 5)
# run NAME NP FLAGS...: the JSONL's training lines to NAME.train, validation lines to NAME.valid.
run() {
  local name=$1 np=$2
  shift 2
  if ! timeout 180 "${mpirun[@]}" -np "$np" "$weft" train "${model[@]}" \
       --log-jsonl "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1; then
    bad "$name: weft train $* failed: $(grep -m3 error "$tmp/$name.log")"
    return
  fi
  python3 - "$tmp/$name.jsonl" "$tmp/$name" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2] + ".train", "w") as f:
    for r in rows:
        if "lm_loss" in r: print(r["iteration"], repr(r["lm_loss"]), repr(r["grad_norm"]), file=f)
with open(sys.argv[2] + ".valid", "w") as f:
    for r in rows:
        for k in ("valid_lm_loss", "test_lm_loss"):
            if k in r: print(k, r["iteration"], repr(r[k]), file=f)
EOF
}
run split 1 --train-data-path "$A" --eval-interval 0
run whole 1 --data-path "$A" --split 1,0,0 --eval-interval 0
check "--train-data-path A against --data-path A --split 1,0,0 (iterations, bitwise)" \
  "$(cmp -s "$tmp/split.train" "$tmp/whole.train" && wc -l <"$tmp/split.train")" 4
run split2 2 --train-data-path "$A" --eval-interval 0
run whole2 2 --data-path "$A" --split 1,0,0 --eval-interval 0
check "the same on 2 ranks" "$(cmp -s "$tmp/split2.train" "$tmp/whole2.train" && wc -l <"$tmp/split2.train")" 4

run vb 1 --lr 0 --train-data-path "$A" --valid-data-path "$B" --test-data-path "$C" --eval-interval 2
run va 1 --lr 0 --train-data-path "$A" --valid-data-path "$A" --eval-interval 2
check "evaluations with B and C: valid at 2 and 4, a test at 4" \
  "$(cut -d' ' -f1,2 "$tmp/vb.valid" | tr '\n' ' ')" "valid_lm_loss 2 valid_lm_loss 4 test_lm_loss 4 "
check "without --test-data-path: no test" "$(cut -d' ' -f1,2 "$tmp/va.valid" | tr '\n' ' ')" \
  "valid_lm_loss 2 valid_lm_loss 4 "
if [ -s "$tmp/vb.valid" ] && [ "$(grep '^valid' "$tmp/vb.valid")" != "$(grep '^valid' "$tmp/va.valid")" ]; then
  ok "the validation reads B, not A"
else
  bad "validation losses with B equal those with A"
fi
check "the training is the same whichever split validates" \
  "$(cmp -s "$tmp/vb.train" "$tmp/va.train" && echo same)" same
# The test split reads C: the same test loss whichever set validates; another with B.
run vc 1 --lr 0 --train-data-path "$A" --valid-data-path "$C" --test-data-path "$C" --eval-interval 2
run tb 1 --lr 0 --train-data-path "$A" --valid-data-path "$B" --test-data-path "$B" --eval-interval 2
tl() { grep '^test_lm_loss' "$tmp/$1.valid"; }
if [ -n "$(tl vb)" ] && [ "$(tl vb)" == "$(tl vc)" ] && [ "$(tl vb)" != "$(tl tb)" ]; then
  ok "the test reads --test-data-path: $(tl vb)"
else
  bad "test losses: C/B-valid '$(tl vb)', C/C-valid '$(tl vc)', B '$(tl tb)'"
fi
# Validation on 2 ranks reads the same samples (pp 2: one model, another layout).
run vb2 2 --lr 0 --train-data-path "$A" --valid-data-path "$B" --test-data-path "$C" --eval-interval 2 \
  --pipeline-model-parallel-size 2
python3 - "$tmp/vb.valid" "$tmp/vb2.valid" <<'EOF' && ok "the evaluations on pp 2 equal 1 rank's" || bad "evaluations on pp 2 differ"
import sys
a, b = ([l.split() for l in open(f)] for f in sys.argv[1:])
sys.exit(0 if len(a) == len(b) == 3 and all(x[:2] == y[:2] and abs(float(x[2]) - float(y[2])) <= 1e-6 * abs(float(x[2])) for x, y in zip(a, b)) else 1)
EOF
# A resume that adds a validation set trains on: no warning about other data.
run r1 1 --train-data-path "$A" --eval-interval 0 --train-iters 2 --save "$tmp/ck"
run r2 1 --train-data-path "$A" --valid-data-path "$B" --eval-interval 2 --load "$tmp/ck"
if grep -q "other data" "$tmp/r2.log"; then bad "a resume adding --valid-data-path warns about other data"
else ok "a resume adding --valid-data-path does not warn"; fi
run blend 1 --train-data-path 0.7 "$A" 0.3 "$C" --valid-data-path "$B" "$C" --eval-interval 2
check "weighted and by-size blends per split" "$(grep -c . "$tmp/blend.valid" 2>/dev/null)" 2

# Megatron's data-args files: the same runs as the flags they stand for, bit for bit.
printf '0.7 %s\n0.3\t%s\n' "$A" "$C" >"$tmp/args.txt"
run dfile 1 --data-args-path "$tmp/args.txt" --split 98,2,0 --eval-interval 2 --lr 0
run dflag 1 --data-path 0.7 "$A" 0.3 "$C" --split 98,2,0 --eval-interval 2 --lr 0
check "--data-args-path is --data-path's list (training and validation, bitwise)" \
  "$(cmp -s "$tmp/dfile.train" "$tmp/dflag.train" && cmp -s "$tmp/dfile.valid" "$tmp/dflag.valid" && echo same)" same
printf '{"train": "%s", "valid": ["%s"], "test": null}\n' "$A" "$B" >"$tmp/split.json"
run sfile 1 --lr 0 --per-split-data-args-path "$tmp/split.json" --eval-interval 2
run sflag 1 --lr 0 --train-data-path "$A" --valid-data-path "$B" --eval-interval 2
check "--per-split-data-args-path is the per-split flags (a null test: none)" \
  "$(cmp -s "$tmp/sfile.train" "$tmp/sflag.train" && cmp -s "$tmp/sfile.valid" "$tmp/sflag.valid" && grep -c . "$tmp/sfile.valid")" 2

# refused WHAT WANT FLAGS...: exit 2 and WANT in the output.
refused() {
  local what=$1 want=$2
  shift 2
  local out rc
  out=$(timeout 60 "$weft" train "${model[@]}" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$out"; then ok "$what: refused: $want"
  else bad "$what: exit $rc, wanted 2 and '$want': $(grep -m2 -i error <<<"$out")"; fi
}
refused "--data-path beside them" "--data-path and --train/valid/test-data-path both given" \
  --data-path "$A" --valid-data-path "$B"
refused "valid without train" "--valid-data-path/--test-data-path without --train-data-path" \
  --valid-data-path "$B"
refused "--mock-data beside them" "--mock-data and --train-data-path/--valid-data-path/--test-data-path both given" \
  --mock-data --train-data-path "$A"
refused "a missing prefix" "--valid-data-path: $tmp/nothing.idx does not exist" \
  --train-data-path "$A" --valid-data-path "$tmp/nothing"
refused "a missing test prefix" "--test-data-path: $tmp/nothing.idx does not exist" \
  --train-data-path "$A" --test-data-path "$tmp/nothing"
refused "--split beside them" "--split with --train/valid/test-data-path" \
  --train-data-path "$A" --split 1,1,1
refused "--data-args-path beside --data-path" "--data-args-path and --data-path both give the blend" \
  --data-args-path "$tmp/args.txt" --data-path "$A"
refused "--per-split-data-args-path beside the flags" \
  "--per-split-data-args-path and --train/valid/test-data-path both give" \
  --per-split-data-args-path "$tmp/split.json" --train-data-path "$A"
printf '{"train": "%s", "vaild": "%s"}' "$A" "$B" >"$tmp/typo.json"
refused "a misspelt split" "unknown key \"vaild\"" --per-split-data-args-path "$tmp/typo.json"
printf '{"train": ' >"$tmp/cut.json"
refused "a cut JSON file" "--per-split-data-args-path $tmp/cut.json: not JSON" \
  --per-split-data-args-path "$tmp/cut.json"
refused "a missing file" "--data-args-path $tmp/none.txt: cannot read the file" \
  --data-args-path "$tmp/none.txt"
printf '{"text": "1 2"}\n' >"$tmp/tiny.jsonl"
"$weft" data preprocess --input "$tmp/tiny.jsonl" --output-prefix "$tmp/tiny" --append-eod \
  --tokenizer-type NullTokenizer --vocab-size 61 >"$tmp/pre.log" 2>&1
refused "a test set smaller than one sample" \
  "--test-data-path: $tmp/tiny_text_document holds 3 tokens, fewer than one sample" \
  --train-data-path "$A" --test-data-path "$tmp/tiny_text_document" --eval-interval 2
finish
