#!/usr/bin/env bash
# `weft plan` (app/cmd_plan.cpp) as a user runs it: the table groups identical ranks (pp 2 on 4
# ranks: one group per stage), --json carries every field, dense / MoE + ep / MTP / hybrid
# models plan, the checkpoint size is the hand count (parameters x (4 fp32 model + 4 master +
# 4 + 4 moments) for fp32), halving the world doubles the FSDP shards, and bad input exits 2
# naming the flag. (Exact byte counts against the real shards: tests/train/test_plan.cpp.)
# Usage: plan_cmd.sh WEFT
set -u
weft=$1
fails=0
failed() { echo "FAIL: $*"; fails=$((fails + 1)); }
model=(--num-layers 4 --hidden-size 64 --ffn-hidden-size 172 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 32 --vocab-size 128 --micro-batch-size 2
       --global-batch-size 16)
json_field() { printf '%s\n' "$1" | python3 -c "import json,sys; j=json.load(sys.stdin); print($2)"; }

out=$("$weft" plan --world-size 4 --pipeline-model-parallel-size 2 "${model[@]}") || failed "dense table"
printf '%s\n' "$out" | grep -q "^ranks 0-1 (stage 0)" && printf '%s\n' "$out" | grep -q "^ranks 2-3 (stage 1)" &&
  echo "ok   table: one group per stage" || failed "table groups: $out"
for w in "estimated peak" "Adam exp_avg_sq" "activations" "checkpoint:" "s per step at MFU 0.4"; do
  printf '%s\n' "$out" | grep -q "$w" && echo "ok   table has '$w'" || failed "table lacks '$w'"
done

j=$("$weft" plan --world-size 4 --pipeline-model-parallel-size 2 "${model[@]}" --json) || failed "json"
[ "$(json_field "$j" "len(j['rank_groups'])")" = 2 ] && echo "ok   json: 2 rank groups" || failed "json groups"
[ "$(json_field "$j" "j['rank_groups'][0]['inflight_microbatches'], j['rank_groups'][1]['inflight_microbatches']")" = "2 1" ] &&
  echo "ok   json: 1F1B in flight 2 on stage 0, 1 on stage 1" || failed "in-flight microbatches"
params=$(json_field "$j" "j['total_params']")
# 128*64 embedding + 4 layers * (64 + (4+2*2)*16*64 + 64*64 + 64 + 2*172*64 + 64*172) + 64
want=$((128 * 64 + 4 * (64 + 8 * 16 * 64 + 64 * 64 + 64 + 2 * 172 * 64 + 64 * 172) + 64))
[ "$params" = "$want" ] && echo "ok   total parameters $params" || failed "total params $params, wanted $want"
[ "$(json_field "$j" "j['checkpoint_bytes']")" = $((want * 16)) ] && echo "ok   checkpoint bytes" ||
  failed "checkpoint bytes $(json_field "$j" "j['checkpoint_bytes']"), wanted $((want * 16))"
j2=$("$weft" plan --world-size 2 --pipeline-model-parallel-size 2 "${model[@]}" --global-batch-size 8 --json)
g4=$(json_field "$j" "j['rank_groups'][1]['grads']")
g2=$(json_field "$j2" "j['rank_groups'][1]['grads']")
[ "$g2" -ge $((2 * g4 - 64)) ] && [ "$g2" -le $((2 * g4)) ] && echo "ok   dp 1 holds about twice dp 2's shards ($g2 vs $g4)" ||
  failed "shards dp 1 $g2 vs dp 2 $g4"

moe=(--num-experts 4 --moe-router-topk 2 --moe-layer-freq "[0,1,1,0]" --mtp-num-layers 1 --bf16)
# The train command's warnings, here too: --num-query-groups alone builds one key/value head
# per attention head, as Megatron.
err=$("$weft" plan --world-size 1 --num-layers 2 --hidden-size 64 --num-attention-heads 4 \
      --num-query-groups 2 --seq-length 32 --vocab-size 128 2>&1 >/dev/null)
