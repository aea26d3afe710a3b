#!/usr/bin/env bash
# Which samples each evaluation reads (Megatron's consumed_valid_samples): every evaluation
# reads the next --eval-iters global batches of the valid split, the one at the end of training
# the batches after those, and the test split is evaluated once at the end. With --lr 0 the
# model never changes, so equal losses mean equal samples:
#   A: --eval-interval 2, 5 iterations: valid at 2 (batch 0), 4 (batch 1), 5 (batch 2), test
#   B: --eval-interval 4:               valid at 4 (batch 0), 5 (batch 1), test
# so A@2 = B@4, A@4 = B@5, A@2 != A@4 (fresh samples), the tests equal; A on pp 2 x dp 2
# (4 ranks) equals A on 1 rank; A stopped at 3 (--exit-interval, saved) and resumed on pp 2
# evaluates at 4 and 5 and on the test split what A did.
# Usage: eval_samples.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
dir=$(mktemp -d /tmp/weft-eval-samples-XXXXXX)
trap 'rm -rf "$dir"' EXIT
model=(train --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --seq-length 16 --vocab-size 64 --micro-batch-size 1 --global-batch-size 4
       --train-iters 5 --eval-iters 1 --lr 0 --log-interval 1 --mock-data)
"$weft" "${model[@]}" --eval-interval 2 --log-jsonl "$dir/a.jsonl" > "$dir/a.log" 2>&1 ||
  { cat "$dir/a.log"; echo "FAIL: run A"; exit 1; }
"$weft" "${model[@]}" --eval-interval 4 --log-jsonl "$dir/b.jsonl" > "$dir/b.log" 2>&1 ||
  { cat "$dir/b.log"; echo "FAIL: run B"; exit 1; }
"${mpirun[@]}" -np 4 "$weft" "${model[@]}" --eval-interval 2 --pipeline-model-parallel-size 2 \
  --log-jsonl "$dir/p.jsonl" > "$dir/p.log" 2>&1 || { cat "$dir/p.log"; echo "FAIL: run A on pp2 x dp2"; exit 1; }
"$weft" "${model[@]}" --eval-interval 2 --save "$dir/ck" --save-interval 3 --exit-interval 3 \
  > "$dir/s.log" 2>&1 || { cat "$dir/s.log"; echo "FAIL: run A stopped at 3"; exit 1; }
"${mpirun[@]}" -np 2 "$weft" "${model[@]}" --eval-interval 2 --load "$dir/ck" \
  --pipeline-model-parallel-size 2 --log-jsonl "$dir/r.jsonl" > "$dir/r.log" 2>&1 ||
  { cat "$dir/r.log"; echo "FAIL: run A resumed at 3"; exit 1; }
grep -q "validation loss at iteration 5 on test set" "$dir/a.log" ||
  { cat "$dir/a.log"; echo "FAIL: no test-set line"; exit 1; }
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name, key):
    return {r["iteration"]: r[key] for r in map(json.loads, open(f"{d}/{name}.jsonl")) if key in r}
a, b, p, r = (losses(n, "valid_lm_loss") for n in "abpr")
ta, tb, tr = (losses(n, "test_lm_loss") for n in "abr")
close = lambda x, y: x is not None and y is not None and abs(x - y) <= 1e-6 * abs(y)
checks = [
    ("A evaluates at 2, 4 and 5", sorted(a) == [2, 4, 5]),
    ("B evaluates at 4 and 5", sorted(b) == [4, 5]),
    ("A@2 == B@4 (batch 0)", a.get(2) == b.get(4)),
    ("A@4 == B@5 (batch 1)", a.get(4) == b.get(5)),
    ("A@2 != A@4 (each evaluation reads fresh samples)", a.get(2) != a.get(4)),
    ("A@4 != A@5", a.get(4) != a.get(5)),
    ("one test evaluation at 5, equal in A and B", list(ta) == [5] and ta == tb),
    ("pp2 x dp2 equals 1 rank", sorted(p) == sorted(a) and all(close(p[i], a[i]) for i in a)),
    ("resumed at 3 on pp2: valid at 4 and 5 as A", sorted(r) == [4, 5] and
     close(r.get(4), a.get(4)) and close(r.get(5), a.get(5))),
    ("resumed: the test as A's", list(tr) == [5] and close(tr[5], ta.get(5))),
]
bad = [n for n, ok in checks if not ok]
for n, ok in checks: print(("ok   " if ok else "FAIL ") + n)
print("A", a, "B", b, "pp2xdp2", p, "resumed", r, "test", ta, tr)
sys.exit(1 if bad else 0)
PY
