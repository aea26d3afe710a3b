#!/usr/bin/env bash
# The NaN policy of `weft train`, with NaNs planted through WEFT_FAULT (core/fault.h):
# train.nan_grad:<rank>:<it>:error puts a NaN into that rank's gradient of the last parameter it
# holds, after every reduction; train.nan_loss makes its loss NaN. Two ranks, pp 2.
#   - --no-check-for-nan-in-loss-and-grad: the step is skipped and counted, training goes on and
#     saves;
#   - default (Megatron's --check-for-nan-in-loss-and-grad): exit 1, one stderr line naming the
#     iteration and the
#     first parameter (model order, agreed over ranks), or "the loss"; the failing iteration is
#     not saved; no MPI_Abort;
#   - --max-skipped-iterations 3 with a NaN every iteration: exit 1 after iteration 3 with a line
#     saying so, and nothing in --save.
# Usage: nan_policy.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
tmp=$(mktemp -d /tmp/weft-nan-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
base=(train --log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
      --group-query-attention --num-query-groups 2 --seq-length 16 --vocab-size 64 --micro-batch-size 2
      --global-batch-size 4 --eval-interval 0 --pipeline-model-parallel-size 2)
fails=0 cases=0
fail() { echo "FAIL ($1): $2"; head -5 "$tmp/err"; fails=$((fails + 1)); }
# run FAULT FLAGS... : sets rc; stdout in $tmp/out, stderr in $tmp/err
run() {
  local fault=$1
  shift
  cases=$((cases + 1))
  rm -rf "$tmp/ck"
  WEFT_FAULT=$fault timeout 120 "${mpirun[@]}" -np 2 -x WEFT_FAULT "$weft" "${base[@]}" \
    --save "$tmp/ck" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
}
# one_line CASE CODE NEEDLE : exit CODE, exactly one "weft:" line on stderr, holding NEEDLE, and
# no MPI_ABORT banner (mpirun's own "non-zero exit code" notice may follow).
one_line() {
  local lines
  lines=$(grep -c '^weft: ' "$tmp/err")
  if [ "$rc" -ne "$2" ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$3" "$tmp/err" ||
     grep -q MPI_ABORT "$tmp/err"; then
    fail "$1" "exit $rc (want $2), $lines weft line(s), wanted '$3'"
    return 1
  fi
  echo "ok   ($1): exit $rc: $(grep '^weft: ' "$tmp/err")"
}

# --no-check-for-nan-in-loss-and-grad: skipped and counted (iteration 2 of 4), the run ends
# normally and saves iteration 4.
run train.nan_grad:1:2:error --train-iters 4 --no-check-for-nan-in-loss-and-grad
if [ "$rc" -ne 0 ] || ! grep -q "number of skipped iterations:   1" "$tmp/out" ||
   [ "$(cat "$tmp/ck/latest_checkpointed_iteration.txt" 2>/dev/null)" != 4 ]; then
  fail "skip" "exit $rc; the skip was not counted or iteration 4 not saved"
else
  echo "ok   (skip): exit 0, $(grep -c 'skipped iterations:   1' "$tmp/out") iteration lines with 1 skipped, iteration 4 saved"
fi

# Both ranks plant (rank 0: its last layer-0 parameter, rank 1: the final norm); the lowest global
# index wins on every rank, so rank 0 alone prints and rank 1 has nothing different to add.
run 'train.nan_grad:*:2:error' --train-iters 4 --save-interval 1 --check-for-nan-in-loss-and-grad
one_line "nan grad, both ranks" 1 \
  "iteration 2: the gradient of decoder.layers.0.mlp.linear_fc2.weight is not finite" &&
  { [ "$(cat "$tmp/ck/latest_checkpointed_iteration.txt")" = 1 ] && [ ! -e "$tmp/ck/iter_0000002" ] ||
    fail "nan grad, both ranks" "iteration 2 was saved (or iteration 1 was not)"; }

# Only rank 1 plants: rank 0 learns the name through the agreement.
run train.nan_grad:1:3:error --train-iters 4 --check-for-nan-in-loss-and-grad
one_line "nan grad, rank 1" 1 "iteration 3: the gradient of decoder.final_layernorm.weight is not finite"

# The loss alone, by default (no flag): the message names the loss.
run train.nan_loss:0:2:error --train-iters 4
one_line "nan loss" 1 "iteration 2: the loss is not finite (lm loss nan"

# K consecutive skips: stop after iteration 3, nothing saved.
run 'train.nan_grad:0:*:error' --train-iters 8 --max-skipped-iterations 3 \
  --no-check-for-nan-in-loss-and-grad
one_line "max skipped" 1 "--max-skipped-iterations 3: iterations 1..3 were all skipped" &&
  { [ -z "$(ls -A "$tmp/ck" 2>/dev/null)" ] || fail "max skipped" "something was saved: $(ls "$tmp/ck")"; }

# Skips that are not consecutive do not add up (NaN in iteration 2 only, K 2).
run train.nan_grad:0:2:error --train-iters 4 --max-skipped-iterations 2 \
  --no-check-for-nan-in-loss-and-grad
[ "$rc" -eq 0 ] && echo "ok   (one skip under K 2): exit 0" || fail "one skip under K 2" "exit $rc"

[ "$fails" -eq 0 ] && echo "$cases passed, 0 failed" || { echo "$fails of $cases failed"; exit 1; }
