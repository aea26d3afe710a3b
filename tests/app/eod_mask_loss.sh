#!/usr/bin/env bash
# --eod-mask-loss through the weft command, on a NullTokenizer corpus of short documents (many
# end-of-document tokens per sample):
# - the losses and gradient norms of 3 iterations with MTP are the same on 1 rank, dp 2, pp 2
#   and pp 2 x dp 2 (float32: iteration 1 within 1e-6, the next within 1e-4), and differ from
#   the run without the flag;
# - a corpus whose every token is the end of document logs an lm loss of 0 with the flag;
# - with --calculate-per-token-loss (another weighting, the same logged lm loss) likewise across
#   layouts, MoE over 4 stages included;
# - the tokenizer's pad (--null-tokenizer-pad-id), as Megatron's GPTDataset: the same across
#   layouts (with --eod-mask-loss too); the run equals the one on the corpus with 0 written for
#   the pad and pad 0 (pad ids enter the model as 0); a pad absent from the data, or equal to
#   the end of document without --allow-ambiguous-pad-tokens, changes nothing; an all-pad
#   corpus logs 0;
# - refusals: --eod-mask-loss without a tokenizer, a pad with CUDA graphs.
# Usage: eod_mask_loss.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"

# Documents of 1-9 ids in 1..59; NullTokenizer V = 61, so the end of document is 60. zeros: the
# same documents with every 7 written as 0 (no 0 otherwise); pads: nothing but 7 (no eod).
python3 - "$tmp" <<'EOF'
import json, random, sys
rng = random.Random(3)
docs = [[rng.randrange(1, 60) for _ in range(rng.randint(1, 9))] for _ in range(400)]
def write(name, rows):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"text": " ".join(map(str, r))}) + "\n")
write("docs", docs)
write("zeros", [[0 if t == 7 else t for t in d] for d in docs])
write("eods", [[60, 60, 60]] * 200)
write("pads", [[7] * 9] * 200)
EOF
for c in docs zeros eods pads; do
  eod=--append-eod
  [ "$c" = pads ] && eod=
  "$weft" data preprocess --input "$tmp/$c.jsonl" --output-prefix "$tmp/$c" $eod \
    --tokenizer-type NullTokenizer --vocab-size 61 >"$tmp/pre.log" 2>&1 ||
    { echo "preprocess $c failed: $(tail -1 "$tmp/pre.log")"; exit 1; }
done

model=(--num-layers 4 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
       --train-iters 3 --lr 1e-2 --min-lr 1e-3 --threads 1 --split 100,0,0 --eval-interval 0
       --log-interval 1 --mtp-num-layers 1 --tokenizer-type NullTokenizer --vocab-size 61 --seed 5)
run() {  # run NAME NP FLAGS...: (iteration, lm, mtp, grad norm) lines to NAME.txt
  local name=$1 np=$2
  shift 2
  if ! timeout 200 "${mpirun[@]}" -np "$np" "$weft" train "${model[@]}" \
       --log-jsonl "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1; then
    bad "$name: $(grep -m1 -i error "$tmp/$name.log")"
    return 1
  fi
  python3 - "$tmp/$name.jsonl" >"$tmp/$name.txt" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "lm_loss" in r:
        print(r["iteration"], repr(r["lm_loss"]), repr(r.get("mtp_loss", 0)), repr(r["grad_norm"]))
EOF
}
close() {  # close WHAT A B: iteration 1 within 1e-6, later ones (float32 noise that Adam carries
           # on) within 1e-4, relative
  python3 - "$tmp/$2.txt" "$tmp/$3.txt" <<'EOF' && ok "$1" || bad "$1: $(paste "$tmp/$2.txt" "$tmp/$3.txt" | head -3)"
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    tol = 1e-6 if x[0] == "1" else 1e-4
    for u, v in zip(x[1:], y[1:]):
        assert abs(float(u) - float(v)) <= tol * max(abs(float(v)), 1e-6), (x, y)
EOF
}
data=(--data-path "$tmp/docs_text_document")
run one 1 "${data[@]}" --eod-mask-loss
run dp2 2 "${data[@]}" --eod-mask-loss
run pp2 2 "${data[@]}" --eod-mask-loss --pipeline-model-parallel-size 2
run pp2dp2 4 "${data[@]}" --eod-mask-loss --pipeline-model-parallel-size 2
run unmasked 1 "${data[@]}"
close "dp 2 equals one rank" one dp2
close "pp 2 equals one rank" one pp2
close "pp 2 x dp 2 equals one rank" one pp2dp2
python3 - "$tmp/one.txt" "$tmp/unmasked.txt" <<'EOF' && ok "the mask changes the loss" || bad "--eod-mask-loss left the loss as it was"
import sys
a, b = open(sys.argv[1]).readline().split(), open(sys.argv[2]).readline().split()
assert abs(float(a[1]) - float(b[1])) > 1e-4 * abs(float(b[1])), (a, b)
EOF
# --calculate-per-token-loss: another weighting, the same on every layout; with MoE on 4 stages
# the middle stages weigh their aux losses by the step's count too.
run tok_one 1 "${data[@]}" --eod-mask-loss --calculate-per-token-loss
run tok_pp2dp2 4 "${data[@]}" --eod-mask-loss --calculate-per-token-loss --pipeline-model-parallel-size 2
close "--calculate-per-token-loss: pp 2 x dp 2 equals one rank" tok_one tok_pp2dp2
python3 - "$tmp/one.txt" "$tmp/tok_one.txt" <<'EOF' && ok "--calculate-per-token-loss weighs otherwise" || bad "--calculate-per-token-loss gave the default's gradients"
import sys
a, b = open(sys.argv[1]).readline().split(), open(sys.argv[2]).readline().split()
assert a[1] == b[1] and abs(float(a[3]) - float(b[3])) > 1e-6 * float(a[3]), (a, b)
EOF
moe=(--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 --moe-ffn-hidden-size 32)
run moe_one 1 "${data[@]}" "${moe[@]}" --eod-mask-loss --calculate-per-token-loss
run moe_pp4 4 "${data[@]}" "${moe[@]}" --eod-mask-loss --calculate-per-token-loss \
  --pipeline-model-parallel-size 4
