#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs weft's main job on a small built-in default:
# a pretraining run on 4 CPU ranks (pp 2 x dp 2) over mock data. Extra arguments go to
# `weft train` (e.g. --train-iters 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpirun -np 4 --bind-to none ./build/app/weft train --pipeline-model-parallel-size 2 \
  --num-layers 4 --hidden-size 64 --ffn-hidden-size 172 --num-attention-heads 4 \
  --num-query-groups 2 --seq-length 64 --vocab-size 128 --micro-batch-size 2 \
  --global-batch-size 16 --train-iters 30 --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 3 "$@"
