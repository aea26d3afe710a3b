#!/usr/bin/env bash
# Loading checks the model settings that the tensors do not show, and --use-checkpoint-args
# takes the model flags from the checkpoint (docs/hf-interop.md, "Loading checks ...").
# Three tiny models are trained 2 iterations and saved on 2 ranks: D, a dense one far from every
# default (3 layers, hidden 64, 8 heads in 2 groups, seq 32, vocab 96, untied, RoPE base 5e5
# with Llama 3 scaling 16, norm epsilon 1e-6, q/k/v biases), M, a dense layer then two MoE ones with an MTP
# depth, and H, a hybrid Mamba/attention/MoE one. Each
# is resumed for iteration 3 once with every model flag and once with --load and
# --use-checkpoint-args alone: both must log the same loss and grad norm, bit for bit. Then the
# refusals: D resumed with the default flags, with every flag but --add-qkv-bias, with
# --use-checkpoint-args and another
# --rotary-base or scaling factor (allowed with --override-checkpoint-rope), --use-checkpoint-args
# without --load, with an empty --load or with a missing --ckpt-step.
# Usage: checkpoint_args.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
dir=$(mktemp -d /tmp/weft-ckpt-args-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
batch=(--micro-batch-size 2 --global-batch-size 4 --eval-interval 0 --mock-data)
dense=(--num-layers 3 --hidden-size 64 --ffn-hidden-size 96 --num-attention-heads 8
       --group-query-attention --num-query-groups 2 --seq-length 32 --vocab-size 96 --untie-embeddings-and-output-weights
       --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 16 --norm-epsilon 1e-6
       --add-qkv-bias)  # last: the refusal below leaves it out
moe=(--num-layers 3 --moe-layer-freq "[0,1,1]" --num-experts 4 --moe-router-topk 2
     --moe-ffn-hidden-size 48 --mtp-num-layers 1 --hidden-size 64 --ffn-hidden-size 96
     --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 32 --vocab-size 96)
hybrid=(--hybrid-layer-pattern "M*-E" --hidden-size 64 --ffn-hidden-size 96
        --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 32 --vocab-size 96
        --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --mamba-head-dim 16
        --mamba-num-groups 2 --mamba-state-dim 16)

# losses FILE: iteration 3's lm_loss and grad_norm from a --log-jsonl file.
losses() {
  grep '"iteration": 3,' "$1" | grep -o '"lm_loss": [^,]*, .*"grad_norm": [^,]*' |
    sed 's/"aux_loss.*"grad_norm"/"grad_norm"/'
}

for m in dense moe hybrid; do
  declare -n flags=$m
  "${mpirun[@]}" -np 2 "$weft" train "${flags[@]}" "${batch[@]}" --train-iters 2 \
    --save "$dir/$m" > "$dir/$m.log" 2>&1 || { tail -5 "$dir/$m.log"; echo "FAIL: training $m"; exit 1; }
  "${mpirun[@]}" -np 2 "$weft" train "${flags[@]}" "${batch[@]}" --train-iters 3 \
    --load "$dir/$m" --log-jsonl "$dir/$m.full.jsonl" > "$dir/$m.full.log" 2>&1 ||
    { tail -5 "$dir/$m.full.log"; echo "FAIL: $m resumed with every flag"; exit 1; }
  "${mpirun[@]}" -np 2 "$weft" train "${batch[@]}" --train-iters 3 --load "$dir/$m" \
    --use-checkpoint-args --log-jsonl "$dir/$m.args.jsonl" > "$dir/$m.args.log" 2>&1 ||
    { tail -5 "$dir/$m.args.log"; echo "FAIL: $m resumed with --use-checkpoint-args"; exit 1; }
  want=$(losses "$dir/$m.full.jsonl")
  got=$(losses "$dir/$m.args.jsonl")
  if [ -n "$want" ] && [ "$want" = "$got" ]; then
    echo "ok   ($m: --use-checkpoint-args resumes as every flag does: $got)"
  else
    echo "FAIL ($m: --use-checkpoint-args gave '$got', every flag '$want')"
    fails=$((fails + 1))
  fi
done

# refused DESCRIPTION NEEDLE ARGS...: `weft train ARGS` must exit 2 with NEEDLE in its output.
refused() {
  local what=$1 needle=$2 out rc
  shift 2
  out=$("$weft" train "${batch[@]}" --train-iters 3 "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -qF -- "$needle"; then
    echo "ok   ($what)"
  else
    echo "FAIL ($what): exit $rc, wanted 2 with '$needle'; output:"
    printf '%s\n' "$out" | tail -3
    fails=$((fails + 1))
  fi
}
refused "default flags into D" "--num-attention-heads 4 (checkpoint: 8)" \
  --hidden-size 64 --ffn-hidden-size 96 --num-layers 3 --seq-length 32 --vocab-size 96 \
  --untie-embeddings-and-output-weights --load "$dir/dense"
refused "D's flags without its q/k/v biases" "--add-qkv-bias false (checkpoint: true)" \
  "${dense[@]::${#dense[@]}-1}" --load "$dir/dense"
refused "D's flags but the RoPE base" "--rotary-base 10000 (checkpoint: 500000); give the checkpoint's values (or --override-checkpoint-rope" \
  --load "$dir/dense" --use-checkpoint-args --rotary-base 10000
refused "D's flags but the scaling factor" "--rope-scaling-factor 8 (checkpoint: 16)" \
  --load "$dir/dense" --use-checkpoint-args --rope-scaling-factor 8
refused "D with position interpolation" "--rotary-seq-len-interpolation-factor 2 (checkpoint: 0)" \
  --load "$dir/dense" --use-checkpoint-args --rotary-seq-len-interpolation-factor 2
refused "H's flags with --moe-layer-freq" "--moe-layer-freq: the checkpoint's model is hybrid" \
  --load "$dir/hybrid" --use-checkpoint-args --moe-layer-freq 2
refused "D with --use-checkpoint-args and other given groups" "--num-query-groups 4 (checkpoint: 2)" \
  --load "$dir/dense" --use-checkpoint-args --group-query-attention --num-query-groups 4
refused "D without --group-query-attention" \
  "--num-query-groups 8 (checkpoint: 2; without --group-query-attention, one key/value head per attention head)" \
  "${dense[@]:0:8}" "${dense[@]:11}" --load "$dir/dense"
# Megatron takes the checkpoint's groups under --use-checkpoint-args (its --num-query-groups
# default 1 included): --group-query-attention alone, or --num-query-groups without it, resumes.
for extra in --group-query-attention "--num-query-groups 4"; do
  rm -f "$dir/gqa.jsonl"
  if "${mpirun[@]}" -np 2 "$weft" train "${batch[@]}" --train-iters 3 --load "$dir/dense" \
       --use-checkpoint-args $extra --log-jsonl "$dir/gqa.jsonl" > "$dir/gqa.log" 2>&1 &&
     [ "$(losses "$dir/gqa.jsonl")" = "$(losses "$dir/dense.full.jsonl")" ]; then
    echo "ok   (--use-checkpoint-args with $extra: the checkpoint's groups)"
  else
    echo "FAIL (--use-checkpoint-args with $extra):"; tail -3 "$dir/gqa.log"
    fails=$((fails + 1))
  fi
done
refused "--use-checkpoint-args without --load" "--use-checkpoint-args needs --load DIR" \
  --use-checkpoint-args
# No checkpoint in --load: refused as any --load without one is.
mkdir -p "$dir/empty"
refused "--use-checkpoint-args, no checkpoint in --load" "holds no checkpoint" \
  --use-checkpoint-args --load "$dir/empty"
refused "--exit-on-missing-checkpoint with --load as --save, nothing saved yet" \
  "holds no checkpoint (no latest_checkpointed_iteration.txt) (--exit-on-missing-checkpoint)" \
  --num-layers 1 --load "$dir/empty" --save "$dir/empty" --exit-on-missing-checkpoint
refused "D resumed with --ckpt-step 7 and --use-checkpoint-args" "iter_0000007" \
  --use-checkpoint-args --load "$dir/dense" --ckpt-step 7
# A context extension changes the RoPE on purpose: allowed with --override-checkpoint-rope.
out=$("${mpirun[@]}" -np 1 "$weft" train "${batch[@]}" --train-iters 3 --load "$dir/dense" \
  --use-checkpoint-args --rotary-base 1000000 --override-checkpoint-rope 2>&1)
if [ $? -eq 0 ] && printf '%s\n' "$out" | grep -qF "other RoPE settings: --rotary-base 1000000 (checkpoint: 500000)"; then
  echo "ok   (--override-checkpoint-rope loads a RoPE change, with a warning)"
else
  echo "FAIL (--override-checkpoint-rope):"; printf '%s\n' "$out" | tail -3
  fails=$((fails + 1))
fi

# --no-load-optim (Megatron's): the weights, iteration and data position load, the optimizer
# starts fresh. Iteration 3 (computed on the loaded weights, before any update) matches the
# straight run bit for bit; iteration 4 follows a fresh optimizer, so it differs from the
# straight run, and a resume with --no-load-rng matches it (weft's training never draws from the
# generator that flag leaves unrestored, so this leg shows only that the flag loads the rest).
nl=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4 --seq-length 16
    --vocab-size 64 --lr 1e-2 --lr-warmup-iters 0 --train-iters 4 --log-interval 1 "${batch[@]}")
at() { printf '%s\n' "$1" | grep -o "iteration *$2/.*lm loss: [0-9.E+-]*" | grep -o "lm loss: .*"; }
straight=$("$weft" train "${nl[@]}" --save "$dir/nl" --save-interval 2 2>&1)
plain=$("$weft" train "${nl[@]}" --load "$dir/nl" --ckpt-step 2 --no-load-rng 2>&1)
fresh=$("$weft" train "${nl[@]}" --load "$dir/nl" --ckpt-step 2 --no-load-optim 2>&1)
s3=$(at "$straight" 3); s4=$(at "$straight" 4)
if [ -n "$s3" ] && [ "$(at "$fresh" 3)" = "$s3" ] && [ -n "$(at "$fresh" 4)" ] &&
   [ "$(at "$fresh" 4)" != "$s4" ] && [ "$(at "$plain" 4)" = "$s4" ] &&
   printf '%s' "$fresh" | grep -q "loaded .* at iteration 2 .*--no-load-optim: a fresh optimizer"; then
  echo "ok   --no-load-optim: iteration 3 $s3 as straight, 4 $(at "$fresh" 4) (straight $s4)"
else
  echo "FAIL --no-load-optim: straight 3 '$s3' 4 '$s4', fresh 3 '$(at "$fresh" 3)' 4 '$(at "$fresh" 4)', plain 4 '$(at "$plain" 4)'"
  printf '%s\n' "$fresh" | tail -3
  fails=$((fails + 1))
fi

[ $fails -eq 0 ] && echo "checkpoint_args: all passed" || echo "checkpoint_args: $fails failed"
exit $((fails > 0))
