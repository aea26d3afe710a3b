#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite through CTest,
# multi-rank tests included (under mpirun, as root too).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd build && ctest --output-on-failure "$@"
