#!/usr/bin/env bash
# Preemption test: SIGTERM to one rank during training finishes the current iteration on every
# rank, saves, and exits 0; the saved iteration is the one the log reached.
# Usage: preempt.sh WEFT_BINARY MPIRUN...
set -u
WEFT=$1; shift
MPIRUN=("$@")
DIR=$(mktemp -d /tmp/weft-preempt-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"${MPIRUN[@]}" -np 2 "$WEFT" train --pipeline-model-parallel-size 2 --num-layers 2 --hidden-size 32 \
  --ffn-hidden-size 48 --seq-length 16 --global-batch-size 8 --train-iters 100000 \
  --save "$DIR/ck" --log-jsonl "$DIR/log.jsonl" > "$DIR/run.log" 2>&1 &
JOB=$!
for _ in $(seq 1 600); do
  [ -s "$DIR/log.jsonl" ] && [ "$(wc -l < "$DIR/log.jsonl")" -ge 3 ] && break
  sleep 0.1
done
[ -s "$DIR/log.jsonl" ] || { kill -9 $JOB; cat "$DIR/run.log"; fail "training did not start"; }
# One rank gets the signal; the exit decision is agreed by all.
RANK=$(pgrep -f "weft train .*$DIR/ck" | tail -1)
kill -TERM "$RANK"
wait $JOB; RC=$?
[ $RC = 0 ] || { cat "$DIR/run.log"; fail "exit code $RC after SIGTERM"; }
grep -q "exiting after iteration .* (signal)" "$DIR/run.log" || fail "no signal exit message"
LAST=$(tail -1 "$DIR/log.jsonl" | sed 's/.*"iteration": \([0-9]*\).*/\1/')
[ "$(cat "$DIR/ck/latest_checkpointed_iteration.txt")" = "$LAST" ] || fail "saved iteration is not $LAST"
"$WEFT" ckpt verify "$DIR/ck" > /dev/null || fail "checkpoint does not verify"
echo "1 passed, 0 failed"
