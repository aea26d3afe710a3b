#!/usr/bin/env bash
# GPU machine driver (docs/gpu.md): builds weft against PyTorch's CMake package with CUDA and
# NCCL, then runs one of the stages below; output under $OUT (or ./out).
#   bash bench/gpu/run.sh build       configure + build (Release, CUDA)
#   bash bench/gpu/run.sh tests       the engine and checkpoint tests on CUDA: world 1, and
#                                     8 ranks sharing the GPU over the MPI backend
#   bash bench/gpu/run.sh bench1b     weft on the ~0.8B model, then PyTorch eager and compiled
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=/opt/torch/.venv/bin:$PATH
P=/opt/torch/.venv/lib/python3.12/site-packages
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
B=build-cuda
MODEL=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --num-query-groups 8
       --ffn-hidden-size 5632 --vocab-size 32000 --seq-length 4096)

for stage in "$@"; do
case $stage in
build)
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_BUILD_BENCH=ON \
    -DCMAKE_PREFIX_PATH=$P/torch/share/cmake \
    -DNCCL_INCLUDE_DIR=$P/nvidia/nccl/include -DNCCL_LIBRARY=$P/nvidia/nccl/lib/libnccl.so.2 \
    > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build $B -j 16 > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
  ./$B/app/weft --version
  ;;
tests)
  export WEFT_TEST_DEVICE=cuda
  for t in tests/train/test_parity tests/checkpoint/test_checkpoint tests/model/test_model; do
    for np in 1 8; do
      [ "$t" = tests/model/test_model ] && [ $np = 8 ] && continue
      mpirun -np $np --bind-to none ./$B/$t > "$OUT/$(basename $t)_np$np.log" 2>&1
      echo "$t np$np rc=$? $(grep -E 'PASSED|FAILED' "$OUT/$(basename $t)_np$np.log" | sort | uniq -c | tr '\n' ' ')"
    done
  done
  ;;
bench1b)
  rm -f "$OUT/weft_1b.jsonl"
  ./$B/app/weft train --device cuda --bf16 "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 \
    --train-iters 12 --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$OUT/weft_1b.jsonl" > "$OUT/weft_1b.log" 2>&1
  echo "weft rc=$?"; grep -E "parameters|bytes on" "$OUT/weft_1b.log"; tail -2 "$OUT/weft_1b.log" | cut -c1-400
  python3 bench/gpu/mfu.py --weft-jsonl "$OUT/weft_1b.jsonl" | tee "$OUT/weft_1b_mfu.json"
  for mode in "" --compile; do
    timeout 400 python3 bench/gpu/pytorch_llama.py $mode > "$OUT/pt$mode.json" 2> "$OUT/pt$mode.err"
    echo "pytorch $mode rc=$?: $(cat "$OUT/pt$mode.json")"; tail -3 "$OUT/pt$mode.err"
    TPS=$(python3 -c "import json;print(json.load(open('$OUT/pt$mode.json'))['tokens_per_sec'])" 2>/dev/null) \
      && python3 bench/gpu/mfu.py "$TPS"
  done
  ;;
esac
done
