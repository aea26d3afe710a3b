#!/usr/bin/env bash
# Every GPU figure of docs/performance.md in one command, within a time budget (seconds, default
# 560): build, the CUDA tests at world 1, the checkpoint benchmark (weft vs raw disk vs
# torch.distributed.checkpoint), the 0.8B throughput benchmark (weft, PyTorch eager, compiled),
# the 125M one, then the 8-rank CUDA tests if time is left. Stages that would not fit are
# skipped and say so. Logs go to $LOGS (default /tmp/weft-gpu); $OUT gets a copy of the summary.
#   bash bench/gpu/all.sh [budget_s]
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${1:-560}
export OUT=${LOGS:-/tmp/weft-gpu}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=build-cuda
left() { echo $((BUDGET - SECONDS)); }
stage() {  # stage NAME NEED_S CMD...: runs CMD if NEED_S seconds are left
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "== $name: skipped ($(left) s left, needs ~$need)"; return; fi
  echo "== $name (t=${SECONDS}s)"
  if declare -F "$1" > /dev/null; then "$@"; else timeout "$(left)" "$@"; fi
}
tests_np() {
  export WEFT_TEST_DEVICE=cuda
  for t in "$@"; do
    timeout 240 mpirun -np "$NP" --bind-to none ./$B/tests/$t > "$OUT/t.log" 2>&1
    echo "$t np$NP rc=$? ok=$(grep -c 'OK \]' "$OUT/t.log") $(grep -E 'FAILED  \]|weft test:' "$OUT/t.log" | head -3)"
  done
}
stage build 200 bash bench/gpu/run.sh build | tail -2
NP=1 stage tests-np1 60 tests_np model/test_model checkpoint/test_checkpoint train/test_parity
stage ckpt 190 bash bench/gpu/run.sh ckpt
stage bench1b 260 bash bench/gpu/run.sh bench1b
stage bench125m 60 bash bench/gpu/run.sh bench125m
NP=8 stage tests-np8 100 tests_np train/test_parity checkpoint/test_checkpoint
echo "== done at ${SECONDS}s"
