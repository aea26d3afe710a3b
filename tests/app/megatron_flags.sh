#!/usr/bin/env bash
# Megatron's flags beyond the architecture, as a Megatron user's script passes them:
# - accepted ones change nothing: a line full of them gives the losses of the plain run;
# - refused ones end the run with exit 2 and one line naming the flag (before iteration 1);
# - logging-only ones weft lacks warn and train;
# - Megatron's sample-based lengths (--train-samples, --lr-warmup-samples, --lr-decay-samples)
#   and --lr-warmup-fraction give the iteration-based run's learning rates and losses where
#   they describe the same schedule, and a sample-granular warmup where they do not;
# - Megatron's Mamba stack (--spec ...mamba_stack_spec, --is-hybrid-model, --hybrid-attention-ratio,
#   --hybrid-mlp-ratio) trains the pattern Megatron's allocation gives, bit for bit;
# - --account-for-embedding/loss-in-pipeline-split give Megatron's stages, as the equivalent
#   --decoder-first/last-pipeline-num-layers;
# - --num-query-groups applies only with --group-query-attention (default 1 there), as Megatron's
#   core_transformer_config_from_args: without it one key/value head per attention head and a
#   warning;
# - a resume whose schedule differs from the checkpoint's warns (Megatron refuses it) and trains
#   with the flags' schedule, as --override-opt_param-scheduler does without the warning;
#   --use-checkpoint-opt_param-scheduler continues the checkpoint's (the straight run's bits);
#   a resume at another --global-batch-size continues the schedule's samples.
# Usage: megatron_flags.sh WEFT MPIRUN...
source "$(dirname "$0")/lib.sh" "$@"
model=(--num-layers 3 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 16 --vocab-size 64
       --micro-batch-size 2 --global-batch-size 4 --eval-interval 0 --log-interval 1 --threads 1 --lr 1e-2
       --min-lr 1e-3 --lr-decay-style cosine --seed 3)
# run NAME FLAGS...: trains on one rank; the JSONL's (iteration, lr, loss) lines to NAME.txt.
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
        print(r["iteration"], repr(r["lr"]), repr(r["lm_loss"]), repr(r["grad_norm"]))
EOF
}
same() {  # same WHAT A B
  if [ -s "$tmp/$2.txt" ] && cmp -s "$tmp/$2.txt" "$tmp/$3.txt"; then ok "$1"; else
    bad "$1: $2 and $3 differ"
    paste "$tmp/$2.txt" "$tmp/$3.txt" | head -8
  fi
}

# --- accepted: the same bits as without them --------------------------------------------------
run plain --train-iters 4
run accepted --train-iters 4 --log-throughput --exit-signal-handler \
  --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32 --no-masked-softmax-fusion \
  --no-bias-swiglu-fusion --no-rope-fusion --no-gradient-accumulation-fusion \
  --cross-entropy-loss-fusion --ckpt-format torch_dist --ckpt-fully-parallel-save \
  --dataloader-type single --optimizer adam --attention-backend auto --num-workers 8 \
  --rotary-percent 1.0 --sequence-parallel --use-megatron-fsdp \
  --data-parallel-sharding-strategy optim_grads_params --manual-gc --timing-log-level 2 \
  --calculate-per-token-loss --no-create-attention-mask-in-dataloader --tensorboard-queue-size 5 \
  --log-validation-ppl-to-tensorboard --log-memory-to-tensorboard --empty-unused-memory-level 1 \
  --rerun-mode validate_results --initial-loss-scale 4096 --hysteresis 2 --fp8-recipe delayed \
  --disable-log-loss-scale-to-tensorboard --overlap-moe-expert-parallel-comm --delay-wgrad-compute \
  --moe-flex-dispatcher-backend deepep --moe-deepep-num-sms 20
same "accepted Megatron flags change no bit" plain accepted
# Activation recomputation keeps less for the backward and computes the same bits: full (chunks
# of 2 of the 3 layers, the last of 1) and selective (--recompute-activations, the modules given).
run recompute_full --train-iters 4 --recompute-granularity full --recompute-method uniform \
  --recompute-num-layers 2
