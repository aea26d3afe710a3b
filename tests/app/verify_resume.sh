#!/usr/bin/env bash
# `weft verify-resume` (app/cmd_verify_resume.cpp) on 4 ranks with a tiny MoE model:
#   PASS on the same layout (pp 2 x dp 2, bitwise), PASS across layouts (restart on pp 1 x
#   dp 4 x ep 2, within 1e-6), and FAIL with exit 1 when the restore is broken
#   (WEFT_FAULT=checkpoint.skip_exp_avg_sq: the loader leaves the second moments fresh, so the
#   resumed run's update differs); bad --at/--to, and the train flags verify-resume sets itself
#   (--save, --log-jsonl, --save-interval), exit 2. The evaluations after the restart are
#   compared too (FAIL with WEFT_FAULT=train.reset_consumed_valid). --async-save resumes bitwise; with --bf16
#   across layouts the default tolerance passes the restart and fails the broken restore. With --workdir, the directory stays
#   on FAIL; the default temporary directory is removed on PASS.
# Usage: verify_resume.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
dir=$(mktemp -d /tmp/weft-verify-resume-test-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
model=(--num-layers 4 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 16 --vocab-size 64 --micro-batch-size 1
       --global-batch-size 8 --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01
       --mtp-num-layers 1 --eval-interval 0 --lr 0.001 --lr-warmup-iters 1)
out=""
run() {  # run WANT_RC DESCRIPTION ARGS...
  local want=$1 what=$2 rc
  shift 2
  out=$("${mpirun[@]}" -np 4 "$weft" verify-resume "${model[@]}" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL ($what): exit $rc, wanted $want; output:"
    printf '%s\n' "$out" | tail -8
    fails=$((fails + 1))
    return 1
  fi
  echo "ok   ($what): exit $rc: $(printf '%s\n' "$out" | grep '^verify-resume: \(PASS\|FAIL\)')"
}
has() {  # has NEEDLE DESCRIPTION
  if printf '%s\n' "$out" | grep -qF -- "$1"; then echo "ok   $2"; else
    echo "FAIL: $2: no '$1' in:"; printf '%s\n' "$out" | tail -5; fails=$((fails + 1)); fi
}

before=$(ls -d /tmp/weft-verify-resume-?????? 2>/dev/null | wc -l)
run 0 "same layout" --pipeline-model-parallel-size 2 --at 2 --to 4 &&
  has "verify-resume: PASS iterations 3..4" "PASS line, same layout" &&
  has "bitwise" "bitwise on the same layout"
after=$(ls -d /tmp/weft-verify-resume-?????? 2>/dev/null | wc -l)
[ "$after" = "$before" ] && echo "ok   temporary directory removed" ||
  { echo "FAIL: a temporary directory was left behind"; fails=$((fails + 1)); }

run 0 "across layouts" --pipeline-model-parallel-size 2 --at 2 --to 4 \
  --load-layout "--pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --data-parallel-size 4" &&
  has "restart on --pipeline-model-parallel-size 1" "PASS line names the new layout"

# Without --global-batch-size, Megatron's default (micro-batch x dp) is taken for both layouts
# at once: pp 2 has dp 2, pp 1 dp 4, so both runs take micro-batch x lcm(2, 4) = 4 samples (dp
# 2's own default, 2, would not divide over dp 4).
given=("${model[@]}")
model=()
for ((i = 0; i < ${#given[@]}; i++)); do
  [ "${given[$i]}" = --global-batch-size ] && { i=$((i + 1)); continue; }
  model+=("${given[$i]}")
done
run 0 "across layouts, default global batch" --pipeline-model-parallel-size 2 --at 2 --to 3 \
  --load-layout "--pipeline-model-parallel-size 1 --expert-model-parallel-size 2" &&
  has "verify-resume: PASS iterations 3..3" "PASS with the default global batch"
model=("${given[@]}")

WEFT_FAULT=checkpoint.skip_exp_avg_sq:1:2:error run 1 "broken restore" \
  --pipeline-model-parallel-size 2 --at 2 --to 4 --workdir "$dir/broken" &&
  has "verify-resume: FAIL: iteration 4" "FAIL names the first differing iteration"
[ -d "$dir/broken/straight" ] && echo "ok   --workdir kept on FAIL" ||
  { echo "FAIL: --workdir was not kept"; fails=$((fails + 1)); }

# Evaluations: every validation after the restart (--eval-interval 1: after iterations 3 and 4,
# then the end of training's validation and test) equals the straight run's; a restore that
# restarts the valid stream at its first sample on one rank (WEFT_FAULT=
# train.reset_consumed_valid) trains the same numbers and fails on the first evaluation.
ev=(--pipeline-model-parallel-size 2 --at 2 --to 4 --eval-interval 1 --eval-iters 2)
run 0 "evaluations" "${ev[@]}" && has "grad norms, evaluations) and the" "PASS names evaluations"
WEFT_FAULT=train.reset_consumed_valid:0:2:error run 1 "valid stream not restored" "${ev[@]}" \
  --workdir "$dir/valid" &&
  has "verify-resume: FAIL: validation at iteration 3 lm loss" "FAIL names the evaluation"

# --async-save: the saves at --at and --to are written in the background, and the restart is
# still bitwise.
run 0 "async save" --pipeline-model-parallel-size 2 --at 2 --to 4 --async-save &&
  has "bitwise" "bitwise with --async-save"
# bf16 across layouts: the default tolerance (1e-2) passes the restart and still fails the
# broken restore (a fresh second moment is far from the trained one).
run 0 "bf16 across layouts" --bf16 --pipeline-model-parallel-size 2 --at 2 --to 4 \
  --load-layout "--pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --data-parallel-size 4"
WEFT_FAULT=checkpoint.skip_exp_avg_sq:1:2:error run 1 "bf16 broken restore across layouts" \
  --bf16 --pipeline-model-parallel-size 2 --at 2 --to 4 \
  --load-layout "--pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --data-parallel-size 4" &&
  has "verify-resume: FAIL" "bf16 FAIL line"

run 2 "bad --at" --at 4 --to 4 && has "--at K and --to N" "message names --at/--to"
for flag in "--save $dir/mine" "--log-jsonl $dir/mine.jsonl" "--save-interval 1"; do
  # shellcheck disable=SC2086  # the flag and its value are two words
  run 2 "${flag%% *} refused" --at 1 --to 2 $flag &&
    has "verify-resume sets ${flag%% *} itself" "message names ${flag%% *}"
done
run 2 "bad --load-layout" --at 1 --to 2 --load-layout "--pipeline-model-parallel-size 3" &&
  has "pipeline" "message names the layout flag"

[ "$fails" -eq 0 ] && echo "verify_resume: all passed" || { echo "verify_resume: $fails failed"; exit 1; }
