#!/usr/bin/env bash
# `weft plan`'s estimated peak against the measured one on the GPU machine: for each model, a
# few `weft train --device cuda` iterations (the log's "peak memory (MB)" is torch's max
# allocated) and `weft plan --world-size 1` with the same flags; prints measured, estimated and
# their ratio. Usage: bash bench/gpu/plan_check.sh [build]   (logs under $LOGS or /tmp/plan_check)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/detect_torch.sh
weft_detect_torch
weft_cmake_args
OUT=${LOGS:-/tmp/plan_check}
mkdir -p "$OUT"
B=build-cuda
if [ "${1:-}" = build ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release "${WEFT_CMAKE_ARGS[@]}" \
    > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build $B -j 16 --target weft > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
fi
W=./$B/app/weft
check() {  # name, flags...
  local name=$1; shift
  $W train --log-interval 1 --device cuda --bf16 "$@" --train-iters 3 --lr 3e-4 > "$OUT/plan_$name.log" 2>&1
  local measured rc=$?
  [ $rc -eq 0 ] || { echo "$name: weft train rc=$rc"; tail -5 "$OUT/plan_$name.log"; }
  measured=$(grep -o "peak memory (MB): [0-9.]*" "$OUT/plan_$name.log" | tail -1 | awk '{print $4}')
  $W plan --world-size 1 --device cuda --bf16 "$@" > "$OUT/plan_$name.txt" 2>&1
  local est
  est=$($W plan --world-size 1 --device cuda --bf16 "$@" --json | python3 -c \
    "import json,sys; print(json.load(sys.stdin)['max_peak']/2**20)")
  python3 -c "m=float('${measured:-nan}'); e=float('$est'); print(f'$name: measured {m:.1f} MB, plan {e:.1f} MB, plan/measured {e/m:.3f}')"
}
D8=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
    --ffn-hidden-size 5632 --vocab-size 32000 --seq-length 4096)
check 0.8b "${D8[@]}" --micro-batch-size 2 --global-batch-size 2
check 125m --num-layers 12 --hidden-size 768 --num-attention-heads 12 --group-query-attention --num-query-groups 12 \
  --ffn-hidden-size 2048 --vocab-size 32000 --seq-length 1024 --micro-batch-size 8 --global-batch-size 8
check 0.8b_mb4 "${D8[@]}" --micro-batch-size 1 --global-batch-size 4
check moe --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --group-query-attention --num-query-groups 8 \
  --ffn-hidden-size 2816 --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 \
  --vocab-size 32000 --seq-length 4096 --micro-batch-size 1 --global-batch-size 1
check mtp "${D8[@]}" --mtp-num-layers 1 --micro-batch-size 1 --global-batch-size 1
check hybrid --hybrid-layer-pattern "M-M-M*-M-" --hidden-size 2048 --num-attention-heads 16 \
  --group-query-attention --num-query-groups 8 --ffn-hidden-size 5632 --vocab-size 32000 --seq-length 4096 \
  --micro-batch-size 1 --global-batch-size 1