same "--recompute-granularity full changes no bit" plain recompute_full
run recompute_sel --train-iters 4 --recompute-activations --recompute-modules core_attn mlp
same "--recompute-activations --recompute-modules core_attn mlp changes no bit" plain recompute_sel
# --rotary-percent 0.5 (Nemotron-H 8B's): half of each head rotates, so the losses change.
run partial --train-iters 4 --rotary-percent 0.5
if [ -s "$tmp/partial.txt" ] && ! cmp -s "$tmp/plain.txt" "$tmp/partial.txt"; then
  ok "--rotary-percent 0.5 trains another function"
else
  bad "--rotary-percent 0.5 gave the whole-head losses (or none)"
fi
[ -s "$tmp/accepted.err" ] && bad "accepted flags printed to stderr: $(head -2 "$tmp/accepted.err")"
# --group-query-attention: its groups (default 1) apply only with it, as in Megatron.
params() {  # params FLAGS...: the model's parameter count from weft train's log, stderr to $tmp/p.err
  timeout 120 "$weft" train --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 \
    --num-attention-heads 4 --seq-length 16 --vocab-size 64 --micro-batch-size 2 \
    --global-batch-size 2 --train-iters 1 --eval-interval 0 --threads 1 "$@" 2>"$tmp/p.err" |
    sed -n 's/.*parameters: \([0-9]*\) in the model.*/\1/p'
}
# Each key/value head fewer drops its k and v rows (head dim 8) of 32 columns in each of 2 layers.
mha=$(params) ignored=$(params --num-query-groups 2) gqa2=$(params --group-query-attention --num-query-groups 2)
mqa=$(params --group-query-attention) mqa1=$(params --group-query-attention --num-query-groups 1)
if [ -n "$mha" ] && [ "$ignored" = "$mha" ] && [ "$gqa2" = $((mha - 2 * 2 * 2 * 32 * 8)) ] &&
   [ "$mqa" = $((mha - 2 * 2 * 3 * 32 * 8)) ] && [ "$mqa" = "$mqa1" ]; then
  ok "--num-query-groups applies with --group-query-attention only (default 1)"
else
  bad "key/value heads: MHA $mha, --num-query-groups 2 alone $ignored, with the flag $gqa2, flag alone $mqa (groups 1: $mqa1)"
fi
params --num-query-groups 2 > /dev/null
grep -q "warning: --num-query-groups 2 has no effect without --group-query-attention" "$tmp/p.err" &&
  ok "--num-query-groups without --group-query-attention warns" ||
  bad "no warning for --num-query-groups without --group-query-attention: $(head -2 "$tmp/p.err")"
# Group-limited routing (DeepSeek-V3's): 8 experts in 4 groups, the top 4 from the best 2 groups;
# the choices differ from the top 4 over all experts, so the losses do. Group top = groups
# limits nothing: the same bits as without the flags.
moe=(--num-experts 8 --moe-router-topk 4 --moe-ffn-hidden-size 16 --moe-router-score-function sigmoid
     --moe-aux-loss-coeff 0.01 --train-iters 3)
run moe_plain "${moe[@]}"
run moe_grouped "${moe[@]}" --moe-router-num-groups 4 --moe-router-group-topk 2
run moe_all_groups "${moe[@]}" --moe-router-num-groups 4 --moe-router-group-topk 4
if [ -s "$tmp/moe_grouped.txt" ] && ! cmp -s "$tmp/moe_plain.txt" "$tmp/moe_grouped.txt"; then
  ok "--moe-router-group-topk 2 of 4 groups trains another function"
else
  bad "--moe-router-group-topk 2 of 4 groups gave the ungrouped losses (or none)"
fi
same "--moe-router-group-topk = --moe-router-num-groups limits nothing" moe_plain moe_all_groups
# A repeated flag takes its last occurrence (Megatron's argparse likewise), lists included.
run moe_repeated "${moe[@]}" --moe-aux-loss-coeff 0.5 --moe-aux-loss-coeff 0.01 \
  --moe-router-load-balancing-type seq_aux_loss --moe-router-load-balancing-type aux_loss
