#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs weft's main job on a small built-in default,
# the whole real-data path on 4 CPU ranks in a few minutes:
#   1. a corpus: the English fortunes of Debian's `fortunes` package (scripts/fortunes_corpus.sh)
#   2. a SentencePiece tokenizer trained on it     (weft data train-tokenizer)
#   3. Megatron .bin/.idx datasets                 (weft data preprocess --append-eod)
#   4. pretraining, pp 2 x dp 2, with the valid split evaluated every 100 iterations
#   5. a checkpoint, then a sample generated from it (weft generate)
#   6. its curves as runs/main/train.png (weft plot), TensorBoard files in runs/main/tensorboard
# Work files go to runs/main/. Extra arguments go to `weft train` (e.g. --train-iters 100).
# `bash scripts/run.sh --mock-data` runs the same training on mock data instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
W=./build/app/weft
R=runs/main
mkdir -p "$R"
MODEL=(--pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 --ffn-hidden-size 172
       --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 64 --micro-batch-size 2
       --global-batch-size 16 --train-iters 400 --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 10
       --lr-decay-style cosine --adam-beta2 0.95
       --eval-interval 100 --eval-iters 4 --log-interval 50)
for a in "$@"; do
  if [ "$a" = --mock-data ]; then
    exec mpirun -np 4 --bind-to none $W train "${MODEL[@]}" --vocab-size 128 "$@"
  fi
done

if [ ! -s "$R/fortunes.txt" ]; then
  bash scripts/fortunes_corpus.sh "$R/fortunes.txt"
fi
if [ ! -s "$R/tokenizer.model" ]; then
  $W data train-tokenizer --input "$R/fortunes.txt" --vocab-size 1024 --output-prefix "$R/tokenizer"
fi
if [ ! -s "$R/fortunes_text_document.idx" ]; then
  $W data preprocess --input "$R/fortunes.txt" --output-prefix "$R/fortunes" \
    --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$R/tokenizer.model" --append-eod \
    --workers 2 --log-interval 100000
fi
rm -rf "$R/checkpoints" "$R/tensorboard" "$R/train.jsonl"
mpirun -np 4 --bind-to none $W train "${MODEL[@]}" \
  --data-path "$R/fortunes_text_document" --split 949,50,1 \
  --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$R/tokenizer.model" \
  --save "$R/checkpoints" --log-jsonl "$R/train.jsonl" --tensorboard-dir "$R/tensorboard" "$@"
$W plot "$R/train.jsonl" -o "$R/train.png" --title "weft main job (scripts/run.sh)"
PROMPT="The secret of life is"
echo "weft generate, prompt: \"$PROMPT\" (the prompt, then its continuation):"
printf '%s' "$PROMPT"  # weft generate prints the continuation alone
$W generate --load "$R/checkpoints" --tokenizer-type GPTSentencePieceTokenizer \
  --tokenizer-model "$R/tokenizer.model" --prompt "$PROMPT" --max-new-tokens 48 \
  --temperature 0.8 --top-p 0.9 --seed 7
