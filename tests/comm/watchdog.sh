#!/usr/bin/env bash
# A dead or hung rank must not hang the job (comm/watchdog.h). Runs of `weft train`:
#   bad-flag --distributed-timeout-minutes 0 or -1: exit 2, one line naming the flag;
#   healthy  2 ranks, pp 2, a 15 s timeout: trains to the end and exits 0 (no false alarm, and the
#            watchdog thread shuts down cleanly before MPI_Finalize);
#   kill     rank 1 dies by SIGKILL in iteration 3 (WEFT_FAULT, after its backward): the job
#            ends, non-zero, within a bound, and the output names rank 1;
#   stop     rank 1 of a pp 2 run is stopped by pid with SIGSTOP (mpirun does not notice): after
#            the 3 s timeout rank 0's watchdog names rank 1 as missing and aborts the job;
#   stop3    rank 2 of a 3-rank data-parallel run stops itself in iteration 3 (WEFT_FAULT
#            :stop): ranks 0 and 1 wait in the world all-reduce, ask each other and rank 2, and
#            name rank 2, only rank 2, as missing.
# Times are measured from the moment the fault is known to have happened (by pid) or from the
# log line of iteration 2 (WEFT_FAULT in iteration 3), and printed. Each run is bounded by
# `timeout`; a stopped rank left behind is killed by pid.
# Usage: watchdog.sh WEFT_BINARY MPIRUN...
set -u
WEFT=$1; shift
MPIRUN=("$@")
DIR=$(mktemp -d /tmp/weft-watchdog-XXXXXX)
PIDS=""  # the job's processes (mpirun and ranks), killed by pid if left behind
cleanup() { [ -n "$PIDS" ] && kill -9 $PIDS 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
TIMEOUT_MIN=0.05  # 3 s
BOUND=20          # seconds from the fault to the end of the job
MODEL=(train --log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --seq-length 16)
fail() { echo "FAIL ($CASE): $*"; [ -f "$DIR/run.log" ] && tail -20 "$DIR/run.log"; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# Waits until the job's JSONL log has $1 lines (iterations); fails after 60 s.
wait_lines() {
  for _ in $(seq 1 600); do
    [ -s "$DIR/log.jsonl" ] && [ "$(wc -l < "$DIR/log.jsonl")" -ge "$1" ] && return 0
    kill -0 "$JOB" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# Waits for the job to end (at most $1 s more); sets RC and END.
wait_job() {
  for _ in $(seq 1 $(($1 * 10))); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
  END=$(now)
  kill -0 "$JOB" 2>/dev/null && { kill -9 "$JOB"; fail "still running $1 s after the fault"; }
  wait "$JOB"; RC=$?
}
# Records the job's pids (once its ranks run); after the job, none may be left.
record_pids() { PIDS=$(pgrep -f -- "--log-jsonl $DIR/log.jsonl"); }
# Ranks may still be exiting when mpirun has returned: they get 10 s. A zombie (state Z, not
# reaped by a container's pid 1) has ended.
none_left() {
  local left=""
  for _ in $(seq 1 100); do
    left=""
    for pid in $PIDS; do
      [ -r "/proc/$pid/stat" ] && [ "$(cut -d' ' -f3 "/proc/$pid/stat")" != Z ] && left="$left $pid"
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { ps -o pid,stat,args -p "$(echo $left | tr " " ",")" | cut -c1-150; fail "processes left behind:$left"; }
  PIDS=""
}
# The MPI rank of a pid running the weft binary, or nothing (as tests/checkpoint/preempt.sh).
EXE=$(readlink -f "$WEFT")
rank_of() {
  [ "$(readlink -f "/proc/$1/exe" 2>/dev/null)" = "$EXE" ] || return 0
  local env r
  env=$(tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null)
  r=$(printf '%s\n' "$env" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
  [ -n "$r" ] || r=$(printf '%s\n' "$env" | sed -n 's/^PMIX_RANK=//p')
  echo "$r"
}
start() {  # start NP FAULT ARGS...: the job in the background, JOB its mpirun pid
  local np=$1 fault=$2; shift 2
  rm -f "$DIR/log.jsonl" "$DIR/run.log"
  WEFT_FAULT=$fault "${MPIRUN[@]}" -np "$np" -x WEFT_FAULT "$WEFT" "${MODEL[@]}" "$@" \
    --log-jsonl "$DIR/log.jsonl" > "$DIR/run.log" 2>&1 &
  JOB=$!
}

CASE=bad-flag  # 0 and negative timeouts are refused before any collective: exit 2, one line
for v in 0 -1; do
  ERR=$("${MPIRUN[@]}" -np 2 "$WEFT" "${MODEL[@]}" --distributed-timeout-minutes $v 2>&1 >/dev/null)
  RC=$?
  [ "$RC" = 2 ] && [ "$(printf '%s\n' "$ERR" | grep -c '^weft: error')" = 1 ] &&
    printf '%s' "$ERR" | grep -qF -- "--distributed-timeout-minutes must be > 0 (got $v)" ||
    { printf '%s\n' "$ERR" | head -5; fail "--distributed-timeout-minutes $v: exit $RC"; }
done

CASE=healthy
start 2 "" --pipeline-model-parallel-size 2 --global-batch-size 8 --train-iters 6 \
  --distributed-timeout-minutes 0.25
T0=$(now); wait_job 120
[ "$RC" = 0 ] || fail "exit code $RC"
grep -q "watchdog" "$DIR/run.log" && fail "the watchdog fired in a healthy run"
[ "$(grep -c '"lm_loss"' "$DIR/log.jsonl")" = 6 ] || fail "did not train 6 iterations"
echo "healthy: 6 iterations, exit 0 in $(secs "$T0" "$END") s"

CASE=kill
start 2 train.after_backward:1:3 --pipeline-model-parallel-size 2 --global-batch-size 8 \
  --train-iters 100000 --distributed-timeout-minutes $TIMEOUT_MIN
wait_lines 2 || fail "training did not reach iteration 2"
T0=$(now); record_pids; wait_job $BOUND
[ "$RC" != 0 ] || fail "exit code 0 after rank 1 died"
none_left
grep -Eq "rank 1 .*signal 9|missing: rank 1 " "$DIR/run.log" || fail "no message names rank 1"
echo "kill: job ended (exit $RC) $(secs "$T0" "$END") s after iteration 2 was logged"

CASE=stop
start 2 "" --pipeline-model-parallel-size 2 --global-batch-size 8 --train-iters 100000 \
  --distributed-timeout-minutes $TIMEOUT_MIN
wait_lines 3 || fail "training did not reach iteration 3"
record_pids
VICTIM=""
for pid in $PIDS; do [ "$(rank_of "$pid")" = 1 ] && VICTIM=$pid; done
[ -n "$VICTIM" ] || fail "rank 1 not found"
kill -STOP "$VICTIM"; T0=$(now)
wait_job $BOUND
WAITED=$(secs "$T0" "$END")
[ "$RC" != 0 ] || fail "exit code 0 after rank 1 was stopped"
less "$WAITED" 2.5 && fail "the job ended $WAITED s after the stop, before the 3 s timeout"
grep -q "^\[rank 0\] weft: watchdog: .* on group '.*' (ranks 0,1) has waited [0-9.]* s, longer than --distributed-timeout-minutes 0.05; missing: rank 1 (no answer" "$DIR/run.log" \
  || fail "rank 0's watchdog did not name rank 1 as missing"
none_left
echo "stop: job ended (exit $RC) $WAITED s after SIGSTOP to rank 1: $(grep -o 'watchdog: .*' "$DIR/run.log" | head -1)"

CASE=stop3
start 3 train.after_backward:2:3:stop --global-batch-size 6 --train-iters 100000 \
  --distributed-timeout-minutes $TIMEOUT_MIN
wait_lines 2 || fail "training did not reach iteration 2"
T0=$(now); record_pids; wait_job $BOUND
[ "$RC" != 0 ] || fail "exit code 0 after rank 2 was stopped"
none_left
LINES=$(grep "weft: watchdog: " "$DIR/run.log")
[ -n "$LINES" ] || fail "no watchdog message"
echo "$LINES" | grep -q "all_reduce #[0-9]* on group 'world' (ranks 0,1,2)" || fail "not the world all-reduce"
# The first watchdog to finish its queries names rank 2, which gives no answer. Open MPI resumes
# rank 2 (SIGCONT) while it aborts the job, so a second watchdog may still hear from it; but no
# message may name rank 0 or rank 1 as missing.
echo "$LINES" | grep -q "missing: rank 2 (no answer within [0-9.]* s: [^;]*); aborting the job$" ||
  fail "no message names rank 2 (no answer) as the only missing rank: $LINES"
while read -r line; do
  m=${line#*missing: }
  [[ $line != *"missing: "* || ($m == "rank 2 ("* && $m != *"; rank "[0-9]*" ("*) ]] ||
    fail "a message names another rank than rank 2 as missing: $line"
done <<< "$LINES"
echo "stop3: job ended (exit $RC) $(secs "$T0" "$END") s after iteration 2 was logged: $(echo "$LINES" | head -1 | grep -o 'watchdog: .*')"
echo "5 passed, 0 failed"