same "a repeated --moe-aux-loss-coeff / load-balancing type takes the last" moe_plain moe_repeated
# Token dropping: a capacity factor of 0.5 (each expert at most ceil(32 x 4 / 8 x 0.5) = 8 of
# a micro-batch's 128 pairs) trains another function, by either policy; factor 2 (a capacity of
# 32, every token of the micro-batch) and a negative factor (Megatron's none) drop nothing, nor
# does padding to the capacity without an expert bias.
run moe_drop "${moe[@]}" --moe-expert-capacity-factor 0.5
run moe_drop_pos "${moe[@]}" --moe-expert-capacity-factor 0.5 --moe-token-drop-policy position
run moe_drop_pad "${moe[@]}" --moe-expert-capacity-factor 0.5 --moe-pad-expert-input-to-capacity
run moe_no_drop "${moe[@]}" --moe-expert-capacity-factor 2
run moe_none "${moe[@]}" --moe-expert-capacity-factor -1
if [ -s "$tmp/moe_drop.txt" ] && [ -s "$tmp/moe_drop_pos.txt" ] &&
   ! cmp -s "$tmp/moe_plain.txt" "$tmp/moe_drop.txt" &&
   ! cmp -s "$tmp/moe_drop.txt" "$tmp/moe_drop_pos.txt"; then
  ok "--moe-expert-capacity-factor 0.5 drops pairs, by its policy"
else
  bad "--moe-expert-capacity-factor 0.5 gave the dropless losses, or both policies the same"
fi
same "--moe-pad-expert-input-to-capacity changes no loss without an expert bias" moe_drop moe_drop_pad
same "a capacity of every token drops nothing" moe_plain moe_no_drop
same "a negative capacity factor is none" moe_plain moe_none
# --moe-apply-probs-on-input (top 1): the weight scales the expert's input, another function.
run moe_top1 "${moe[@]}" --moe-router-topk 1
run moe_top1_input "${moe[@]}" --moe-router-topk 1 --moe-apply-probs-on-input
if [ -s "$tmp/moe_top1_input.txt" ] && ! cmp -s "$tmp/moe_top1.txt" "$tmp/moe_top1_input.txt"; then
  ok "--moe-apply-probs-on-input trains another function"
else
  bad "--moe-apply-probs-on-input gave the output-weighted losses (or none)"
fi

# --- warned: logging weft has not; the run trains the same --------------------------------------
run warned --train-iters 4 --log-params-norm --wandb-project p --wandb-exp-name e \
  --data-parallel-sharding-strategy no_shard --reset-position-ids --reset-attention-mask \
  --moe-per-layer-logging
same "warned flags change no bit" plain warned
for needle in "warning: --log-params-norm has no effect" "warning: --wandb-project has no effect" \
              "warning: --data-parallel-sharding-strategy no_shard" \
              "warning: --reset-position-ids has no effect" \
              "warning: --reset-attention-mask has no effect"; do
  grep -qF -- "$needle" "$tmp/warned.err" && ok "warns: $needle" || bad "no '$needle'"
done

