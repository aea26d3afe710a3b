#!/usr/bin/env bash
# Preemption test: SIGTERM, and then SIGINT, to one rank during training finishes the current
# iteration on every rank, saves, and exits 0; the saved iteration is the one the log reached.
# SIGTERM once more with --async-save --save-interval 1: the pending background write and the
# final save are committed before exit. Then --exit-duration-in-mins with a duration shorter
# than any iteration saves and exits 0 after iteration 1. A signal exit runs no final
# evaluation (the mock data's validation split would be evaluated at the end of --train-iters).
# The victim is rank 1, found by pid: among the processes whose command line names this run's
# save directory, the one whose executable is the weft binary (not mpirun, whose command line
# names it too) and whose MPI rank (OMPI_COMM_WORLD_RANK, or PMIX_RANK, in its environment) is
# 1. Rank 0, which prints the exit message, never gets the signal: the message shows that the
# decision travelled from rank 1 to every rank.
# Usage: preempt.sh WEFT_BINARY MPIRUN...
set -u
WEFT=$1; shift
MPIRUN=("$@")
DIR=$(mktemp -d /tmp/weft-preempt-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL (${SIG:-}): $*"; exit 1; }
# Ends this run only: mpirun and its ranks, by the pids whose command line names this run's dir.
stop_run() { kill -9 $(pgrep -f -- "--save $DIR/ck") 2>/dev/null; wait; }
# The MPI rank of a pid running the weft binary, or nothing.
EXE=$(readlink -f "$WEFT")
rank_of() {
  [ "$(readlink -f "/proc/$1/exe" 2>/dev/null)" = "$EXE" ] || return 0
  local env r
  env=$(tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null)
  r=$(printf '%s\n' "$env" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
  [ -n "$r" ] || r=$(printf '%s\n' "$env" | sed -n 's/^PMIX_RANK=//p')
  echo "$r"
}
# One preemption by signal SIG (TERM or INT) sent to rank 1; further arguments go to weft train.
preempt() {
  SIG=$1; shift
  rm -rf "$DIR/ck" "$DIR/log.jsonl" "$DIR/run.log"
  "${MPIRUN[@]}" -np 2 "$WEFT" train --pipeline-model-parallel-size 2 --num-layers 2 --hidden-size 32 \
    --ffn-hidden-size 48 --seq-length 16 --global-batch-size 8 --train-iters 100000 \
    --eval-interval 100000 --save "$DIR/ck" --log-jsonl "$DIR/log.jsonl" "$@" > "$DIR/run.log" 2>&1 &
  JOB=$!
  for _ in $(seq 1 600); do
    [ -s "$DIR/log.jsonl" ] && [ "$(wc -l < "$DIR/log.jsonl")" -ge 3 ] && break
    sleep 0.1
  done
  [ -s "$DIR/log.jsonl" ] || { stop_run; cat "$DIR/run.log"; fail "training did not start"; }

  declare -A PID_OF=()
  for pid in $(pgrep -f -- "--save $DIR/ck"); do
    r=$(rank_of "$pid")
    [ -n "$r" ] || continue
    [ -z "${PID_OF[$r]:-}" ] || { stop_run; fail "two processes claim rank $r"; }
    PID_OF[$r]=$pid
  done
  [ "${#PID_OF[@]}" = 2 ] && [ -n "${PID_OF[0]:-}" ] && [ -n "${PID_OF[1]:-}" ] ||
    { stop_run; fail "wanted ranks 0 and 1, found: ${!PID_OF[*]}"; }
  VICTIM=${PID_OF[1]}
  [ "$VICTIM" != "$JOB" ] && [ "$VICTIM" != "${PID_OF[0]}" ] || { stop_run; fail "victim pid $VICTIM"; }
  echo "SIG$SIG to rank 1 (pid $VICTIM); rank 0 is pid ${PID_OF[0]}, mpirun pid $JOB"
  kill -"$SIG" "$VICTIM"
  # Every rank must leave within a minute (a decision that stayed on rank 1 would hang rank 0).
  for _ in $(seq 1 600); do kill -0 $JOB 2>/dev/null || break; sleep 0.1; done
  kill -0 $JOB 2>/dev/null && { stop_run; cat "$DIR/run.log"; fail "still running 60 s after SIG$SIG to rank 1"; }
  wait $JOB; RC=$?
  [ $RC = 0 ] || { cat "$DIR/run.log"; fail "exit code $RC after SIG$SIG to rank 1"; }
  grep -q "exiting after iteration .* (signal)" "$DIR/run.log" || fail "no signal exit message"
  LAST=$(tail -1 "$DIR/log.jsonl" | sed 's/.*"iteration": \([0-9]*\).*/\1/')
  [ "$(cat "$DIR/ck/latest_checkpointed_iteration.txt")" = "$LAST" ] || fail "saved iteration is not $LAST"
  "$WEFT" ckpt verify "$DIR/ck" > /dev/null || fail "checkpoint does not verify"
  # A signal saves and ends without the final evaluation (it would eat the grace period first).
  ! grep -q valid_lm_loss "$DIR/log.jsonl" || fail "evaluated at the end of a signal exit"
  ! grep -q test_lm_loss "$DIR/log.jsonl" || fail "evaluated the test split at a signal exit"
}

for sig in TERM INT; do preempt $sig; done
preempt TERM --async-save --save-interval 1
grep -q "saved checkpoint .* at iteration $LAST" "$DIR/run.log" || fail "no commit message for $LAST"

# --exit-duration-in-mins shorter than one iteration: exits after iteration 1, saved.
# Bounded by `timeout`: a run that ignores the flag fails here instead of training on.
SIG=exit-duration
rm -rf "$DIR/ck" "$DIR/log.jsonl"
timeout 30 "${MPIRUN[@]}" -np 2 "$WEFT" train --pipeline-model-parallel-size 2 --num-layers 2 --hidden-size 32 \
  --ffn-hidden-size 48 --seq-length 16 --global-batch-size 8 --train-iters 100000 \
  --exit-duration-in-mins 0.0000001 --save "$DIR/ck" --log-jsonl "$DIR/log.jsonl" \
  > "$DIR/run.log" 2>&1
RC=$?
[ $RC = 0 ] || { cat "$DIR/run.log"; fail "exit code $RC"; }
grep -q "exiting after iteration 1 (--exit-duration-in-mins)" "$DIR/run.log" \
  || { cat "$DIR/run.log"; fail "no --exit-duration-in-mins exit message after iteration 1"; }
TRAINED=$(grep -c '"lm_loss"' "$DIR/log.jsonl")  # training lines (validation lines have valid_lm_loss)
[ "$TRAINED" = 1 ] || fail "trained $TRAINED iterations, not 1"
[ "$(cat "$DIR/ck/latest_checkpointed_iteration.txt")" = "1" ] || fail "saved iteration is not 1"
"$WEFT" ckpt verify "$DIR/ck" > /dev/null || fail "checkpoint does not verify"
echo "4 passed, 0 failed"
