#!/usr/bin/env bash
# Megatron's optimizer-schedule flags and the router z-loss, end to end on one rank:
# - --weight-decay-incr-style linear with equal ends is the constant --weight-decay, bit for bit;
# - an increasing schedule's first update uses --start-weight-decay (iterations 1-2 are those of
#   --weight-decay 0 when it starts at 0) and its later ones more (iteration 3 differs): the
#   schedule counts the updates made, as Megatron's get_wd;
# - a resume continues the schedule: iterations 3-4 of a resumed cosine run are the straight
#   run's bits; a resume with another end warns naming the weight decay;
# - the flags' checks (Megatron's asserts) refuse with one line naming the flag;
# - --decoupled-lr equal to --lr is the plain run bit for bit; another one changes the second
#   iteration, not the first; the checkpoint puts the word embedding and the output layer, and
#   nothing else, in the "decoupled" group; a resume continues it (bitwise) and warns when the
#   rate differs;
# - --moe-z-loss-coeff logs the router z-loss (console and JSONL) and changes the gradient but
#   not the first loss; without it the z-loss is 0;
# - --grad-reduce-in-bf16 with --bf16 keeps the first loss and changes the grad norm (the
#   gradients are rounded to bf16), resumes bit for bit, and weft plan counts 2 bytes per
#   gradient; without --bf16 it warns and changes no bit; with the precision-aware optimizer it
#   is refused.
# Usage: optimizer_flags.sh WEFT
source "$(dirname "$0")/lib.sh" "$@"
model=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --seq-length 16 --vocab-size 64 --micro-batch-size 2 --global-batch-size 4
       --eval-interval 0 --log-interval 1 --threads 1 --lr 1e-2 --seed 3)
