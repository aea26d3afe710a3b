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
  cmake --build $B -j 16 --target weft test_parity test_checkpoint test_model test_communicator ${WEFT_EXTRA_TARGETS:-} > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
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
# extra stages used while debugging on the GPU machine
for stage in "$@"; do
case $stage in
gdbckpt)
  WEFT_TEST_DEVICE=cuda timeout 300 ./$B/tests/checkpoint/test_checkpoint \
    --gtest_filter='*fp32_moments*' 2>&1 | grep -vE "^\[New Thread|^\[Thread" | tail -40
  ;;
bench125m)
  S=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --num-query-groups 12
     --ffn-hidden-size 2048 --vocab-size 32000 --seq-length 1024)
  rm -f "$OUT/weft_125m.jsonl"
  ./$B/app/weft train --device cuda --bf16 "${S[@]}" --micro-batch-size 8 --global-batch-size 8 \
    --train-iters 20 --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$OUT/weft_125m.jsonl" > "$OUT/weft_125m.log" 2>&1
  echo "weft 125m rc=$?"
  M=(--layers 12 --hidden 768 --heads 12 --groups 12 --ffn 2048 --vocab 32000 --seq 1024)
  python3 bench/gpu/mfu.py --weft-jsonl "$OUT/weft_125m.jsonl" "${M[@]}"
  timeout 200 python3 bench/gpu/pytorch_llama.py "${M[@]}" --mbs 8 --steps 20 --warmup 5 > "$OUT/pt125m.json" 2> "$OUT/pt125m.err"
  echo "pytorch 125m eager: $(cat "$OUT/pt125m.json")"
  TPS=$(python3 -c "import json;print(json.load(open('$OUT/pt125m.json'))['tokens_per_sec'])" 2>/dev/null) \
    && python3 bench/gpu/mfu.py "$TPS" "${M[@]}"
  ;;
weft1b)
  rm -f "$OUT/weft_1b.jsonl"
  ./$B/app/weft train --device cuda --bf16 "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 \
    --train-iters 12 --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$OUT/weft_1b.jsonl" > "$OUT/weft_1b.log" 2>&1
  echo "weft rc=$?"; tail -1 "$OUT/weft_1b.log" | cut -c1-400
  python3 bench/gpu/mfu.py --weft-jsonl "$OUT/weft_1b.jsonl"
  ;;
esac
done
