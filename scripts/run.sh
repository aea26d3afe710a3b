#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs weft's main job on a small built-in default.
# Extra arguments are passed to the job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
./build/app/weft mesh --world-size 8 --pipeline-model-parallel-size 2 \
  --expert-model-parallel-size 2 "$@"
