#!/usr/bin/env bash
# Crash test: a rank is killed with SIGKILL in the middle of saving iteration 2, at each fault
# point of the save (core/fault.h), with synchronous and with --async-save saves (where the
# first two points run on the background writer thread):
#   - checkpoint.during_shard_write on rank 1 (half of its shard file written);
#   - checkpoint.after_shard_write on rank 1 (its shard written, the others not yet agreed);
#   - checkpoint.before_commit on rank 0, the committer (every shard written and agreed, the
#     tracker not yet moved).
# Either way the checkpoint of iteration 1 must stay the latest, still verify, and still load;
# the half-written iteration 2 must be invisible; and the resumed run must save iteration 2 over
# the leftover temporary directory.
# Usage: crash_during_save.sh WEFT_BINARY MPIRUN...
set -u
WEFT=$1; shift
MPIRUN=("$@")
DIR=$(mktemp -d /tmp/weft-crash-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
ARGS=(train --pipeline-model-parallel-size 2 --log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48
      --seq-length 16 --global-batch-size 8 --train-iters 3 --save "$DIR/ck" --save-interval 1)
fail() { echo "FAIL ($FAULT ${MODE[*]}): $*"; exit 1; }

PASSED=0
for ASYNC in no yes; do
MODE=()
[ $ASYNC = yes ] && MODE=(--async-save)
for FAULT in checkpoint.during_shard_write:1:2 checkpoint.after_shard_write:1:2 \
             checkpoint.before_commit:0:2; do
  rm -rf "$DIR/ck"
  WEFT_FAULT=$FAULT "${MPIRUN[@]}" -np 2 -x WEFT_FAULT "$WEFT" "${ARGS[@]}" "${MODE[@]}" \
    > "$DIR/crash.log" 2>&1 && fail "the job survived its own SIGKILL"
  [ "$(cat "$DIR/ck/latest_checkpointed_iteration.txt")" = "1" ] || fail "tracker is not 1"
  [ -d "$DIR/ck/iter_0000002" ] && fail "iter_0000002 became visible"
  [ -f "$DIR/ck/iter_0000001/metadata.json" ] || fail "iter_0000001 is incomplete"
  "$WEFT" ckpt verify "$DIR/ck" > "$DIR/verify.log" 2>&1 \
    || { cat "$DIR/verify.log"; fail "the previous checkpoint does not verify"; }
  "${MPIRUN[@]}" -np 2 "$WEFT" "${ARGS[@]}" "${MODE[@]}" --load "$DIR/ck" > "$DIR/resume.log" 2>&1 \
    || { cat "$DIR/resume.log"; fail "resume from the previous checkpoint failed"; }
  grep -q "loaded .* at iteration 1" "$DIR/resume.log" || fail "did not resume from iteration 1"
  grep -q "iteration        3/" "$DIR/resume.log" || fail "did not train to iteration 3"
  [ "$(cat "$DIR/ck/latest_checkpointed_iteration.txt")" = "3" ] || fail "tracker is not 3 after resume"
  [ -f "$DIR/ck/iter_0000002/metadata.json" ] || fail "the resumed run did not save iteration 2"
  ls -A "$DIR/ck" | grep -q '\.tmp$' && fail "a temporary directory was left: $(ls -A "$DIR/ck")"
  PASSED=$((PASSED + 1))
done
done
echo "$PASSED passed, 0 failed"
