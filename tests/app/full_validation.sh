#!/usr/bin/env bash
# --full-validation and --multiple-validation-sets (Megatron's ValidationConfig) on NullTokenizer
# corpora B and C, with --lr 0 so that the model never changes:
# - one pass over B holds F = ceil(tokens / seq_length) samples; a run that reads the stream's
#   first F samples as --eval-iters F batches of 1 (no --full-validation) is the reference;
#   --full-validation gives its loss at every evaluation, with evaluation batches that leave a
#   padded last round (4 of 1, 6 of 3) on 1 rank, on dp 2 and on pp 2, and with --eod-mask-loss;
# - --multiple-validation-sets over B and C prints one block per set under
#   --validation-set-names (or 0, 1), each the set's own full-validation loss, and the single
#   --full-validation loss of "B C" is their mean weighted by positions;
# - --skip-train --full-validation evaluates the same;
# - refusals name their flags.
# Usage: full_validation.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"

null_corpus A 3 200
null_corpus B 4 90
null_corpus C 5 60
A=$tmp/A_text_document B=$tmp/B_text_document C=$tmp/C_text_document
seq=16
# F: the samples of one pass over B (every document is valid: --valid-data-path takes them all).
passes=$(python3 - "$B.idx" "$C.idx" "$seq" <<'EOF'
import struct, sys
out = []
for idx in sys.argv[1:3]:
    with open(idx, "rb") as f:
        data = f.read()
    # Megatron's .idx: magic(9) version(8) dtype(1) sequences(8) documents(8), then int32 sizes.
    n = struct.unpack_from("<Q", data, 18)[0]
    tokens = sum(struct.unpack_from(f"<{n}i", data, 34))
    seq = int(sys.argv[3])
    # One pass: ceil((tokens - 1) / seq) windows. The reference below reads the stream's first
    # samples, the pass's whole shuffled block, ceil(tokens / seq): the same set only where
    # tokens % seq != 1 (the corpora are chosen so; test_gpt_dataset checks the other case).
    assert tokens % seq != 1, (idx, tokens)
    out.append(str(-(-(tokens - 1) // seq)))
print(" ".join(out))
EOF
)
read -r FB FC <<< "$passes"
echo "one pass: B $FB samples, C $FC samples"
model=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --seq-length $seq --micro-batch-size 1 --global-batch-size 4 --train-iters 4
       --log-interval 1 --threads 1 --seed 5 --lr 0 --tokenizer-type NullTokenizer --vocab-size 61
       --train-data-path "$A")
# run NAME NP FLAGS...
run() {
  local name=$1 np=$2
  shift 2
  if ! timeout 300 "${mpirun[@]}" -np "$np" "$weft" train "${model[@]}" \
       --log-jsonl "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1; then
    bad "$name: weft train $* failed: $(grep -m3 error "$tmp/$name.log")"
  fi
}
run ref 1 --valid-data-path "$B" --eval-interval 4 --eval-iters "$FB" \
  --eval-global-batch-size 1 --eval-micro-batch-size 1
run full 1 --valid-data-path "$B" --eval-interval 2 --full-validation
run full6 1 --valid-data-path "$B" --eval-interval 2 --full-validation \
  --eval-global-batch-size 6 --eval-micro-batch-size 3
run dp2 2 --valid-data-path "$B" --eval-interval 2 --full-validation --eval-micro-batch-size 3 \
  --eval-global-batch-size 6
run pp2 2 --valid-data-path "$B" --eval-interval 2 --full-validation --pipeline-model-parallel-size 2
run refeod 1 --valid-data-path "$B" --eval-interval 4 --eval-iters "$FB" \
  --eval-global-batch-size 1 --eval-micro-batch-size 1 --eod-mask-loss
run fulleod 2 --valid-data-path "$B" --eval-interval 2 --full-validation --eod-mask-loss
run fullc 1 --valid-data-path "$C" --eval-interval 4 --full-validation
run both 1 --valid-data-path "$B" "$C" --eval-interval 4 --full-validation
run multi 2 --valid-data-path "$B" "$C" --eval-interval 4 --full-validation \
  --multiple-validation-sets --validation-set-names bee cee
run multi0 1 --valid-data-path "$B" "$C" --eval-interval 4 --full-validation \
  --multiple-validation-sets
run skip 1 --valid-data-path "$B" --full-validation --skip-train
grep -q "validation-bee loss at iteration 4" "$tmp/multi.log" &&
  grep -q "validation-cee loss at iteration 4" "$tmp/multi.log" && ok "one block per named set" ||
  bad "no validation-bee/-cee blocks: $(grep -m2 validation "$tmp/multi.log")"
grep -q "validation-1 loss at iteration 4" "$tmp/multi0.log" && ok "sets named 0, 1 by default" ||
  bad "no validation-1 block: $(grep -m2 validation "$tmp/multi0.log")"
python3 - "$tmp" "$FB" "$FC" "$seq" <<'EOF' || fails=$((fails + 1))
import json, sys
d, fb, fc, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def v(name, set_=None):
    return {r["iteration"]: r["valid_lm_loss"] for r in map(json.loads, open(f"{d}/{name}.jsonl"))
            if "valid_lm_loss" in r and r.get("valid_set") == set_}
close = lambda x, y: abs(x - y) <= 2e-6 * abs(y)
ref, refeod = v("ref")[4], v("refeod")[4]
full = v("full")
checks = [
    ("full validation at 2 and 4, the same each time", sorted(full) == [2, 4] and full[2] == full[4]),
    ("full validation is the loss over the F samples of one pass", close(full[4], ref)),
    ("eval batch 6 of 3 (a padded last round)", close(v("full6")[4], ref)),
    ("dp 2, eval batch 6 of 3", close(v("dp2")[4], ref)),
    ("pp 2", close(v("pp2")[4], ref)),
    ("with --eod-mask-loss on dp 2", close(v("fulleod")[4], refeod) and not close(refeod, ref)),
    ("set bee is B's full validation", close(v("multi", "bee")[4], full[4])),
    ("set cee is C's full validation", close(v("multi", "cee")[4], v("fullc")[4])),
    ("default names 0 and 1", close(v("multi0", "0")[4], full[4]) and close(v("multi0", "1")[4], v("fullc")[4])),
    ("B C as one set: the positions' mean",
     close(v("both")[4], (full[4] * fb + v("fullc")[4] * fc) / (fb + fc))),
    ("--skip-train --full-validation", close(v("skip")[0], ref)),
]
for n, good in checks: print(("ok   " if good else "FAIL ") + n)
print("ref", ref, "full", full, "both", v("both"))
sys.exit(0 if all(g for _, g in checks) else 1)
EOF
refused() {  # WANT FLAGS...
  local want=$1
  shift
  out=$("$weft" train "${model[@]}" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$want" <<< "$out"; then ok "refused: $want"; else
    bad "$* (rc $rc) should be refused with '$want': $(tail -2 <<< "$out")"; fi
}
refused "--multiple-validation-sets needs --full-validation" --valid-data-path "$B" "$C" \
  --multiple-validation-sets
refused "--multiple-validation-sets needs --valid-data-path" --full-validation \
  --multiple-validation-sets
refused "give the datasets without weights" --valid-data-path 1 "$B" 2 "$C" --full-validation \
  --multiple-validation-sets
refused "--validation-set-names gives 1 names for the 2 datasets" --valid-data-path "$B" "$C" \
  --full-validation --multiple-validation-sets --validation-set-names x
refused "--validation-set-names needs --multiple-validation-sets" --valid-data-path "$B" \
  --validation-set-names x
refused "--valid-data-path with weights and --full-validation" --valid-data-path 1 "$B" 2 "$C" \
  --full-validation
refused "--full-validation with --moe-expert-capacity-factor" --valid-data-path "$B" \
  --full-validation --num-experts 4 --moe-expert-capacity-factor 1
out=$("$weft" train --mock-data --num-layers 1 --hidden-size 32 --num-attention-heads 4 \
  --seq-length 16 --train-iters 1 --full-validation 2>&1)
[ $? -eq 2 ] && grep -qF -- "--full-validation needs indexed datasets" <<< "$out" &&
  ok "refused: --full-validation with mock data" || bad "--full-validation with mock data: $out"
finish
