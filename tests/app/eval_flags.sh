#!/usr/bin/env bash
# Megatron's evaluation flags (ValidationConfig): --eval-global-batch-size and
# --eval-micro-batch-size, --start-eval-at-iter, --skip-train. With --lr 0 the model never
# changes, so equal losses mean equal samples (as eval_samples.sh):
#   - the evaluation's batch: C (--global-batch-size 4, --eval-iters 2) and D (the same training,
#     --eval-global-batch-size 8 --eval-micro-batch-size 2 --eval-iters 1) read the same 8
#     samples per evaluation, so their valid and test losses agree, also D on dp 2 and on
#     pp 2 x dp 2; the training losses stay C's bit for bit;
#   - --start-eval-at-iter 3 (and 4) with --eval-interval 2 over 7 iterations evaluates at 4, 6
#     and 7 the batches F (no start) evaluates at 2, 4 and 6; started at 8 only the final
#     evaluation runs, on F@2's batch; stopped at 5 and resumed, the evaluations at 6 and 7 are
#     the uninterrupted run's; a checkpoint's count of valid samples read is continued by a
#     resume that starts its evaluations later;
#   - --skip-train with --load of a trained checkpoint evaluates the valid and test splits from
#     their first samples, as the first evaluation of the run that trained it (also on pp 2),
#     writes no checkpoint, and says so;
#   - refusals name their flag.
# Usage: eval_flags.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
dir=$(mktemp -d /tmp/weft-eval-flags-XXXXXX)
trap 'rm -rf "$dir"' EXIT
model=(train --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --seq-length 16 --vocab-size 64 --micro-batch-size 1 --global-batch-size 4
       --log-interval 1 --mock-data)
run() {  # name, then flags (a leading "np N" runs under mpirun)
  local name=$1
  shift
  local pre=()
  if [ "$1" = np ]; then pre=("${mpirun[@]}" -np "$2"); shift 2; fi
  "${pre[@]}" "$weft" "${model[@]}" "$@" --log-jsonl "$dir/$name.jsonl" > "$dir/$name.log" 2>&1 ||
    { tail -5 "$dir/$name.log"; echo "FAIL: run $name"; exit 1; }
}
batch=(--train-iters 4 --eval-interval 2 --lr 0)
run c "${batch[@]}" --eval-iters 2
run d "${batch[@]}" --eval-iters 1 --eval-global-batch-size 8 --eval-micro-batch-size 2
run d2 np 2 "${batch[@]}" --eval-iters 1 --eval-global-batch-size 8 --eval-micro-batch-size 2
run d4 np 4 "${batch[@]}" --eval-iters 1 --eval-global-batch-size 8 --eval-micro-batch-size 2 \
  --pipeline-model-parallel-size 2
trained=(--train-iters 7 --eval-interval 2 --eval-iters 1 --lr 0)
run e "${trained[@]}" --start-eval-at-iter 3
run e4 "${trained[@]}" --start-eval-at-iter 4
run e8 "${trained[@]}" --start-eval-at-iter 8
run f "${trained[@]}"
run es "${trained[@]}" --start-eval-at-iter 3 --save "$dir/ck-e" --save-interval 5 --exit-interval 5
run er np 2 "${trained[@]}" --start-eval-at-iter 3 --load "$dir/ck-e" --pipeline-model-parallel-size 2
# The checkpoint carries the valid samples read (Megatron's consumed_valid_samples): 4 iterations
# evaluated at 2 and 4, resumed to 8 with --start-eval-at-iter 6, evaluate at 6 and 8 the
# batches after those (F's at 6 and 7), not again the first ones.
run k --train-iters 4 --eval-interval 2 --eval-iters 1 --lr 0 --save "$dir/ck-k"
run kr --train-iters 8 --eval-interval 2 --eval-iters 1 --lr 0 --load "$dir/ck-k" \
  --start-eval-at-iter 6
# A trained model (--lr 1e-2), evaluated at its last iteration from the first valid sample.
# --skip-train reads from the first samples whatever --eval-interval would have read before
# iteration 3 (interval 1: two evaluations).
learn=(--train-iters 3 --eval-iters 2 --lr 1e-2)
run g "${learn[@]}" --eval-interval 3 --save "$dir/ck-g"
run h "${learn[@]}" --eval-interval 1 --load "$dir/ck-g" --skip-train --save "$dir/ck-h"
run h2 np 2 "${learn[@]}" --eval-interval 1 --load "$dir/ck-g" --skip-train \
  --pipeline-model-parallel-size 2
grep -q "skipping training (--skip-train is on)" "$dir/h.log" ||
  { cat "$dir/h.log"; echo "FAIL: --skip-train does not say it skips training"; exit 1; }
