#!/usr/bin/env bash
# --step-batch-size-schedule (Megatron's) end to end, on 1 to 4 CPU ranks:
# - a scheduled run equals, bit for bit, the same training done by hand: a run at the first
#   batch, saved where the schedule changes, resumed at the second batch (losses, grad norms,
#   consumed samples of every iteration; dp 2 with 2 and then 4 microbatches per rank);
# - the learning rate decays over the samples the iterations consume under the schedule
#   (--train-iters, linear), and --train-samples gives Megatron's iteration count (its loop
#   until the samples are reached); the log and JSONL name each step's batch;
# - a checkpoint is saved where the batch changes (Megatron's), and weft verify-resume across
#   the change passes, on the same layout (bitwise) and into another one;
# - a resume past an entry that the new layout does not divide trains (the run was scaled up
#   there); a fresh run that reaches it, --global-batch-size beside the schedule, a falling
#   batch and a bad entry are refused with one line naming the flag;
# - weft plan sizes the largest batch.
# Usage: batch_schedule.sh WEFT [MPIRUN...]
source "$(dirname "$0")/lib.sh" "$@"
model=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --seq-length 16 --vocab-size 64 --eval-interval 0 --log-interval 1 --threads 1
       --lr 1e-2 --seed 3)
# run NAME NP FLAGS...: trains; the JSONL's (iteration, loss, grad norm, samples, batch, lr)
# to NAME.txt.
run() {
  local name=$1 np=$2
  shift 2
  if ! timeout 180 "${mpirun[@]}" -np "$np" "$weft" train "${model[@]}" \
       --log-jsonl "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>"$tmp/$name.err"; then
    bad "$name: weft train $* failed: $(grep -m3 error "$tmp/$name.err" "$tmp/$name.log")"
    return
  fi
  python3 - "$tmp/$name.jsonl" >"$tmp/$name.txt" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "lm_loss" in r:
        print(r["iteration"], repr(r["lm_loss"]), repr(r["grad_norm"]), r["consumed_samples"],
              r["global_batch_size"], repr(r["lr"]))
EOF
}
# refused WHAT NP WANT FLAGS...: exit 2 and WANT in the output.
refused() {
  local what=$1 np=$2 want=$3
  shift 3
  local out rc
  out=$(timeout 120 "${mpirun[@]}" -np "$np" "$weft" train "${model[@]}" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$out"; then ok "$what: refused: $want"
  else bad "$what: exit $rc, wanted 2 and '$want': $(grep -m2 -i error <<<"$out")"; fi
}

# Thresholds count tokens: 128 tokens of --seq-length 16 are sample 8.
const=(--lr-decay-style constant --micro-batch-size 1)
run sched 2 "${const[@]}" --step-batch-size-schedule "0:4 128:8" --train-iters 5
run first 2 "${const[@]}" --global-batch-size 4 --train-iters 2 --save "$tmp/hand"
run second 2 "${const[@]}" --global-batch-size 8 --train-iters 5 --load "$tmp/hand" \
  --override-opt_param-scheduler
cut -d' ' -f1-4 "$tmp/sched.txt" >"$tmp/a"
cat "$tmp/first.txt" "$tmp/second.txt" | cut -d' ' -f1-4 >"$tmp/b"
check "schedule against the batches changed by hand (iterations, bitwise)" \
  "$(cmp -s "$tmp/a" "$tmp/b" && wc -l <"$tmp/a")" 5
check "batches and consumed samples" "$(cut -d' ' -f4,5 "$tmp/sched.txt" | tr '\n' ' ')" \
  "4 4 8 4 16 8 24 8 32 8 "
grep -q "global batch size:     8" "$tmp/sched.log" && ok "the log line names the batch" ||
  bad "no 'global batch size: 8' in the log"

# Warmup over --lr-warmup-iters 2 and linear decay over --train-iters 5, in the samples of those
# steps (4+4 = 8 and 4+4+8+8+8 = 32); the JSONL's rate is the one after each update:
# lr n / 8 in the warmup, then lr (1 - (n - 8) / (32 - 8)).
run decay 1 --micro-batch-size 2 --step-batch-size-schedule "0:4 128:8" --train-iters 5 \
  --lr-warmup-iters 2
want=$(python3 -c "
print(' '.join(repr(1e-2 * n / 8 if n <= 8 else 1e-2 * (1 - (n - 8) / 24.0)) for n in (4, 8, 16, 24, 32)))")
got=$(python3 -c "
import sys
print(' '.join(repr(float(l.split()[5])) for l in open(sys.argv[1])))" "$tmp/decay.txt")
python3 -c "
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
sys.exit(0 if len(a) == len(b) == 5 and all(abs(float(x) - float(y)) <= 1e-15 for x, y in zip(a, b)) else 1)" \
  "$got" "$want" && ok "warmup and decay over the scheduled samples: $got" ||
  bad "learning rate: got '$got', wanted '$want'"
# --train-samples 100: 4, 4, 8 and six steps of 16 reach 112 >= 100: 9 iterations.
run samples 1 --micro-batch-size 2 --step-batch-size-schedule "0:4 128:8 0.256K:16" \
  --train-samples 100 --save "$tmp/auto"
check "iterations and samples of --train-samples 100" "$(tail -1 "$tmp/samples.txt" | cut -d' ' -f1,4)" "9 112"
check "checkpoints where the batch changes, and at the end" \
  "$(cd "$tmp/auto" && ls -d iter_* | tr '\n' ' ')" "iter_0000002 iter_0000003 iter_0000009 "

# verify-resume across the change: same layout (bitwise), and into pp 2.
vr() {
  local what=$1
  shift
  local out
  out=$(timeout 300 "${mpirun[@]}" -np 2 "$weft" verify-resume "${model[@]}" --micro-batch-size 1 \
        --step-batch-size-schedule "0:2 64:4 192:8" --at 3 --to 6 "$@" 2>&1)
  if grep -q "^verify-resume: PASS" <<<"$out"; then ok "verify-resume $what: $(grep '^verify-resume: PASS' <<<"$out")"
  else bad "verify-resume $what: $(grep -m3 'verify-resume\|error' <<<"$out")"; fi
}
vr "same layout"
vr "into pp 2" --load-layout "--pipeline-model-parallel-size 2"
# Scaled up at --at: pp 2 (dp 1) trains batch 1 from sample 0, dp 2 resumes at batch 2.
out=$(timeout 300 "${mpirun[@]}" -np 2 "$weft" verify-resume "${model[@]}" --micro-batch-size 1 \
      --step-batch-size-schedule "0:1 32:2" --at 2 --to 4 --pipeline-model-parallel-size 2 \
      --load-layout "--pipeline-model-parallel-size 1" 2>&1)
grep -q "^verify-resume: PASS" <<<"$out" && ok "verify-resume scaled up at the change" ||
  bad "verify-resume scaled up at the change: $(grep -m3 'verify-resume\|error' <<<"$out")"

# Scaled up mid-run: 1 rank trains 2 steps of batch 2 (saved at the change), 4 ranks (micro-batch
# 2 x dp 4) resume at batch 8; the same 4 ranks from the start would meet batch 2.
up=(--micro-batch-size 2 --step-batch-size-schedule "0:2 64:8" --train-iters 4)
run up1 1 "${up[@]}" --save "$tmp/up" --exit-interval 2
run up4 4 "${up[@]}" --load "$tmp/up"
check "the resumed, scaled-up run" "$(cut -d' ' -f1,4,5 "$tmp/up4.txt" | tr '\n' ' ')" "3 12 8 4 20 8 "
refused "fresh run on 4 ranks" 4 "--step-batch-size-schedule: the batch size 2 (the step at sample 0" \
  "${up[@]}"
mkdir -p "$tmp/none"
refused "--load without a checkpoint" 1 "--step-batch-size-schedule: the batch size 3 (the step at sample 0" \
  --step-batch-size-schedule "0:3" --load "$tmp/none" --save "$tmp/none"
refused "an empty schedule" 1 "--step-batch-size-schedule is empty" --step-batch-size-schedule ""
refused "with --global-batch-size" 1 \
  "--step-batch-size-schedule and --global-batch-size both give the training batch" \
  --step-batch-size-schedule "0:4" --global-batch-size 4
refused "a falling batch" 1 "--step-batch-size-schedule: the batch size falls from 8 to 4" \
  --step-batch-size-schedule "0:8 1M:4"
refused "a bad entry" 1 "--step-batch-size-schedule entry '1Q:8': not a number" \
  --step-batch-size-schedule "0:4 1Q:8"
refused "--rampup-batch-size" 1 "--step-batch-size-schedule" --rampup-batch-size 4 4 100

# weft plan: the step of the largest batch, 8 / (micro-batch 2 x dp 2) = 2 microbatches.
out=$(timeout 60 "$weft" plan --world-size 2 "${model[@]}" --micro-batch-size 2 \
      --step-batch-size-schedule "0:4 128:8" --train-iters 5 2>&1)
grep -q "2 microbatch(es) of 2 x 16 tokens per step and dp rank.*largest batch of --step-batch-size-schedule" <<<"$out" &&
  ok "weft plan sizes the largest batch" || bad "weft plan: $(head -2 <<<"$out")"
finish