close "--calculate-per-token-loss with MoE: pp 4 equals one rank" moe_one moe_pp4
if run eods 1 --data-path "$tmp/eods_text_document" --eod-mask-loss; then
  python3 - "$tmp/eods.txt" <<'EOF' && ok "every input token the end of document: lm loss 0" || bad "all-eod corpus: $(head -1 "$tmp/eods.txt")"
import sys
rows = [l.split() for l in open(sys.argv[1])]
assert all(float(r[1]) == 0.0 and float(r[2]) == 0.0 and float(r[3]) == 0.0 for r in rows), rows
EOF
fi

# The tokenizer's pad (--null-tokenizer-pad-id), as Megatron's GPTDataset: labels equal to it
# leave the loss, pad tokens and labels enter the model as 0.
same() {  # same WHAT A B: the same losses and norms, digit for digit
  cmp -s "$tmp/$2.txt" "$tmp/$3.txt" && [ -s "$tmp/$2.txt" ] && ok "$1" ||
    bad "$1: $(paste "$tmp/$2.txt" "$tmp/$3.txt" | head -3)"
}
differs() {  # differs WHAT A B: iteration 1's lm loss differs
  python3 - "$tmp/$2.txt" "$tmp/$3.txt" <<'EOF' && ok "$1" || bad "$1: $(paste "$tmp/$2.txt" "$tmp/$3.txt" | head -1)"
import sys
a, b = open(sys.argv[1]).readline().split(), open(sys.argv[2]).readline().split()
assert abs(float(a[1]) - float(b[1])) > 1e-4 * abs(float(b[1])), (a, b)
EOF
}
run pad_one 1 "${data[@]}" --null-tokenizer-pad-id 7
run pad_pp2dp2 4 "${data[@]}" --null-tokenizer-pad-id 7 --pipeline-model-parallel-size 2
close "pad: pp 2 x dp 2 equals one rank" pad_one pad_pp2dp2
differs "the pad changes the loss" pad_one unmasked
# The corpus with 0 for 7 and pad 0 is the same run: same mask, same inputs (pad ids become 0).
run pad_zeros 1 --data-path "$tmp/zeros_text_document" --null-tokenizer-pad-id 0
same "pad 7 runs as the corpus with 0 for 7 and pad 0" pad_one pad_zeros
run pad_eod_one 1 "${data[@]}" --null-tokenizer-pad-id 7 --eod-mask-loss --calculate-per-token-loss
run pad_eod_pp2dp2 4 "${data[@]}" --null-tokenizer-pad-id 7 --eod-mask-loss \
  --calculate-per-token-loss --pipeline-model-parallel-size 2
close "pad and --eod-mask-loss, per token: pp 2 x dp 2 equals one rank" pad_eod_one pad_eod_pp2dp2
# A pad that never occurs masks nothing: the unmasked run, digit for digit.
run pad_absent 1 "${data[@]}" --null-tokenizer-pad-id 100
same "a pad absent from the data changes nothing" pad_absent unmasked
# A pad equal to the end of document is dropped with a warning, unless --allow-ambiguous-pad-tokens.
run pad_is_eod 1 "${data[@]}" --null-tokenizer-pad-id 60
same "a pad equal to the end of document masks nothing" pad_is_eod unmasked
grep -q "pad id 60 is also its end of document" "$tmp/pad_is_eod.log" &&
  ok "the ambiguous pad is warned about" || bad "no warning for a pad equal to the eod"
run pad_ambiguous 1 "${data[@]}" --null-tokenizer-pad-id 60 --allow-ambiguous-pad-tokens
differs "--allow-ambiguous-pad-tokens masks the pad" pad_ambiguous unmasked
if run pads 1 --data-path "$tmp/pads_text_document" --null-tokenizer-pad-id 7; then
  python3 - "$tmp/pads.txt" <<'EOF' && ok "every label the pad: lm loss 0" || bad "all-pad corpus: $(head -1 "$tmp/pads.txt")"
import sys
rows = [l.split() for l in open(sys.argv[1])]
assert all(float(r[1]) == 0.0 and float(r[2]) == 0.0 and float(r[3]) == 0.0 for r in rows), rows
EOF
fi

refuse() {  # refuse NEEDLE FLAGS...
  local needle=$1
  shift
  "$weft" train "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  [ "$rc" -eq 2 ] && [ "$(grep -c . "$tmp/err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/err" &&
    ok "refused: $(cat "$tmp/err")" || bad "exit $rc, wanted '$needle': $(head -3 "$tmp/err")"
}
refuse "--eod-mask-loss needs the tokenizer's end-of-document id" --num-layers 2 --hidden-size 32 \
  --num-attention-heads 4 --seq-length 16 --vocab-size 64 --mock-data --eod-mask-loss

refuse "with the tokenizer's pad id 7" "${model[@]}" "${data[@]}" --null-tokenizer-pad-id 7 \
  --cuda-graph-impl local --device cuda
finish