# --- refused: exit 2, one line naming the flag, no iteration ------------------------------------
refuse() {  # refuse NEEDLE FLAGS...
  local needle=$1
  shift
  timeout 60 "$weft" train "${model[@]}" "$@" >"$tmp/r.out" 2>"$tmp/r.err"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(grep -c . "$tmp/r.err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/r.err" &&
     ! grep -q " iteration " "$tmp/r.out"; then
    ok "refused: $(cat "$tmp/r.err")"
  else
    bad "$*: exit $rc, wanted 2 and one line with '$needle': $(head -3 "$tmp/r.err")"
  fi
}
refuse "--fp16 is not implemented" --fp16
refuse "--recompute-granularity full needs --recompute-method uniform or block" \
  --recompute-granularity full
refuse "--recompute-num-layers >= 1" --recompute-granularity full --recompute-method block
refuse "--recompute-modules layernorm is not implemented" --recompute-activations \
  --recompute-modules layernorm
refuse "--rampup-batch-size is not implemented" --rampup-batch-size 2 2 8
refuse "--eod-mask-loss needs the tokenizer's end-of-document id" --eod-mask-loss
refuse "--num-layers-per-virtual-pipeline-stage is not implemented" \
  --num-layers-per-virtual-pipeline-stage 1
refuse "--moe-apply-probs-on-input needs --moe-router-topk 1 (got 2)" --num-experts 4 \
  --moe-apply-probs-on-input
refuse "--moe-router-topk-limited-devices is not implemented in weft: deprecated in Megatron" \
  --num-experts 4 --moe-router-topk-limited-devices 2
refuse "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor" --num-experts 4 \
  --moe-pad-expert-input-to-capacity
refuse "--moe-token-drop-policy must be probs or position (got 'first')" --num-experts 4 \
  --moe-expert-capacity-factor 1 --moe-token-drop-policy first
refuse "--vocab-file and --merge-file are read by --tokenizer-type GPT2BPETokenizer only" --vocab-file v.json
refuse "--moe-router-topk 1 with the softmax router needs --moe-router-pre-softmax" \
  --num-experts 4 --moe-router-topk 1
refuse "--ckpt-format torch:" --ckpt-format torch
refuse "--moe-router-group-topk 2 needs --moe-router-num-groups" --num-experts 8 \
  --moe-router-group-topk 2
refuse "--moe-router-num-groups 3 must divide --num-experts 8" --num-experts 8 \
  --moe-router-num-groups 3 --moe-router-group-topk 1
refuse "--moe-router-group-topk 4 is more than --moe-router-topk 2" --num-experts 8 \
  --moe-router-num-groups 4 --moe-router-group-topk 4
refuse "--rotary-percent must be" --rotary-percent 1.5
refuse "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer" --exp-avg-dtype bf16
refuse "--save-interval needs --save DIR" --persistent-save-interval 5  # Megatron's other name
refuse "--moe-router-load-balancing-type takes one value in weft (got 2)" --num-experts 4 \
  --moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.01 0.001
refuse "--spec foo.specs my_spec: weft builds one model code" --spec foo.specs my_spec
refuse "--hybrid-attention-ratio 0.6 plus --hybrid-mlp-ratio 0.5 exceed 1" \
  --hybrid-attention-ratio 0.6 --hybrid-mlp-ratio 0.5
refuse "the ratios allocate 'MM*-M*M-'" --num-layers 8 --hybrid-layer-pattern "MMM-M*M-" \
  --hybrid-attention-ratio 0.25 --hybrid-mlp-ratio 0.25

# --- Megatron's Mamba stack: --spec and the ratios give the allocated pattern's run ------------
mamba=(--num-layers 8 --mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2 --train-iters 2)
run hyb_pattern "${mamba[@]}" --hybrid-layer-pattern "MM*-M*M-"
run hyb_spec "${mamba[@]}" --spec megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec \
  --hybrid-attention-ratio 0.25 --hybrid-mlp-ratio 0.25
same "--spec mamba_stack_spec with ratios 0.25/0.25 trains the pattern MM*-M*M-" hyb_pattern hyb_spec
run hyb_both "${mamba[@]}" --hybrid-layer-pattern "MM*-M*M-" --is-hybrid-model \
  --hybrid-attention-ratio 0.25 --hybrid-mlp-ratio 0.25
same "a pattern agreeing with the ratios is that pattern" hyb_pattern hyb_both
run hyb_all "${mamba[@]}" --is-hybrid-model
run hyb_all_pattern "${mamba[@]}" --hybrid-layer-pattern "MMMMMMMM"
same "--is-hybrid-model without ratios is all Mamba-2, as Megatron's allocation" hyb_all hyb_all_pattern
refuse "--rotary-percent 0.1 rotates int(8 x 0.1) = 0 channels" --rotary-percent 0.1
refuse "--optimizer sgd:" --optimizer sgd
refuse "--dataloader-type cyclic:" --dataloader-type cyclic
refuse "--attention-backend x:" --attention-backend x
refuse "--train-iters and --train-samples" --train-samples 8 --train-iters 2
refuse "--lr-decay-iters with --train-samples" --train-samples 8 --lr-decay-iters 2
refuse "--train-samples 3 is less than one global batch" --train-samples 3
refuse "--lr-decay-samples needs --train-samples" --lr-decay-samples 8
refuse "--lr-warmup-fraction and --lr-warmup-iters" --lr-warmup-fraction 0.1 --lr-warmup-iters 1
refuse "--lr-warmup-fraction must be in [0, 1]" --lr-warmup-fraction 1.5
refuse "--moe-router-topk-scaling-factor must be" --num-experts 4 --moe-router-topk-scaling-factor -1
refuse "--no-position-embedding is deprecated" --no-position-embedding --position-embedding-type none
refuse "--lr-warmup-iters with --train-samples" --train-samples 8 --lr-warmup-iters 1

# --- sample-based lengths and the warmup fraction -----------------------------------------------
# The global batch is 4 samples: 24 samples are 6 iterations, 8 samples of warmup 2.
run iters --train-iters 6 --lr-warmup-iters 2
run samples --train-samples 24 --lr-warmup-samples 8
same "--train-samples 24 --lr-warmup-samples 8 is --train-iters 6 --lr-warmup-iters 2" iters samples
[ "$(wc -l <"$tmp/samples.txt")" -eq 6 ] && ok "--train-samples 24 / 4 per batch: 6 iterations" ||
  bad "--train-samples 24 trained $(wc -l <"$tmp/samples.txt") iterations, wanted 6"
run fraction --train-iters 6 --lr-warmup-fraction 0.3333333333333333
same "--lr-warmup-fraction 1/3 of 6 iterations is --lr-warmup-iters 2" iters fraction
# A warmup of 4.5 samples (0.25 x 18): Megatron's schedule in samples, checked from its formula
# (cosine; warmup to 4.5, decay to 18 samples; the lr logged after update n is lr(n x 4)).
run half --train-samples 24 --lr-warmup-fraction 0.25 --lr-decay-samples 18
python3 - "$tmp/half.txt" <<'EOF' && ok "--lr-warmup-fraction 0.25 of 18 samples: Megatron's schedule" || bad "sample-granular schedule differs from Megatron's formula"
import math, sys
rows = [line.split() for line in open(sys.argv[1])]
assert len(rows) == 6, rows
for it, lr, _, _ in rows:
    n, w, d, mx, mn = int(it) * 4.0, 0.25 * 18, 18.0, 1e-2, 1e-3
    if n <= w:
        want = mx * n / w
    elif n > d:
        want = mn
    else:
        want = mn + 0.5 * (math.cos(math.pi * (n - w) / (d - w)) + 1.0) * (mx - mn)
    assert abs(float(lr) - want) <= 1e-15, (it, lr, want)
EOF

# --- pipeline split: Megatron's --account-for-*-in-pipeline-split -----------------------------
plan() { "$weft" plan --world-size 4 "${model[@]}" --train-iters 2 --num-layers "$1" \
           --pipeline-model-parallel-size 4 --json "${@:2}" 2>&1; }
a=$(plan 7 --account-for-embedding-in-pipeline-split)
b=$(plan 7 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 2)
[ -n "$a" ] && [ "$a" == "$b" ] && ok "embedding counted: 7 layers on 4 stages are 1, 2, 2, 2" ||
  bad "--account-for-embedding-in-pipeline-split: $a / $b"
a=$(plan 6 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)
b=$(plan 6 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1)
[ -n "$a" ] && [ "$a" == "$b" ] && ok "embedding and loss counted: 6 layers on 4 stages are 1, 2, 2, 1" ||
  bad "--account-for-loss-in-pipeline-split: $a / $b"
"${mpirun[@]}" -np 2 "$weft" train "${model[@]}" --train-iters 3 --pipeline-model-parallel-size 2 \
  --account-for-loss-in-pipeline-split --log-jsonl "$tmp/pp.jsonl" >"$tmp/pp.log" 2>&1 &&
  grep -q "stage 0: layers 0..1" "$tmp/pp.log" && ok "trains on pp 2 with the loss counted (stage 0: layers 0..1)" ||
  bad "pp 2 --account-for-loss-in-pipeline-split: $(grep -m2 "stage\|error" "$tmp/pp.log")"
refuse "--account-for-embedding-in-pipeline-split: --num-layers 3 plus 1 is not divisible" \
  --pipeline-model-parallel-size 3 --account-for-embedding-in-pipeline-split
refuse "--account-for-loss-in-pipeline-split and --decoder-first/last-pipeline-num-layers" \
  --pipeline-model-parallel-size 2 --account-for-loss-in-pipeline-split \
  --decoder-first-pipeline-num-layers 1
# --- a resume's schedule against the checkpoint's (Megatron's _check_and_set) ------------------
# The straight run: 4 iterations, cosine decay over 4; a checkpoint at 2.
run straight --train-iters 4 --lr-warmup-iters 1 --save "$tmp/ck" --save-interval 2
# A longer run (the decay defaulting to it) trains on with its own schedule and warns, naming
# what differs (Megatron refuses it); so does another --lr.
run extended --train-iters 6 --lr-warmup-iters 1 --load "$tmp/ck" --ckpt-step 2
grep -qF "warning: --load $tmp/ck: this run's learning-rate schedule differs from the checkpoint's: a decay of 24 samples (checkpoint: 16" "$tmp/extended.err" &&
  ok "a longer --train-iters on resume warns, naming the decay" || bad "no schedule warning: $(cat "$tmp/extended.err")"
run higher --train-iters 4 --lr-warmup-iters 1 --load "$tmp/ck" --ckpt-step 2 --lr 2e-2
grep -qF -- "--lr 0.02 (checkpoint: 0.01)" "$tmp/higher.err" && ok "another --lr on resume warns, naming it" ||
  bad "no --lr warning: $(cat "$tmp/higher.err")"
refuse "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler" --train-iters 4 \
  --load "$tmp/ck" --ckpt-step 2 --override-opt_param-scheduler --use-checkpoint-opt_param-scheduler
# --use-checkpoint-opt_param-scheduler continues the checkpoint's schedule: iterations 3-4 are the
# straight run's bit for bit, then the minimum rate.
run continued --train-iters 6 --lr-warmup-iters 1 --load "$tmp/ck" --ckpt-step 2 --use-checkpoint-opt_param-scheduler
head -2 "$tmp/continued.txt" >"$tmp/continued34.txt"
sed -n 3,4p "$tmp/straight.txt" >"$tmp/straight34.txt"
same "--use-checkpoint-opt_param-scheduler: iterations 3-4 as the straight run" straight34 continued34
[ "$(sed -n 3p "$tmp/continued.txt" | cut -d' ' -f2)" == "0.001" ] &&
  ok "--use-checkpoint-opt_param-scheduler: iteration 5 at --min-lr (the checkpoint's decay ended at 4)" ||
  bad "--use-checkpoint-opt_param-scheduler: iteration 5's lr $(sed -n 3p "$tmp/continued.txt")"
# --override-opt_param-scheduler trains with the flags' schedule: a decay over 6 iterations.
run overridden --train-iters 6 --lr-warmup-iters 1 --load "$tmp/ck" --ckpt-step 2 --override-opt_param-scheduler
same "the warned resume trains with the flags' schedule, as --override-opt_param-scheduler" extended overridden
grep -q "learning-rate schedule differs" "$tmp/overridden.err" &&
  bad "--override-opt_param-scheduler still warns" || ok "--override-opt_param-scheduler: no warning"
python3 - "$tmp/overridden.txt" <<'EOF2' && ok "--override-opt_param-scheduler: the flags' decay over 6 iterations" || bad "--override-opt_param-scheduler: $(cat "$tmp/overridden.txt")"
import math, sys
rows = [line.split() for line in open(sys.argv[1])]
assert [int(r[0]) for r in rows] == [3, 4, 5, 6], rows
for it, lr, _, _ in rows:
    t = (int(it) - 1) / 5
    want = 1e-3 + 0.5 * (math.cos(math.pi * t) + 1) * 9e-3
    assert abs(float(lr) - want) <= 1e-15, (it, lr, want)
EOF2
# A resume at another --global-batch-size continues the schedule's samples (Megatron's num_steps):
# 32 samples at 4 per batch, saved at iteration 2 (8 samples); resumed at 8 per batch, the
# update of iteration 3 ends at 16 samples.
run batch4 --train-samples 32 --lr-warmup-samples 4 --save "$tmp/ckb" --save-interval 2 \
  --exit-interval 2
run batch8 --train-samples 32 --lr-warmup-samples 4 --load "$tmp/ckb" --global-batch-size 8
python3 - "$tmp/batch8.txt" <<'EOF2' && ok "a resume at another batch continues the samples of the schedule" || bad "resume at batch 8: $(cat "$tmp/batch8.txt")"
import math, sys
rows = [line.split() for line in open(sys.argv[1])]
assert [int(r[0]) for r in rows] == [3, 4], rows
for (it, lr, _, _), n in zip(rows, (16, 24)):
    want = 1e-3 + 0.5 * (math.cos(math.pi * (n - 4) / (32 - 4)) + 1) * 9e-3
    assert abs(float(lr) - want) <= 1e-15, (it, lr, want)
EOF2
finish
