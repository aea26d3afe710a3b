#!/usr/bin/env bash
# `weft plot` as a user meets it: two real --log-jsonl runs (different learning rates, with
# validation lines) plotted into one PNG of the requested size (the PNG signature and the
# IHDR width and height read back); bad input exits 2 naming the file; without gnuplot on PATH
# it refuses with one line saying so.
# Usage: plot_cmd.sh WEFT
source "$(dirname "$0")/lib.sh" "$@"
model=(--threads 1 --num-layers 2 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --seq-length 16 --vocab-size 64 --micro-batch-size 2
       --global-batch-size 4 --train-iters 6 --eval-interval 3 --eval-iters 1)
for lr in 1e-3 3e-3; do
  "$weft" train "${model[@]}" --lr $lr --log-jsonl "$tmp/lr$lr.jsonl" >"$tmp/train.log" 2>&1 ||
    { echo "FAIL: weft train --lr $lr"; tail -5 "$tmp/train.log"; exit 1; }
done
u32() { od -An -tu1 -j"$2" -N4 "$1" | awk '{print $1*16777216 + $2*65536 + $3*256 + $4}'; }

"$weft" plot "$tmp/lr1e-3.jsonl" "$tmp/lr3e-3.jsonl" -o "$tmp/runs.png" --width 640 --height 480 \
  >"$tmp/plot.log" 2>&1
check "plot of two runs: exit code" "$?" 0
check "PNG signature" "$(od -An -tx1 -N8 "$tmp/runs.png" 2>/dev/null | tr -d ' \n')" 89504e470d0a1a0a
check "IHDR chunk" "$(od -An -c -j12 -N4 "$tmp/runs.png" 2>/dev/null | tr -d ' \n')" IHDR
check "width" "$(u32 "$tmp/runs.png" 16)" 640
check "height" "$(u32 "$tmp/runs.png" 20)" 480
# --multiple-validation-sets lines (one per set, "valid_set"): one validation curve per set.
{ grep -v valid_lm_loss "$tmp/lr1e-3.jsonl"
  for it in 3 6; do for set in wiki code; do
    printf '{"iteration": %s, "valid_set": "%s", "valid_lm_loss": 4.%s, "valid_lm_loss_ppl": 60}\n' \
      $it $set $it
  done; done; } >"$tmp/sets.jsonl"
"$weft" plot "$tmp/sets.jsonl" -o "$tmp/sets.png" >"$tmp/plot.log" 2>&1
check "plot of validation sets: exit code" "$?" 0
check "validation sets: PNG signature" "$(od -An -tx1 -N8 "$tmp/sets.png" 2>/dev/null | tr -d ' \n')" \
  89504e470d0a1a0a

bad() {  # bad WHAT NEEDLE ARGS...: exit 2 and a message containing NEEDLE
  local what=$1 needle=$2
  shift 2
  PATH=${WEFT_PATH:-$PATH} "$weft" plot "$@" -o "$tmp/bad.png" >"$tmp/bad.out" 2>"$tmp/bad.err"
  check "$what: exit code" "$?" 2
  grep -qF -- "$needle" "$tmp/bad.err" && echo "ok   $what: names $needle" ||
    { echo "FAIL $what: '$needle' not in: $(cat "$tmp/bad.err")"; fails=$((fails + 1)); }
  [ ! -e "$tmp/bad.png" ] || { echo "FAIL $what: wrote a PNG"; fails=$((fails + 1)); }
}
bad "missing file" "$tmp/none.jsonl" "$tmp/lr1e-3.jsonl" "$tmp/none.jsonl"
printf '{"iteration": 1, "lm_loss": 3.5}\nnot json\n' >"$tmp/broken.jsonl"
bad "invalid JSON" "$tmp/broken.jsonl: line 2" "$tmp/broken.jsonl"
echo '{"loss": 3}' >"$tmp/other.jsonl"
bad "no iteration key" "$tmp/other.jsonl: line 1" "$tmp/other.jsonl"
: >"$tmp/empty.jsonl"
bad "empty file" "$tmp/empty.jsonl" "$tmp/empty.jsonl"
bad "bad width" "--width" "$tmp/lr1e-3.jsonl" --width 5
WEFT_PATH=/nonexistent bad "no gnuplot" "gnuplot" "$tmp/lr1e-3.jsonl"

# An output in a missing directory: one line naming --output, and no image bytes on stdout
# (gnuplot writes its PNG to stdout where `set output` fails).
"$weft" plot "$tmp/lr1e-3.jsonl" -o "$tmp/no/such/dir.png" >"$tmp/nodir.out" 2>"$tmp/nodir.err"
check "missing output directory: exit code" "$?" 2
check "missing output directory: stdout bytes" "$(wc -c <"$tmp/nodir.out")" 0
grep -qF -- "--output $tmp/no/such/dir.png" "$tmp/nodir.err" && echo "ok   names --output" ||
  { echo "FAIL: --output not named in: $(cat "$tmp/nodir.err")"; fails=$((fails + 1)); }

# Skipped iterations write null (their NaN grad norm): a run whose lm loss and grad norm are all
# null still plots, the empty panels marked.
printf '%s\n' '{"iteration": 1, "lm_loss": null, "grad_norm": null, "lr": 1e-3, "tokens_per_sec": 5}' \
  '{"iteration": 2, "lm_loss": null, "grad_norm": null, "lr": 2e-3, "tokens_per_sec": 6}' \
  >"$tmp/nulls.jsonl"
"$weft" plot "$tmp/nulls.jsonl" -o "$tmp/nulls.png" >"$tmp/nulls.log" 2>&1
check "all-null columns: exit code" "$?" 0
check "all-null columns: PNG signature" "$(od -An -tx1 -N8 "$tmp/nulls.png" 2>/dev/null | tr -d ' \n')" \
  89504e470d0a1a0a

finish
