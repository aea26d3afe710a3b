#!/usr/bin/env bash
# Fail fast: every bad numeric flag and every bad path flag of `weft train` ends the run before
# iteration 1 with exit code 2 and exactly one stderr line naming the flag; under mpirun -np 2
# and -np 4 too: one "weft:" line and no MPI_Abort banner (mpirun adds its own "non-zero exit"
# notice, which `mpirun -q` hides, leaving weft's line alone; -q also hides the MPI_Abort banner,
# so the checks for it run without -q). A usage error raised on one rank only, after training
# has started (WEFT_FAULT=train.usage_error), still ends the job (aborted) instead of hanging.
# Megatron's architecture flags: refused for what weft does not build, accepted (same losses)
# where they state what it does.
# Usage: fail_fast.sh WEFT MPIRUN...
set -u
weft=$1
shift
mpirun=("$@")
tmp=$(mktemp -d /tmp/weft-failfast-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
base=(train --log-interval 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
      --group-query-attention --num-query-groups 2 --seq-length 16 --vocab-size 64 --micro-batch-size 2
      --global-batch-size 8 --train-iters 2 --eval-interval 0)
fails=0 cases=0
# expect NP CODE NEEDLE FLAGS... : (NP 0: without mpirun) exit CODE, one stderr line containing NEEDLE, no MPI_ABORT,
# and no iteration ran (no "iteration" line on stdout).
expect() {
  local np=$1 code=$2 needle=$3
  shift 3
  local out err rc lines t0 t1
  cases=$((cases + 1))
  t0=$(date +%s.%N)
  if [ "$np" = 0 ]; then  # no launcher: a singleton run, as on a workstation (and faster)
    timeout 120 "$weft" "${base[@]}" "$@" >"$tmp/out" 2>"$tmp/err"
  else
    timeout 120 "${mpirun[@]}" -np "$np" "$weft" "${base[@]}" "$@" >"$tmp/out" 2>"$tmp/err"
  fi
  rc=$?
  t1=$(date +%s.%N)
  err=$(grep '^weft: ' "$tmp/err")
  lines=$(grep -c '^weft: ' "$tmp/err")
  # Without a launcher, nothing else may be on stderr.
  [ "$np" = 0 ] && [ "$(grep -c . "$tmp/err")" -ne 1 ] && lines=many
  if [ "$rc" -ne "$code" ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$needle" "$tmp/err" ||
     grep -q "MPI_ABORT" "$tmp/err" || grep -q " iteration " "$tmp/out"; then
    echo "FAIL (np $np: $*): exit $rc (want $code), $lines weft line(s), wanted '$needle':"
    head -5 "$tmp/err"
    fails=$((fails + 1))
  else
    printf 'ok   (np %s, %.1fs, exit %s): %s\n' "$np" "$(echo "$t1 - $t0" | bc)" "$rc" "$err"
  fi
}

# --- numeric flags: finite and in range, one line naming the flag ------------------------------
bad_numbers=(
  "--lr nan" "--lr inf" "--lr -0.1" "--min-lr 0.5 --lr 0.1" "--min-lr nan"
  "--adam-beta1 1" "--adam-beta1 -0.1" "--adam-beta2 1.5" "--adam-beta2 nan" "--adam-eps 0"
  "--adam-eps nan" "--weight-decay -0.1" "--weight-decay inf" "--init-method-std 0"
  "--init-method-std inf" "--norm-epsilon 0" "--norm-epsilon nan" "--rotary-base 0"
  "--rotary-base nan" "--clip-grad -1" "--clip-grad nan" "--moe-aux-loss-coeff -1"
  "--moe-aux-loss-coeff nan" "--mtp-loss-scaling-factor -1" "--mtp-loss-scaling-factor nan"
  "--exit-duration-in-mins -1" "--exit-duration-in-mins nan" "--micro-batch-size 0"
  "--global-batch-size 0" "--train-iters -1" "--num-layers 0" "--hidden-size 0"
  "--ffn-hidden-size 0" "--num-attention-heads 0" "--num-query-groups 0" "--seq-length 0"
  "--vocab-size 1" "--num-experts -1" "--moe-router-topk 0" "--moe-ffn-hidden-size 0"
  "--moe-shared-expert-intermediate-size -1" "--mamba-state-dim 0" "--mamba-head-dim 0"
  "--mamba-num-groups 0" "--mamba-num-heads 0" "--mtp-num-layers -1" "--lr-warmup-iters -1"
  "--lr-decay-iters -2" "--lr-decay-iters 0" "--decoder-first-pipeline-num-layers 0"
  "--decoder-last-pipeline-num-layers -2" "--log-interval 0" "--save-interval -1"
  "--ckpt-step -2" "--exit-interval -1" "--eval-interval -1" "--eval-iters -1"
  "--max-skipped-iterations -1" "--threads -1" "--lr abc" "--seed -1"
  "--tensor-model-parallel-size 0" "--pipeline-model-parallel-size 0" "--lr-warmup-iters 100000"
)
for b in "${bad_numbers[@]}"; do
  read -r -a words <<<"$b"
  expect 0 2 "${words[0]}" "${words[@]}"
done

# --- Megatron's architecture flags (app/recipe_flags.h): a value weft does not build -----------
expect 0 2 "--normalization LayerNorm: weft builds RMSNorm models only" --normalization LayerNorm
expect 0 2 "--position-embedding-type learned_absolute: weft builds rotary" \
  --position-embedding-type learned_absolute
expect 0 2 "--attention-dropout 0.1: weft trains without dropout" --attention-dropout 0.1
expect 0 2 "--hidden-dropout 0.1: weft trains without dropout" --hidden-dropout 0.1
expect 0 2 "--max-position-embeddings 8 is smaller than --seq-length 16" --max-position-embeddings 8
expect 0 2 "--transformer-impl must be local or transformer_engine" --transformer-impl inference
# ... and a Megatron Llama-style command line that states weft's architecture trains, with the
# same losses as without the flags.
cases=$((cases + 1))
recipe=(--use-mcore-models --group-query-attention --position-embedding-type rope
        --normalization RMSNorm --swiglu --disable-bias-linear --attention-dropout 0.0
        --hidden-dropout 0.0 --use-distributed-optimizer --transformer-impl transformer_engine
        --use-flash-attn --use-rotary-position-embeddings --max-position-embeddings 16)
with=$(timeout 120 "$weft" "${base[@]}" "${recipe[@]}" 2>&1 | grep -o "lm loss: [0-9.E+-]*")
without=$(timeout 120 "$weft" "${base[@]}" 2>&1 | grep -o "lm loss: [0-9.E+-]*")
if [ -n "$with" ] && [ "$with" = "$without" ]; then
  echo "ok   Megatron recipe flags accepted, losses equal: $(echo $with)"
else
  echo "FAIL: Megatron recipe flags: '$with' vs '$without'"; fails=$((fails + 1))
fi

# Megatron's --distributed-backend gloo (its CPU collectives) runs as weft's MPI: same losses.
cases=$((cases + 1))
gloo=$(timeout 120 "$weft" "${base[@]}" --distributed-backend gloo 2>&1 | grep -o "lm loss: [0-9.E+-]*")
if [ -n "$gloo" ] && [ "$gloo" = "$without" ]; then
  echo "ok   --distributed-backend gloo runs as mpi, losses equal"
else
  echo "FAIL: --distributed-backend gloo: '$gloo' vs '$without'"; fails=$((fails + 1))
fi
expect 0 2 "--distributed-backend must be auto, mpi or nccl" --distributed-backend ucc

# --- profiling on the CPU: the CPU build has neither Kineto nor the CUDA profiler API, and a CUDA
# build's capture range (--profile alone, as Megatron's) needs --device cuda -----------------
expect 0 2 "--profile" --profile
# Megatron's window is iterations start+1..end: an empty one is refused.
expect 0 2 "--profile-step-end" --profile --profile-step-start 3 --profile-step-end 3

# --- path flags: checked by writing, before iteration 1 ----------------------------------------
: > "$tmp/a_file"
mkdir -p "$tmp/empty"
expect 0 2 "--save /proc/weft-x: cannot create the directory" --save /proc/weft-x
expect 0 2 "--save $tmp/a_file: exists and is not a directory" --save "$tmp/a_file"
expect 0 2 "--load $tmp/none: no such directory" --load "$tmp/none"
expect 0 2 "--load $tmp/empty: holds no checkpoint" --load "$tmp/empty"
expect 0 2 "--load $tmp/empty: no checkpoint of iteration 5" --load "$tmp/empty" --ckpt-step 5
expect 0 2 "--log-jsonl /proc/weft-x/log.jsonl: cannot create its directory" \
  --log-jsonl /proc/weft-x/log.jsonl
expect 0 2 "--log-jsonl $tmp/empty: is a directory" --log-jsonl "$tmp/empty"

# --- several ranks: one line, exit 2, no MPI_Abort -----------------------------------------------
for np in 2 4; do
  expect "$np" 2 "--lr must be a finite number >= 0 (got nan)" --lr nan
  # Found by rank 0 alone (it alone writes the log), agreed before any collective.
  expect "$np" 2 "--log-jsonl /proc/weft-x/log.jsonl" --log-jsonl /proc/weft-x/log.jsonl
  expect "$np" 2 "--save /proc/weft-x" --save /proc/weft-x --global-batch-size 16
done
# With mpirun -q, stderr is that one line and nothing else.
cases=$((cases + 1))
"${mpirun[@]}" -q -np 2 "$weft" "${base[@]}" --lr nan >/dev/null 2>"$tmp/err"
rc=$?
if [ "$rc" -ne 2 ] || [ "$(grep -c . "$tmp/err")" -ne 1 ]; then
  echo "FAIL (mpirun -q -np 2 --lr nan): exit $rc, stderr:"; head -5 "$tmp/err"; fails=$((fails + 1))
else
  echo "ok   (mpirun -q -np 2, exit 2): stderr is one line: $(cat "$tmp/err")"
fi
# Found after collectives started, by every rank through one (a checkpoint of another model).
"${mpirun[@]}" -np 2 "$weft" "${base[@]}" --save "$tmp/ck" >/dev/null 2>&1 ||
  { echo "FAIL: the run that writes the checkpoint failed"; fails=$((fails + 1)); }
expect 2 2 "decoder.layers.2" --load "$tmp/ck" --num-layers 4

# A usage error on rank 1 only, in iteration 2 (rank 0 waits for it in a collective): rank 1
# waits 10 s for its peers in the error handler, then prints its line and aborts the job.
cases=$((cases + 1))
t0=$(date +%s)
WEFT_FAULT=train.usage_error:1:2:error timeout 120 "${mpirun[@]}" -np 2 -x WEFT_FAULT "$weft" \
  "${base[@]}" --pipeline-model-parallel-size 2 >"$tmp/out" 2>"$tmp/err"
rc=$?
t1=$(date +%s)
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q "train.usage_error: injected" "$tmp/err"; then
  echo "FAIL (one rank's usage error): exit $rc after $((t1 - t0)) s; stderr:"
  head -5 "$tmp/err"
  fails=$((fails + 1))
else
  echo "ok   (one rank's usage error at iteration 2: exit $rc after $((t1 - t0)) s, aborted)"
fi

[ "$fails" -eq 0 ] && echo "$cases passed, 0 failed" || { echo "$fails of $cases failed"; exit 1; }