grep -q "warning: --save has no effect with --skip-train" "$dir/h.log" ||
  { cat "$dir/h.log"; echo "FAIL: no warning for --save with --skip-train"; exit 1; }
grep -q "validation loss at iteration 3 on validation set" "$dir/h.log" ||
  { cat "$dir/h.log"; echo "FAIL: no validation-set line"; exit 1; }
[ ! -e "$dir/ck-h" ] || { ls -R "$dir/ck-h"; echo "FAIL: --skip-train wrote a checkpoint"; exit 1; }
python3 - "$dir" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
def losses(name, key):
    return {r["iteration"]: r[key] for r in rows(name) if key in r}
close = lambda x, y: x is not None and y is not None and abs(x - y) <= 1e-6 * abs(y)
def same(x, y):
    return sorted(x) == sorted(y) and all(close(x[i], y[i]) for i in y)
v = {n: losses(n, "valid_lm_loss") for n in ["c", "d", "d2", "d4", "e", "e4", "e8", "f", "er", "g", "h", "h2", "kr"]}
t = {n: losses(n, "test_lm_loss") for n in ["c", "d", "d2", "g", "h", "h2"]}
train = {n: losses(n, "lm_loss") for n in ["c", "d", "e", "f", "h"]}
f = v["f"]
checks = [
    ("C evaluates at 2 and 4", sorted(v["c"]) == [2, 4]),
    ("D (eval batch 8 of micro-batch 2) reads C's samples", same(v["d"], v["c"])),
    ("D on dp 2", same(v["d2"], v["c"])),
    ("D on pp 2 x dp 2", same(v["d4"], v["c"])),
    ("D's test split as C's", same(t["d"], t["c"]) and same(t["d2"], t["c"]) and len(t["c"]) == 1),
    ("the eval batch changes no training loss", train["d"] == train["c"] and len(train["c"]) == 4),
    ("F evaluates at 2, 4, 6 and 7", sorted(f) == [2, 4, 6, 7]),
    ("start 3: at 4, 6, 7 on F's batches of 2, 4, 6", sorted(v["e"]) == [4, 6, 7] and
     close(v["e"][4], f[2]) and close(v["e"][6], f[4]) and close(v["e"][7], f[6])),
    ("start 4 (a multiple of the interval) as start 3", v["e4"] == v["e"]),
    ("start 8: only the final evaluation, on F@2's batch", sorted(v["e8"]) == [7] and
     close(v["e8"][7], f[2])),
    ("start 3, resumed at 5 on pp 2: at 6 and 7 as uninterrupted", sorted(v["er"]) == [6, 7] and
     close(v["er"][6], v["e"][6]) and close(v["er"][7], v["e"][7])),
    ("the start changes no training loss", train["e"] == train["f"]),
    ("resumed with a later start: the valid samples after the checkpoint's", sorted(v["kr"]) ==
     [6, 8] and close(v["kr"][6], f[6]) and close(v["kr"][8], f[7])),
    ("G evaluates at 3 (its first evaluation, valid from sample 0)", sorted(v["g"]) == [3]),
    ("--skip-train: the valid split from sample 0 as G@3", sorted(v["h"]) == [3] and
     close(v["h"][3], v["g"][3])),
    ("--skip-train: the test split as G's", same(t["h"], t["g"]) and len(t["g"]) == 1),
    ("--skip-train on pp 2", same(v["h2"], v["g"]) and same(t["h2"], t["g"])),
    ("--skip-train trains no iteration", train["h"] == {}),
]
for n, ok in checks: print(("ok   " if ok else "FAIL ") + n)
print("valid", v, "test", t)
sys.exit(0 if all(ok for _, ok in checks) else 1)
PY
refused() {  # expected message, then flags
  local want=$1
  shift
  out=$("$weft" "${model[@]}" --train-iters 2 "$@" 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$want" <<< "$out"; then
    echo "$out"; echo "FAIL: $* (rc $rc) should be refused with: $want"; exit 1
  fi
}
refused "--eval-global-batch-size 6 is not divisible by --eval-micro-batch-size * dp" \
  --eval-global-batch-size 6 --eval-micro-batch-size 4
refused "--eval-micro-batch-size must be >= 1" --eval-micro-batch-size 0
refused "--eval-global-batch-size must be >= 1" --eval-global-batch-size 0
refused "--start-eval-at-iter must be >= 0" --start-eval-at-iter -3
refused "--skip-train with --eval-iters 0" --skip-train --eval-iters 0
out=$("$weft" verify-resume "${model[@]:1}" --skip-train --at 1 --to 2 --workdir "$dir/vr" 2>&1)
[ $? -eq 2 ] && grep -qF -- "--skip-train: verify-resume trains" <<< "$out" ||
  { echo "$out"; echo "FAIL: verify-resume --skip-train should be refused"; exit 1; }
echo "PASS"