# run NAME FLAGS...: trains on one rank; the JSONL's (iteration, loss, grad norm, z-loss) to NAME.txt.
run() {
  local name=$1
  shift
  if ! timeout 120 "$weft" train "${model[@]}" --log-jsonl "$tmp/$name.jsonl" "$@" \
       >"$tmp/$name.log" 2>"$tmp/$name.err"; then
    bad "$name: weft train $* failed: $(head -3 "$tmp/$name.err")"
    return
  fi
  python3 - "$tmp/$name.jsonl" >"$tmp/$name.txt" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "lm_loss" in r:
        print(r["iteration"], repr(r["lm_loss"]), repr(r["grad_norm"]), repr(r["z_loss"]))
EOF
}
# rows NAME FIRST LAST: lines FIRST..LAST of NAME.txt
rows() { sed -n "$2,$3p" "$tmp/$1.txt"; }
same() {  # same WHAT A B [FIRST LAST]: lines FIRST..LAST of A.txt and B.txt (default all)
  local a b
  a=$(rows "$2" "${4:-1}" "${5:-100}")
  b=$(rows "$3" "${4:-1}" "${5:-100}")
  if [ -n "$a" ] && [ "$a" == "$b" ]; then ok "$1"; else
    bad "$1: $2 and $3 differ"
    paste <(echo "$a") <(echo "$b") | head -6
  fi
}
refuse() {  # refuse NEEDLE FLAGS...
  local needle=$1
  shift
  timeout 60 "$weft" train "${model[@]}" --train-iters 2 "$@" >"$tmp/r.out" 2>"$tmp/r.err"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(grep -c . "$tmp/r.err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/r.err" &&
     ! grep -q " iteration " "$tmp/r.out"; then
    ok "refused: $(cat "$tmp/r.err")"
  else
    bad "$*: exit $rc, wanted 2 and one line with '$needle': $(head -3 "$tmp/r.err")"
  fi
}

# --- the weight-decay schedule ------------------------------------------------------------------
run plain --train-iters 4
run flat --train-iters 4 --weight-decay-incr-style linear --start-weight-decay 0.01 \
  --end-weight-decay 0.01
same "linear from 0.01 to 0.01 is the constant --weight-decay 0.01" plain flat
run wd0 --train-iters 4 --weight-decay 0
run linear --train-iters 4 --weight-decay-incr-style linear --start-weight-decay 0 \
  --end-weight-decay 0.5
same "linear from 0: the first update without weight decay (iterations 1-2 of --weight-decay 0)" \
  wd0 linear 1 2
[ "$(rows wd0 3 3)" != "$(rows linear 3 3)" ] && ok "linear from 0 to 0.5: the second update decays" ||
  bad "the increasing weight decay changed nothing at iteration 3"
run straight --train-iters 4 --weight-decay-incr-style cosine --start-weight-decay 0.05 \
  --end-weight-decay 0.5 --save "$tmp/ck" --save-interval 2
run resumed --train-iters 4 --weight-decay-incr-style cosine --start-weight-decay 0.05 \
  --end-weight-decay 0.5 --load "$tmp/ck" --ckpt-step 2
rows straight 3 4 >"$tmp/straight34.txt"
same "a resumed cosine schedule: iterations 3-4 as the straight run" straight34 resumed
run other_end --train-iters 4 --weight-decay-incr-style cosine --start-weight-decay 0.05 \
  --end-weight-decay 0.3 --load "$tmp/ck" --ckpt-step 2
grep -qF "a weight decay of 0.05 to 0.3 (cosine, over 16 samples) (checkpoint: 0.05 to 0.5 (cosine, over 16 samples)" \
  "$tmp/other_end.err" && ok "a resume with another --end-weight-decay warns, naming it" ||
  bad "no weight-decay warning: $(cat "$tmp/other_end.err")"
run continued --train-iters 4 --load "$tmp/ck" --ckpt-step 2 --use-checkpoint-opt_param-scheduler
same "--use-checkpoint-opt_param-scheduler continues the checkpoint's weight decay" straight34 continued
refuse "--start-weight-decay 0.1 needs --weight-decay-incr-style linear or cosine" \
  --start-weight-decay 0.1
refuse "--weight-decay-incr-style linear needs --end-weight-decay" \
  --weight-decay-incr-style linear --start-weight-decay 0
refuse "--end-weight-decay 0.01 is smaller than --start-weight-decay 0.1" \
  --weight-decay-incr-style cosine --start-weight-decay 0.1 --end-weight-decay 0.01
refuse "--weight-decay-incr-style must be constant, linear or cosine" --weight-decay-incr-style exp
refuse "--start-weight-decay must be >= 0" --weight-decay-incr-style linear \
  --start-weight-decay -0.5 --end-weight-decay 0.1

# --- --decoupled-lr -------------------------------------------------------------------------------
untied=(--untie-embeddings-and-output-weights --train-iters 4)
run dplain "${untied[@]}" --min-lr 1e-3 --lr-decay-style cosine
run dsame "${untied[@]}" --min-lr 1e-3 --lr-decay-style cosine --decoupled-lr 1e-2
same "--decoupled-lr equal to --lr (minimum --min-lr) is the plain run" dplain dsame
run dstraight "${untied[@]}" --min-lr 1e-3 --lr-decay-style cosine --decoupled-lr 5e-2 \
  --decoupled-min-lr 2e-3 --save "$tmp/dck" --save-interval 2
same "--decoupled-lr 5e-2: the first iteration as the plain run" dplain dstraight 1 1
[ "$(rows dplain 2 2)" != "$(rows dstraight 2 2)" ] && ok "--decoupled-lr 5e-2 changes the first update" ||
  bad "--decoupled-lr 5e-2 changed nothing"
python3 - "$tmp/dck/iter_0000002/metadata.json" <<'EOF' && ok "the decoupled group holds the embedding and the output layer only" || bad "decoupled group: see above"
import json, sys
groups = json.load(open(sys.argv[1]))["optimizer"]["param_groups"]
decoupled = sorted(n for n, g in groups.items() if g["group"] == "decoupled")
assert decoupled == ["embedding.word_embeddings.weight", "output_layer.weight"], decoupled
assert all(g["group"] in ("decay", "no_decay") for n, g in groups.items() if n not in decoupled)
EOF
run dresumed "${untied[@]}" --min-lr 1e-3 --lr-decay-style cosine --decoupled-lr 5e-2 \
  --decoupled-min-lr 2e-3 --load "$tmp/dck" --ckpt-step 2
rows dstraight 3 4 >"$tmp/dstraight34.txt"
same "a resumed --decoupled-lr run: iterations 3-4 as the straight run" dstraight34 dresumed
run dother "${untied[@]}" --min-lr 1e-3 --lr-decay-style cosine --decoupled-lr 3e-2 \
  --decoupled-min-lr 2e-3 --load "$tmp/dck" --ckpt-step 2
grep -qF -- "--decoupled-lr 0.03 (checkpoint: 0.05)" "$tmp/dother.err" &&
  ok "a resume with another --decoupled-lr warns, naming it" || bad "no --decoupled-lr warning: $(cat "$tmp/dother.err")"
refuse "--decoupled-min-lr 0.001 needs --decoupled-lr" --decoupled-min-lr 1e-3
refuse "--decoupled-min-lr 0.5 must be between 0 and --decoupled-lr 0.1" --decoupled-lr 0.1 \
  --decoupled-min-lr 0.5
refuse "--use-checkpoint-opt_param-scheduler: --load $tmp/dck was trained with --decoupled-lr" \
  --load "$tmp/dck" --ckpt-step 2 --train-iters 4 --use-checkpoint-opt_param-scheduler \
  --untie-embeddings-and-output-weights

# --- the router z-loss ----------------------------------------------------------------------------
moe=(--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --train-iters 2)
run moe_plain "${moe[@]}"
run moe_z "${moe[@]}" --moe-z-loss-coeff 1e-2
python3 - "$tmp/moe_plain.txt" "$tmp/moe_z.txt" <<'EOF' && ok "--moe-z-loss-coeff: the z-loss logged, the first loss kept, the gradient changed" || bad "--moe-z-loss-coeff: $(cat "$tmp/moe_plain.txt" "$tmp/moe_z.txt")"
import sys
plain = [l.split() for l in open(sys.argv[1])]
z = [l.split() for l in open(sys.argv[2])]
assert len(plain) == len(z) == 2, (plain, z)
assert float(plain[0][3]) == 0.0, plain
assert float(z[0][3]) > 0.01, z
assert plain[0][1] == z[0][1], (plain[0], z[0])
assert plain[0][2] != z[0][2], (plain[0], z[0])
EOF
grep -q "load_balancing_loss: .* | z_loss: " "$tmp/moe_z.log" && ok "the console line names z_loss" ||
  bad "no z_loss on the console: $(grep -m1 iteration "$tmp/moe_z.log")"
grep -q "z_loss" "$tmp/moe_plain.log" && bad "z_loss on the console without --moe-z-loss-coeff" ||
  ok "no z_loss on the console without --moe-z-loss-coeff"
refuse "--moe-z-loss-coeff must be" "${moe[@]}" --moe-z-loss-coeff -1
refuse "--moe-input-jitter-eps is not implemented" "${moe[@]}" --moe-input-jitter-eps 0.1

# --- --grad-reduce-in-bf16 -------------------------------------------------------------------------
run b32 --train-iters 4 --bf16
run b16 --train-iters 4 --bf16 --grad-reduce-in-bf16 --save "$tmp/gck" --save-interval 2
python3 - "$tmp/b32.txt" "$tmp/b16.txt" <<'EOF' && ok "--grad-reduce-in-bf16: the first loss kept, the grad norm changed, the loss decreases" || bad "--grad-reduce-in-bf16: $(cat "$tmp/b32.txt" "$tmp/b16.txt")"
import sys
f32 = [l.split() for l in open(sys.argv[1])]
b16 = [l.split() for l in open(sys.argv[2])]
assert len(f32) == len(b16) == 4, (f32, b16)
assert f32[0][1] == b16[0][1], (f32[0], b16[0])
assert f32[0][2] != b16[0][2], (f32[0], b16[0])
assert abs(float(f32[0][2]) - float(b16[0][2])) < 1e-2 * float(f32[0][2]), (f32[0], b16[0])
assert float(b16[3][1]) < float(b16[0][1]), b16
EOF
run b16resumed --train-iters 4 --bf16 --grad-reduce-in-bf16 --load "$tmp/gck" --ckpt-step 2
rows b16 3 4 >"$tmp/b16_34.txt"
same "a resumed --grad-reduce-in-bf16 run: iterations 3-4 as the straight run" b16_34 b16resumed
run f32flag --train-iters 4 --grad-reduce-in-bf16
same "--grad-reduce-in-bf16 without --bf16 changes nothing" plain f32flag
grep -qF -- "--grad-reduce-in-bf16 has no effect without --bf16" "$tmp/f32flag.err" &&
  ok "--grad-reduce-in-bf16 without --bf16 warns" || bad "no warning: $(cat "$tmp/f32flag.err")"
for g in 32 16; do
  flag=()
  [ $g = 16 ] && flag=(--grad-reduce-in-bf16)
  "$weft" plan "${model[@]}" --world-size 1 --bf16 "${flag[@]}" >"$tmp/plan$g.txt" 2>&1
  "$weft" plan "${model[@]}" --world-size 1 --bf16 "${flag[@]}" --json >"$tmp/plan$g.json" 2>&1
  "$weft" plan "${model[@]}" --world-size 2 --bf16 "${flag[@]}" --json >"$tmp/plan${g}_dp2.json" 2>&1
done
python3 - "$tmp" <<'EOF' && ok "weft plan: bf16 gradient shards and reduction buffers, half the bytes" || bad "weft plan: $(grep -h gradients "$tmp"/plan*.txt)"
import json, sys
d = sys.argv[1]
line = lambda g: next(l for l in open(f"{d}/plan{g}.txt") if l.strip().startswith("gradients"))
assert "fp32 shards" in line(32) and "bf16 shards" in line(16), (line(32), line(16))
a, b = (json.load(open(f"{d}/plan{g}.json"))["rank_groups"][0]["grads"] for g in (32, 16))
assert a == 2 * b and b > 0, (a, b)
# dp 2: the full-shape gradients and the reduce-scatter buffers halve too
a, b = (json.load(open(f"{d}/plan{g}_dp2.json"))["rank_groups"][0]["comm_buffers"] for g in (32, 16))
assert a == 2 * b and b > 0, (a, b)
EOF
refuse "--grad-reduce-in-bf16 is not implemented with --use-precision-aware-optimizer" --bf16 \
  --grad-reduce-in-bf16 --use-precision-aware-optimizer

finish
