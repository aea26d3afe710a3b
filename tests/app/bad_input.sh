#!/usr/bin/env bash
# Bad MoE/MTP/hybrid and CUDA-graph input to `weft train` ends with exit code 2 and one line naming the flag, before
# any collective. Usage: bad_input.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
base=(train --log-interval 1 --num-layers 4 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
      --group-query-attention --num-query-groups 2 --seq-length 16 --vocab-size 64 --micro-batch-size 2
      --global-batch-size 8 --train-iters 1 --num-experts 4)
fails=0
# expect NP NEEDLE FLAGS...
expect() {
  local np=$1 needle=$2
  shift 2
  local err rc
  err=$("${mpirun[@]}" -np "$np" "$weft" "${base[@]}" "$@" 2>&1 >/dev/null)
  rc=$?
  local lines
  lines=$(printf '%s\n' "$err" | grep -c '^weft: error')
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -qF -- "$needle"; then
    echo "FAIL ($*): exit $rc, $lines error line(s), wanted '$needle'; stderr:"
    printf '%s\n' "$err" | head -5
    fails=$((fails + 1))
  else
    echo "ok   ($*): $(printf '%s\n' "$err" | grep '^weft: error')"
  fi
}
expect 2 "--num-experts 3 is not divisible by --expert-model-parallel-size 2" \
  --num-experts 3 --expert-model-parallel-size 2 --global-batch-size 4
expect 2 "etp*ep*pp = 1*4*1 = 4" --expert-model-parallel-size 4
expect 1 "--moe-router-topk 5 must be between 1 and --num-experts 4" --moe-router-topk 5
expect 1 "--moe-layer-freq [0,1,1] has 3 entries, but --num-layers is 4" --moe-layer-freq "[0,1,1]"
expect 1 "--moe-layer-freq '[0,2,1,1]': entries must be 0 (dense) or 1 (MoE)" --moe-layer-freq "[0,2,1,1]"
expect 1 "--mtp-num-layers 16 must be smaller than --seq-length 16" --mtp-num-layers 16
expect 2 "--expert-tensor-parallel-size 2 is not supported" --expert-tensor-parallel-size 2 \
  --tensor-model-parallel-size 1 --global-batch-size 4
expect 1 "--moe-router-score-function must be softmax or sigmoid" --moe-router-score-function relu
expect 1 "--moe-token-dispatcher-type must be allgather or alltoall" --moe-token-dispatcher-type flex
# Megatron's default dispatcher name is accepted: the same tokens reach the same experts, so the
# losses equal alltoall's.
losses() { "${mpirun[@]}" -np 2 "$weft" "${base[@]}" --expert-model-parallel-size 2 --global-batch-size 4 \
  --train-iters 2 "$@" 2>&1 | grep -oE "lm loss: [0-9.E+-]+" | paste -sd' '; }
ag=$(losses --moe-token-dispatcher-type allgather)
a2a=$(losses --moe-token-dispatcher-type alltoall)
if [ -n "$ag" ] && [ "$ag" = "$a2a" ]; then echo "ok   allgather runs as alltoall: $ag"
else echo "FAIL allgather '$ag' vs alltoall '$a2a'"; fails=$((fails + 1)); fi
expect 2 "--expert-model-parallel-size 2 needs a mixture-of-experts model" --num-experts 0 \
  --expert-model-parallel-size 2 --global-batch-size 4
mamba=(--mamba-state-dim 8 --mamba-head-dim 8 --mamba-num-groups 2)
expect 1 "unknown symbol 'X' in the decoder pattern" --hybrid-layer-pattern "M*X" "${mamba[@]}"
expect 2 "has 3 pipeline stage(s) between '|', but --pipeline-model-parallel-size is 2" \
  --hybrid-layer-pattern "M*|M|*" --pipeline-model-parallel-size 2 "${mamba[@]}"
expect 1 "the MTP patterns differ ('*E' vs '*')" --hybrid-layer-pattern "M*/*E/*" "${mamba[@]}"
expect 1 "has MoE layers (E) but --num-experts is 0" --num-experts 0 --hybrid-layer-pattern "M*E-" \
  "${mamba[@]}"
# (base gives --num-layers 4: the patterns above have four layers)
expect 1 "--moe-layer-freq and --hybrid-layer-pattern both place MoE layers" \
  --moe-layer-freq 2 --hybrid-layer-pattern "M*E-" "${mamba[@]}"
expect 1 "2 * --hidden-size 32 is not a multiple of --mamba-head-dim 12" \
  --hybrid-layer-pattern "M*M*" --mamba-head-dim 12
expect 1 "--hidden-size 32 must be a positive multiple of --num-attention-heads 5" \
  --hybrid-layer-pattern "M*M*" "${mamba[@]}" --num-attention-heads 5 --group-query-attention --num-query-groups 5
# CUDA graphs (the CPU build: the device check comes first; TrainConfig.CudaGraphRefusals has
# the layout and MoE refusals).
expect 1 "--cuda-graph-impl local needs --device cuda" --num-experts 0 --cuda-graph-impl local
expect 1 "--cuda-graph-impl must be none or local (got 'full')" --num-experts 0 \
  --cuda-graph-impl full
expect 1 "--enable-cuda-graph (the older name of --cuda-graph-impl local) and --cuda-graph-impl" \
  --num-experts 0 --enable-cuda-graph --cuda-graph-impl none
expect 2 "--hybrid-layer-pattern has 3 layers, not divisible by --pipeline-model-parallel-size 2" \
  --num-layers 3 --hybrid-layer-pattern "M*E" --pipeline-model-parallel-size 2 "${mamba[@]}"
# Megatron-valid flags that change nothing here: the run goes on, with one warning line each.
# warns NEEDLE FLAGS...: one rank, one iteration; exit 0 and NEEDLE in a warning line.
warns() {
  local needle=$1
  shift
  local err rc
  err=$("$weft" "${base[@]}" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -ne 0 ] || ! printf '%s\n' "$err" | grep '^weft train: warning' | grep -qF -- "$needle"; then
    echo "FAIL ($*): exit $rc, wanted a warning '$needle'; stderr:"
    printf '%s\n' "$err" | head -5
    fails=$((fails + 1))
  else
    echo "ok   ($*): $(printf '%s\n' "$err" | grep -F -- "$needle")"
  fi
}
warns "--moe-grouped-gemm has no effect here" --moe-grouped-gemm
warns "--moe-shared-expert-intermediate-size has no effect" --num-experts 0 \
  --moe-shared-expert-intermediate-size 16
warns "has no 'E' layer: the model has no experts" --num-layers 2 --hybrid-layer-pattern "M*" "${mamba[@]}"
warns "which has no MTP pattern" --num-experts 0 --num-layers 2 --hybrid-layer-pattern "M*" \
  --mtp-num-layers 1 "${mamba[@]}"
# (base gives --num-layers 4; Megatron too takes the pattern's count with a warning)
warns "--num-layers 4 is ignored: --hybrid-layer-pattern 'M*M*M*' has 6 layers" \
  --hybrid-layer-pattern "M*M*M*" "${mamba[@]}"
[ "$fails" -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