printf '%s' "$err" | grep -q "^weft plan: warning: --num-query-groups 2 has no effect without --group-query-attention" &&
  echo "ok   plan warns as train does" || failed "plan's warning: $err"
"$weft" plan --world-size 8 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2 \
  "${model[@]}" "${moe[@]}" > /dev/null && echo "ok   MoE + ep + MTP" || failed "MoE plan"
"$weft" plan --world-size 4 --pipeline-model-parallel-size 2 --hybrid-layer-pattern "M*|-E/*E" \
  --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --mamba-state-dim 16 \
  --mamba-head-dim 16 --mamba-num-groups 2 --num-experts 4 --seq-length 32 --vocab-size 128 \
  --micro-batch-size 2 --global-batch-size 8 --device cuda > /dev/null && echo "ok   hybrid" ||
  failed "hybrid plan"

# Megatron's defaults where the flags are not given: --ffn-hidden-size int(4h * 2/3 / 64) * 64
# (5440 at hidden 2048: 8h/3 = 5461.3 rounded down to 64), --num-query-groups one per head, and
# --global-batch-size micro-batch x dp (pp 2 on 8 ranks: dp 4, so 3 x 4 = 12 samples of 32).
j=$("$weft" plan --world-size 8 --pipeline-model-parallel-size 2 --num-layers 2 --hidden-size 2048 \
  --num-attention-heads 16 --seq-length 32 --vocab-size 128 --micro-batch-size 3 --json) || failed "defaults"
# 128*2048 embedding + 2 layers * (2048 + 3*16*128*2048 + 2048*2048 + 2048 + 3*5440*2048) + 2048
want=$((128 * 2048 + 2 * (2048 + 3 * 16 * 128 * 2048 + 2048 * 2048 + 2048 + 3 * 5440 * 2048) + 2048))
[ "$(json_field "$j" "j['total_params']")" = "$want" ] && echo "ok   default ffn 5440 and 16 KV heads" ||
  failed "default ffn/query groups: $(json_field "$j" "j['total_params']") parameters, wanted $want"
[ "$(json_field "$j" "j['tokens_per_step'], j['microbatches']")" = "384 1" ] &&
  echo "ok   default global batch = micro-batch x dp" ||
  failed "default global batch: $(json_field "$j" "j['tokens_per_step'], j['microbatches']"), wanted 384 1"

bad() {  # bad NEEDLE ARGS...: exit 2 and one line naming NEEDLE
  local needle=$1 err rc
  shift
  err=$("$weft" plan "$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 2 ] && printf '%s\n' "$err" | grep -q -- "$needle" && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] &&
    echo "ok   bad input names $needle" || failed "bad input '$*': rc $rc, '$err'"
}
bad "--mfu" --world-size 1 "${model[@]}" --mfu 0
bad "--peak-tflops" --world-size 1 "${model[@]}" --peak-tflops -2
bad "--pipeline-model-parallel-size" --world-size 3 --pipeline-model-parallel-size 2 "${model[@]}"
bad "--global-batch-size" --world-size 4 "${model[@]}" --global-batch-size 6
bad "--ffn-hidden-size" --world-size 1 --hidden-size 32 --num-attention-heads 4 --hidden-size 16
bad "--ffn-hidden-size" --world-size 1 --hidden-size 16 --num-attention-heads 4 --num-experts 4
# ... but a model whose layers are all routed experts of their own size does not use it.
"$weft" plan --world-size 1 --hidden-size 16 --num-attention-heads 4 --num-experts 4 \
  --moe-ffn-hidden-size 48 > /dev/null && echo "ok   MoE-only model needs no --ffn-hidden-size" ||
  failed "MoE-only model refused without --ffn-hidden-size"

[ "$fails" -eq 0 ] && echo "plan_cmd: all passed" || { echo "plan_cmd: $fails failed"; exit 1; }
