#!/usr/bin/env bash
# Ranks started with different flags (an mpirun MPMD line: rank 0 with one set, rank 1 with
# another) end with exit code 2 and one error line naming what differs, before any training
# collective can hang or train two different models. Each run is bounded by `timeout`, so a hang
# fails the test instead of stalling it. Usage: mixed_flags.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
base=(train --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4 --group-query-attention --num-query-groups 2
      --seq-length 16 --vocab-size 64 --global-batch-size 8 --train-iters 1 --eval-interval 0)
fails=0
# expect NEEDLE "RANK0 FLAGS" "RANK1 FLAGS"
expect() {
  local needle=$1 a=$2 b=$3 err rc lines
  # shellcheck disable=SC2086
  err=$(timeout 60 "${mpirun[@]}" -np 1 "$weft" "${base[@]}" $a : -np 1 "$weft" "${base[@]}" $b \
        2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c '^weft: error')
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$err" | grep -qF -- "$needle"; then
    echo "FAIL (rank 0: $a | rank 1: $b): exit $rc, $lines error line(s), wanted '$needle'; stderr:"
    printf '%s\n' "$err" | head -5
    fails=$((fails + 1))
  else
    echo "ok   (rank 0: $a | rank 1: $b): $(printf '%s\n' "$err" | grep '^weft: error')"
  fi
}
expect "ranks were started with different parallel layouts" \
  "--num-layers 2 --pipeline-model-parallel-size 2" "--num-layers 2"
expect "rank 1 was started with another value of 'model.num_layers' than rank 0" \
  "--num-layers 4" "--num-layers 2"
expect "rank 1 was started with another value of 'micro_batch_size' than rank 0" \
  "--num-layers 2 --micro-batch-size 2" "--num-layers 2 --micro-batch-size 1"
expect "rank 1 was started with another value of 'lr.lr' than rank 0" \
  "--num-layers 2 --pipeline-model-parallel-size 2 --lr 0.01" \
  "--num-layers 2 --pipeline-model-parallel-size 2 --lr 0.02"
save=$(mktemp -d /tmp/weft-mixed-XXXXXX)
trap 'rm -rf "$save"' EXIT
expect "rank 1 was started with another value of 'async_save' than rank 0" \
  "--num-layers 2 --save $save --async-save" "--num-layers 2 --save $save"
expect "rank 1 was started with another value of 'check_for_nan_in_loss_and_grad' than rank 0" \
  "--num-layers 2 --no-check-for-nan-in-loss-and-grad" "--num-layers 2"
[ "$fails" -eq 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
