#!/usr/bin/env bash
# GPU machine driver (docs/gpu.md): builds weft against PyTorch's CMake package with CUDA and
# NCCL, then runs one of the stages below; output under $OUT (or ./out).
#   bash bench/gpu/run.sh build       configure + build (Release, CUDA)
#   bash bench/gpu/run.sh tests       the engine and checkpoint tests on CUDA: world 1, and
#                                     8 ranks sharing the GPU over the MPI backend
#   bash bench/gpu/run.sh bench1b     weft on the ~0.8B model, then PyTorch eager and compiled
#   bash bench/gpu/run.sh bench125m   the same at ~125M (weft and PyTorch eager)
#   bash bench/gpu/run.sh curve       size curve: weft, PyTorch eager and compiled at ~125M, 0.8B,
#                                     ~1.5B and ~3B; one table at the end (bench/gpu/curve_table.py)
#   bash bench/gpu/run.sh profile     Kineto traces of weft's 0.8B and 125M steps, summarised
#   bash bench/gpu/run.sh profcurve   profile summaries at every size-curve shape ($OUT/profcurve.txt)
#   bash bench/gpu/run.sh steady      bench1b's 0.8B step: every iteration's wall time and a trace of 8-12
#                                     (device busy and idle per step, the gaps) ($OUT/steady.txt)
#   bash bench/gpu/run.sh ckpt        checkpoint save/load of the 0.8B state on the GPU vs raw
#                                     disk (bench_checkpoint) and vs torch.distributed.checkpoint
#   bash bench/gpu/run.sh moe         weft on the ~1B MoE model (8 experts, top-2), then PyTorch
#                                     with a loop over experts and with torch._grouped_mm
#   bash bench/gpu/run.sh recompute   activation recomputation: its tests on CUDA, then weft and PyTorch
#                                     with and without it at the 0.8B and 3B curve shapes
#   bash bench/gpu/run.sh moetests    the MoE/EP/MTP tests on CUDA: world 1 and 8 ranks
#   bash bench/gpu/run.sh hybrid      weft on the ~1B hybrid Mamba-2 model, then PyTorch eager
#                                     (the chunked SSD in torch ops) and torch.compile
#   bash bench/gpu/run.sh hfmamba     weft's Mamba-2 mixer against transformers' Mamba2Mixer
#   bash bench/gpu/run.sh profhyb     a Kineto trace of weft's hybrid step, summarised
#   bash bench/gpu/run.sh hfcheck     Hugging Face export/import against transformers'
#                                     LlamaForCausalLM (docs/hf-interop.md)
#   bash bench/gpu/run.sh hfnemo      a Nemotron 3 shaped hybrid exported as NemotronH against
#                                     transformers' NemotronHForCausalLM (docs/hf-interop.md)
#   bash bench/gpu/run.sh hfrope      Llama 3 RoPE scaling (--use-rope-scaling) and a head dim
#                                     other than hidden / heads (--kv-channels) against
#                                     transformers (docs/hf-interop.md)
#   bash bench/gpu/run.sh hfqwen      random Qwen2, Qwen3-MoE and Mixtral models and transformers' losses,
#                                     for weft's imports (tests/gpu/hf_qwen_check.py; needs no build)
#   bash bench/gpu/run.sh hfqwenexp   transformers loads weft's exports of those imports (made here by
#                                     `hf_qwen_check.py check --export-dir .hfexport`, carried along)
#   bash bench/gpu/run.sh hftok       GPT2BPETokenizer and HuggingFaceTokenizer against transformers'
#                                     AutoTokenizer (tests/gpu/hf_tokenizer_check.py)
#   bash bench/gpu/run.sh tiktok      TikTokenizer against the tiktoken library, as Megatron builds
#                                     it (tests/gpu/tiktoken_check.py)
#   bash bench/gpu/run.sh tbcheck     --tensorboard-dir files read by TensorBoard's
#                                     EventAccumulator against the jsonl (tests/gpu/tb_check.py)
set -uo pipefail
cd "$(dirname "$0")/../.."
# The same CUDA PyTorch detection as scripts/setup.sh (WEFT_PYTHON picks the interpreter).
source scripts/detect_torch.sh
weft_detect_torch
weft_cmake_args
PY=${WEFT_PYTHON:-$(command -v python3)}
python3() { "$PY" "$@"; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
B=build-cuda
MOE=(--num-layers 14 --hidden-size 1024 --num-attention-heads 16 --group-query-attention --num-query-groups 8
     --ffn-hidden-size 2816 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 2816
     --moe-aux-loss-coeff 0.01 --vocab-size 32000 --seq-length 4096)
MOE_MFU=(--layers 14 --hidden 1024 --heads 16 --groups 8 --num-experts 8 --topk 2 --moe-ffn 2816
         --vocab 32000 --seq 4096)
HYB_PATTERN="M-M-M*-M-M-M*-M-M-M*-M-M-M*-M-M-M*-"
HYB=(--hybrid-layer-pattern "$HYB_PATTERN" --hidden-size 2048 --num-attention-heads 16
     --group-query-attention --num-query-groups 8 --ffn-hidden-size 5632 --vocab-size 32000 --seq-length 4096)
HYB_MFU=(--pattern "$HYB_PATTERN" --hidden 2048 --heads 16 --groups 8 --ffn 5632 --vocab 32000
         --seq 4096 --state 128 --head-dim 64 --mamba-groups 8 --chunk 128)
MODEL=(--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 5632 --vocab-size 32000 --seq-length 4096)
# The size curve's Llama shapes (docs/performance.md "Size curve"; vocab 32000, seq 4096, tied):
# TAG -> layers hidden heads groups ffn micro-batch. The micro-batch is the largest power of two
# whose `weft plan` peak is <= ~75 GiB, so that eager PyTorch (~1.6x weft's activations) fits
# the H200 at the same tokens per step.
curve_shape() {
  case $1 in
    125m) echo 12 768 12 12 2048 16 ;;   # 109.5 M parameters, plan 27.9 GiB
    0.8b) echo 16 2048 16 8 5632 8 ;;    # 820.6 M, plan 48.5 GiB
    1.5b) echo 20 2560 20 4 6912 8 ;;    # 1.458 B, plan 74.0 GiB
    3b)   echo 28 3072 24 8 8192 4 ;;    # 2.917 B, plan 89.6 GiB (eager measured 110 GiB)
    *) return 1 ;;
  esac
}
# curve_run TAG IMPL LIMIT_S COMMAND...: runs COMMAND (stdout to $C/TAG.IMPL.out, stderr .err)
# under `timeout` of LIMIT_S cut to what is left before $curve_deadline; writes its exit status to
# TAG.IMPL.rc ("skipped" when under 20 s are left) and rewrites $C/table.md.
curve_run() {
  local tag=$1 impl=$2 limit=$3; shift 3
  local left=$((curve_deadline - SECONDS)) rc
  if [ $left -lt 20 ]; then
    echo skipped > "$C/$tag.$impl.rc"; echo "curve $tag $impl: skipped (${left}s left)"
  else
    [ $limit -gt $left ] && limit=$left
    local t0=$SECONDS
    timeout -k 10 $limit "$@" > "$C/$tag.$impl.out" 2> "$C/$tag.$impl.err"
    rc=$?; echo $rc > "$C/$tag.$impl.rc"
    echo "curve $tag $impl rc=$rc in $((SECONDS - t0))s (limit ${limit}s)"
    [ $rc = 0 ] || tail -2 "$C/$tag.$impl.err" | cut -c1-300
  fi
  "$PY" bench/gpu/curve_table.py "$C" $CURVE_SIZES > "$C/table.md" 2>&1
}

for stage in "$@"; do
case $stage in
build)
  [ "$WEFT_CUDA" = 1 ] || { echo "no CUDA PyTorch found (set WEFT_PYTHON)"; exit 1; }
  echo "torch $WEFT_TORCH_VERSION from $WEFT_PYTHON"
  # WEFT_PROTOBUF_PREFIX: an unpacked protobuf (scripts/protobuf_prefix.sh) where the machine
  # has no libprotobuf-dev; without any, --tensorboard-dir is refused.
  [ -n "${WEFT_PROTOBUF_PREFIX:-}" ] && export LD_LIBRARY_PATH=$WEFT_PROTOBUF_PREFIX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_BUILD_BENCH=ON "${WEFT_CMAKE_ARGS[@]}" \
    ${WEFT_PROTOBUF_PREFIX:+"-DCMAKE_PREFIX_PATH=$WEFT_TORCH_CMAKE;$WEFT_PROTOBUF_PREFIX"} \
    > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build $B -j 16 --target weft test_parity test_checkpoint test_model test_communicator bench_checkpoint test_moe test_moe_parity test_moe_checkpoint test_mamba test_optim test_recompute test_trainer_units ${WEFT_EXTRA_TARGETS:-} -- -k 0 > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
  ./$B/app/weft --version
  ;;
tests)
  export WEFT_TEST_DEVICE=cuda
  # The optimizer on CUDA: the fused AdamW, its device-side skip and clipping multiplier.
  mpirun -np 1 --bind-to none ./$B/tests/optim/test_optim > "$OUT/test_optim.log" 2>&1
  echo "tests/optim/test_optim rc=$? $(grep -E 'PASSED|FAILED' "$OUT/test_optim.log" | sort | uniq -c | tr '\n' ' ')"
  # CUDA graphs: replays equal the eager steps bit for bit (float32 and bf16 gradients).
  mpirun -np 1 --bind-to none ./$B/tests/train/test_trainer_units --gtest_filter='CudaGraph.*' \
    > "$OUT/test_trainer_units.log" 2>&1
  echo "tests/train/test_trainer_units CudaGraph.* rc=$? $(grep -E 'PASSED|FAILED' "$OUT/test_trainer_units.log" | sort | uniq -c | tr '\n' ' ')"
  for t in tests/train/test_parity tests/checkpoint/test_checkpoint tests/model/test_model; do
    for np in 1 8; do
      [ "$t" = tests/model/test_model ] && [ $np = 8 ] && continue
      mpirun -np $np --bind-to none ./$B/$t > "$OUT/$(basename $t)_np$np.log" 2>&1
      echo "$t np$np rc=$? $(grep -E 'PASSED|FAILED' "$OUT/$(basename $t)_np$np.log" | sort | uniq -c | tr '\n' ' ')"
    done
  done
  ;;
bench1b)  # weft with float32 gradients (Megatron's default), then with --grad-reduce-in-bf16
  for g in "" --grad-reduce-in-bf16; do
    w=weft_1b${g:+_gradbf16}
    rm -f "$OUT/$w.jsonl"
    ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 \
      --train-iters 12 --lr 3e-4 --lr-warmup-iters 2 $g --log-jsonl "$OUT/$w.jsonl" > "$OUT/$w.log" 2>&1
    echo "weft $g rc=$?"; grep -E "parameters|bytes on" "$OUT/$w.log"; tail -2 "$OUT/$w.log" | cut -c1-400
    python3 bench/gpu/mfu.py --weft-jsonl "$OUT/$w.jsonl" | tee "$OUT/${w}_mfu.json"
  done
  # BENCH1B_MODES: the PyTorch baselines, eager ("eager") and torch.compile ("--compile").
  for mode in ${BENCH1B_MODES:-eager --compile}; do
    [ "$mode" = eager ] && mode=""
    timeout 400 python3 bench/gpu/pytorch_llama.py $mode > "$OUT/pt$mode.json" 2> "$OUT/pt$mode.err"
    echo "pytorch $mode rc=$?: $(cat "$OUT/pt$mode.json")"; tail -3 "$OUT/pt$mode.err"
    TPS=$(python3 -c "import json;print(json.load(open('$OUT/pt$mode.json'))['tokens_per_sec'])" 2>/dev/null) \
      && python3 bench/gpu/mfu.py "$TPS"
  done
  ;;
moe)
  for g in --moe-grouped-gemm ""; do
    rm -f "$OUT/weft_moe$g.jsonl"
    ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${MOE[@]}" $g --micro-batch-size 2 --global-batch-size 2 \
      --train-iters 12 --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$OUT/weft_moe$g.jsonl" > "$OUT/weft_moe$g.log" 2>&1
    echo "weft moe $g rc=$?"; grep -E "parameters|state:" "$OUT/weft_moe$g.log"; tail -1 "$OUT/weft_moe$g.log" | cut -c1-420
    python3 bench/gpu/mfu.py --weft-jsonl "$OUT/weft_moe$g.jsonl" "${MOE_MFU[@]}"
  done
  for mode in "--experts loop" "--experts grouped" "--experts grouped --compile"; do
    tag=$(echo $mode | tr -d ' -')
    timeout 300 python3 bench/gpu/pytorch_moe.py $mode > "$OUT/pt_$tag.json" 2> "$OUT/pt_$tag.err"
    echo "pytorch $mode rc=$?: $(cat "$OUT/pt_$tag.json")"; tail -2 "$OUT/pt_$tag.err"
    TPS=$(python3 -c "import json;print(json.load(open('$OUT/pt_$tag.json'))['tokens_per_sec'])" 2>/dev/null) \
      && python3 bench/gpu/mfu.py "$TPS" "${MOE_MFU[@]}"
  done
  ;;
hybrid)
  rm -f "$OUT/weft_hyb.jsonl"
  ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${HYB[@]}" --micro-batch-size 2 --global-batch-size 2 \
    --train-iters 12 --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$OUT/weft_hyb.jsonl" > "$OUT/weft_hyb.log" 2>&1
  echo "weft hybrid rc=$?"; grep -E "parameters|bytes on" "$OUT/weft_hyb.log"; tail -1 "$OUT/weft_hyb.log" | cut -c1-400
  python3 bench/gpu/mfu.py --weft-jsonl "$OUT/weft_hyb.jsonl" "${HYB_MFU[@]}"
  for m in ${HYB_MODES:-eager compile}; do
    mode=""; [ "$m" = compile ] && mode=--compile
    timeout ${HYB_PT_TIMEOUT:-300} python3 bench/gpu/pytorch_hybrid.py --pattern "$HYB_PATTERN" $mode > "$OUT/pth_$m.json" 2> "$OUT/pth_$m.err"
    echo "pytorch hybrid $m rc=$?: $(cat "$OUT/pth_$m.json")"; tail -2 "$OUT/pth_$m.err"
    TPS=$(python3 -c "import json;print(json.load(open('$OUT/pth_$m.json'))['tokens_per_sec'])" 2>/dev/null) \
      && python3 bench/gpu/mfu.py "$TPS" "${HYB_MFU[@]}"
  done
  ;;
hfmamba)
  WEFT_MAMBA_DUMP="$OUT/mamba_case.safetensors" ./$B/tests/model/test_mamba --gtest_filter='*Dump*' > "$OUT/dump.log" 2>&1
  echo "dump rc=$?"
  python3 tests/gpu/hf_mamba2_check.py "$OUT/mamba_case.safetensors"; echo "hf_mamba2_check rc=$?"
  ;;
hfcheck)
  # Tiny Llama shapes, fp32 on CUDA. (1) weft's iteration-3 loss against transformers on the
  # export of the iteration-2 checkpoint; (2) a random LlamaForCausalLM imported and fine-tuned
  # one iteration on 1 rank and on pp2 x dp2 (4 ranks sharing the GPU over MPI).
  H="$OUT/hf"; rm -rf "$H"; mkdir -p "$H"
  HFT=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 4
       --ffn-hidden-size 704 --vocab-size 1024 --seq-length 128 --micro-batch-size 2
       --global-batch-size 8 --lr 1e-3 --device cuda --deterministic --mock-data)
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" --train-iters 2 --save "$H/ck" > "$H/train.log" 2>&1
  echo "train rc=$?"
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" --train-iters 3 --load "$H/ck" --dump-first-batch "$H/b3.npy" \
    --log-jsonl "$H/resume.jsonl" > "$H/resume.log" 2>&1
  echo "resume rc=$?"
  ./$B/app/weft ckpt export --format hf "$H/ck" "$H/export"; echo "export rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/export" "$H/b3.npy" "$H/resume.jsonl" 3
  echo "hf_llama_check export rc=$?"
  python3 tests/gpu/hf_llama_check.py make "$H/random" --hidden 256 --ffn 704 --layers 4 \
    --heads 8 --groups 4 --vocab 1024 --seq 128; echo "make rc=$?"
  ./$B/app/weft ckpt import --format hf "$H/random" "$H/imported"; echo "import rc=$?"
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" --train-iters 1 --load "$H/imported" --finetune \
    --dump-first-batch "$H/b1.npy" --log-jsonl "$H/ft1.jsonl" > "$H/ft1.log" 2>&1
  echo "finetune np1 rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/random" "$H/b1.npy" "$H/ft1.jsonl" 1
  echo "hf_llama_check import np1 rc=$?"
  mpirun -np 4 --bind-to none ./$B/app/weft train --log-interval 1 "${HFT[@]}" --pipeline-model-parallel-size 2 \
    --train-iters 1 --load "$H/imported" --finetune --dump-first-batch "$H/b1p.npy" \
    --log-jsonl "$H/ft4.jsonl" > "$H/ft4.log" 2>&1
  echo "finetune pp2xdp2 rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/random" "$H/b1p.npy" "$H/ft4.jsonl" 1
  echo "hf_llama_check import pp2xdp2 rc=$?"
  ;;
hfnemo)
  # A Nemotron 3 shaped hybrid (Mamba, squared-ReLU MLP, attention without positions, MoE with
  # the sigmoid router, a scaling factor, a shared expert and trained expert biases), fp32 on
  # CUDA: weft's iteration-3 loss against transformers' NemotronHForCausalLM on the export of
  # the iteration-2 checkpoint. Sequences of 64 stay within one SSD chunk (transformers' PyTorch
  # scan summed the inter-chunk states over the wrong axis in some versions; docs/hf-interop.md).
  H="$OUT/hfnemo"; rm -rf "$H"; mkdir -p "$H"
  NT=(--hybrid-layer-pattern "M-*EM-E*" --squared-relu --position-embedding-type none
      --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 4 --ffn-hidden-size 512
      --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 256
      --moe-shared-expert-intermediate-size 128 --moe-router-score-function sigmoid
      --moe-router-topk-scaling-factor 2.5 --moe-router-enable-expert-bias
      --moe-router-bias-update-rate 0.01 --mamba-state-dim 16 --mamba-head-dim 32
      --mamba-num-groups 2 --untie-embeddings-and-output-weights --vocab-size 1024
      --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --device cuda
      --deterministic --mock-data)
  ./$B/app/weft train --log-interval 1 "${NT[@]}" --train-iters 2 --save "$H/ck" > "$H/train.log" 2>&1
  echo "train rc=$?"
  ./$B/app/weft train --log-interval 1 "${NT[@]}" --train-iters 3 --load "$H/ck" \
    --dump-first-batch "$H/b3.npy" --log-jsonl "$H/resume.jsonl" > "$H/resume.log" 2>&1
  echo "resume rc=$?"
  ./$B/app/weft ckpt export --format hf "$H/ck" "$H/export"; echo "export rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/export" "$H/b3.npy" "$H/resume.jsonl" 3
  echo "hf_llama_check nemotron_h export rc=$?"
  ;;
hftok)
  # Three byte-level BPE tokenizers trained by the tokenizers library (GPT-2's, Llama 3's and
  # Qwen's pipelines) and weft's encoding of a multilingual text set compared token by token
  # with AutoTokenizer's. Needs no GPU, only transformers (docs/data-format.md has the figures).
  # Phase 1 only where weft was built without ICU (the docstring says how to finish).
  w=./$B/app/weft
  grep -q "^ICU_INCLUDE_DIR:PATH=/" $B/CMakeCache.txt 2>/dev/null || w=-
  python3 tests/gpu/hf_tokenizer_check.py "$w" "$OUT/hftok"
  echo "hf_tokenizer_check rc=$?"
  # The device returns at most 8 files, 2 folders down: one tar ($OUT/hftok.tar) to unpack here.
  if [ "$w" = - ]; then tar -C "$OUT" -cf "$OUT/hftok.tar" hftok && rm -rf "$OUT/hftok"; fi
  ;;
hfqwen)
  # Phase 1 of tests/gpu/hf_qwen_check.py: the models and transformers' losses under
  # $OUT/hfqwen; phase 2 (`check`) runs where weft is built (docs/hf-interop.md has the figures).
  python3 tests/gpu/hf_qwen_check.py reference "$OUT/hfqwen"
  echo "hf_qwen_check reference rc=$?"
  # The device returns at most 8 files of 16 MiB: a tar in 15 MiB parts; here
  # `cat hfqwen.tar.* | tar -xf -` gives back the folder.
  tar -C "$OUT" -cf - hfqwen | split -b 15M - "$OUT/hfqwen.tar." && rm -rf "$OUT/hfqwen"
  ;;
hfqwenexp)
  # Phase 3 of tests/gpu/hf_qwen_check.py: transformers reads weft's exports, made here by
  # `check --export-dir .hfexport` and carried along (run's carry: [".hfexport"]).
  python3 tests/gpu/hf_qwen_check.py exported "${WEFT_HF_EXPORT_DIR:-.hfexport}"
  echo "hf_qwen_check exported rc=$?"
  ;;
tiktok)
  # TikTokenizer against the tiktoken library, built as Megatron's TikTokenizer builds it
  # (tests/gpu/tiktoken_check.py); needs no GPU, only tiktoken.
  # Phase 1 only where weft was built without ICU (tests/gpu/tiktoken_check.py).
  w=./$B/app/weft
  grep -q "^ICU_INCLUDE_DIR:PATH=/" $B/CMakeCache.txt 2>/dev/null || w=-
  python3 tests/gpu/tiktoken_check.py "$w" "$OUT/tiktok"
  echo "tiktoken_check rc=$?"
  ;;
hfrope)
  # Llama 3's RoPE scaling (--use-rope-scaling) against transformers' llama3 rope_type, the
  # hfcheck shapes at head dim 32 and base 500000 (wavelengths 6 to 1.4e6 positions: pairs in
  # every band of the scaling), q and k weights 8x the initialisation's so that the positions
  # matter to the loss: (1) a random LlamaForCausalLM with factor 32 imported and fine-tuned one
  # iteration (saved), its loss against transformers', then against transformers with the
  # scaling dropped (must fail); (2) weft's export of that iteration-1 checkpoint against the
  # resumed iteration-2 loss, with and without the scaling; (3) the import fine-tuned without
  # the scaling flags (refused).
  H="$OUT/hfrope"; rm -rf "$H"; mkdir -p "$H"
  HFT=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 4
       --ffn-hidden-size 704 --vocab-size 1024 --seq-length 128 --micro-batch-size 2
       --global-batch-size 8 --lr 1e-3 --device cuda --deterministic --mock-data)
  ROPE=(--rotary-base 500000 --use-rope-scaling --rope-scaling-factor 32)
  python3 tests/gpu/hf_llama_check.py make "$H/random" --hidden 256 --ffn 704 --layers 4 \
    --heads 8 --groups 4 --vocab 1024 --seq 128 --rotary-base 500000 --rope-scaling-factor 32 \
    --qk-gain 8 2>/dev/null
  echo "make rc=$?"
  ./$B/app/weft ckpt import --format hf "$H/random" "$H/imported"; echo "import rc=$?"
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" "${ROPE[@]}" --train-iters 1 --load "$H/imported" --finetune \
    --save "$H/ft" --dump-first-batch "$H/b1.npy" --log-jsonl "$H/ft1.jsonl" > "$H/ft1.log" 2>&1
  echo "finetune rc=$?"
  for drop in "" --drop-rope-scaling; do
    python3 tests/gpu/hf_llama_check.py loss "$H/random" "$H/b1.npy" "$H/ft1.jsonl" 1 $drop 2>/dev/null
    echo "hf_llama_check import $drop rc=$? (pass 0; with the scaling dropped 1)"
  done
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" "${ROPE[@]}" --train-iters 2 --load "$H/ft" \
    --dump-first-batch "$H/b2.npy" --log-jsonl "$H/resume.jsonl" > "$H/resume.log" 2>&1
  echo "resume rc=$?"
  ./$B/app/weft ckpt export --format hf "$H/ft" "$H/export"; echo "export rc=$?"
  for drop in "" --drop-rope-scaling; do
    python3 tests/gpu/hf_llama_check.py loss "$H/export" "$H/b2.npy" "$H/resume.jsonl" 2 $drop 2>/dev/null
    echo "hf_llama_check export $drop rc=$? (pass 0; with the scaling dropped 1)"
  done
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" --train-iters 1 --load "$H/imported" --finetune 2>&1 | tail -1 | cut -c1-300
  # (3b) linear position interpolation (rope_type linear, --rotary-seq-len-interpolation-factor
  # 4) the same way: import + fine-tune against transformers, export of the resumed checkpoint.
  LIN=(--rotary-base 10000 --rotary-seq-len-interpolation-factor 4)
  python3 tests/gpu/hf_llama_check.py make "$H/lin" --hidden 256 --ffn 704 --layers 4 \
    --heads 8 --groups 4 --vocab 1024 --seq 128 --rope-linear-factor 4 --qk-gain 8 2>/dev/null
  echo "make linear rc=$?"
  ./$B/app/weft ckpt import --format hf "$H/lin" "$H/linim"; echo "import linear rc=$?"
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" "${LIN[@]}" --train-iters 1 --load "$H/linim" --finetune \
    --save "$H/linft" --dump-first-batch "$H/l1.npy" --log-jsonl "$H/lin1.jsonl" > "$H/lin1.log" 2>&1
  echo "finetune linear rc=$?"
  for drop in "" --drop-rope-scaling; do
    python3 tests/gpu/hf_llama_check.py loss "$H/lin" "$H/l1.npy" "$H/lin1.jsonl" 1 $drop 2>/dev/null
    echo "hf_llama_check linear import $drop rc=$? (pass 0; with the scaling dropped 1)"
  done
  ./$B/app/weft train --log-interval 1 "${HFT[@]}" "${LIN[@]}" --train-iters 2 --load "$H/linft" \
    --dump-first-batch "$H/l2.npy" --log-jsonl "$H/lin2.jsonl" > "$H/lin2.log" 2>&1
  echo "resume linear rc=$?"
  ./$B/app/weft ckpt export --format hf "$H/linft" "$H/linex"; echo "export linear rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/linex" "$H/l2.npy" "$H/lin2.jsonl" 2 2>/dev/null
  echo "hf_llama_check linear export rc=$? (pass 0)"
  # (4) --kv-channels: a random LlamaForCausalLM with head_dim 64 (not 256 / 8 = 32), imported,
  # fine-tuned with --use-checkpoint-args (the head dim and the rest from the import), compared.
  python3 tests/gpu/hf_llama_check.py make "$H/kv" --hidden 256 --ffn 704 --layers 4 \
    --heads 8 --groups 4 --vocab 1024 --seq 128 --head-dim 64 --qk-gain 4 2>/dev/null
  echo "make head_dim 64 rc=$?"
  ./$B/app/weft ckpt import --format hf "$H/kv" "$H/kvim"; echo "import rc=$?"
  ./$B/app/weft train --log-interval 1 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --device cuda \
    --deterministic --mock-data --seq-length 128 --train-iters 1 --load "$H/kvim" --finetune \
    --use-checkpoint-args --dump-first-batch "$H/bkv.npy" --log-jsonl "$H/kv.jsonl" > "$H/kv.log" 2>&1
  echo "finetune --use-checkpoint-args rc=$?"; grep -m1 "parameters" "$H/kv.log"
  python3 tests/gpu/hf_llama_check.py loss "$H/kv" "$H/bkv.npy" "$H/kv.jsonl" 1 2>/dev/null
  echo "hf_llama_check head_dim 64 rc=$? (0: pass)"
  # (5) --qk-layernorm: a random Qwen3ForCausalLM (q_norm, k_norm; head_dim 64, norm weights
  # random) imported, fine-tuned 1 iteration with --use-checkpoint-args and saved, compared;
  # then weft's export of that checkpoint against the resumed iteration 2.
  python3 tests/gpu/hf_llama_check.py make "$H/qwen3" --arch qwen3 --hidden 256 --ffn 704 \
    --layers 4 --heads 8 --groups 4 --vocab 1024 --seq 128 --head-dim 64 \
    --rotary-base 1000000 2>/dev/null
  echo "make qwen3 rc=$?"
  ./$B/app/weft ckpt import --format hf "$H/qwen3" "$H/q3im"; echo "import rc=$?"
  Q3=(--micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --device cuda --deterministic
      --mock-data --seq-length 128 --use-checkpoint-args)
  ./$B/app/weft train --log-interval 1 "${Q3[@]}" --train-iters 1 --load "$H/q3im" --finetune --save "$H/q3ft" \
    --dump-first-batch "$H/bq1.npy" --log-jsonl "$H/q3.jsonl" > "$H/q3.log" 2>&1
  echo "finetune qwen3 rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/qwen3" "$H/bq1.npy" "$H/q3.jsonl" 1 2>/dev/null
  echo "hf_llama_check qwen3 import rc=$? (0: pass)"
  ./$B/app/weft train --log-interval 1 "${Q3[@]}" --train-iters 2 --load "$H/q3ft" --dump-first-batch "$H/bq2.npy" \
    --log-jsonl "$H/q3r.jsonl" > "$H/q3r.log" 2>&1
  echo "resume qwen3 rc=$?"
  ./$B/app/weft ckpt export --format hf "$H/q3ft" "$H/q3ex"; echo "export rc=$?"
  python3 tests/gpu/hf_llama_check.py loss "$H/q3ex" "$H/bq2.npy" "$H/q3r.jsonl" 2 2>/dev/null
  echo "hf_llama_check qwen3 export rc=$? (0: pass)"
  ;;
tbcheck)
  # --tensorboard-dir read back by TensorBoard's EventAccumulator and compared with the jsonl
  # (tests/gpu/tb_check.py): a small MoE model with MTP, bf16 on CUDA (MFU against the default
  # H200 peak), validation on mock data; 1 rank, then pp 2 on 2 ranks sharing the GPU.
  grep -h "TensorBoard (protobuf)" "$OUT/configure.log" 2>/dev/null
  [ -n "${WEFT_PROTOBUF_PREFIX:-}" ] && export LD_LIBRARY_PATH=$WEFT_PROTOBUF_PREFIX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  T="$OUT/tb"; rm -rf "$T"; mkdir -p "$T"
  TBM=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 4
       --ffn-hidden-size 704 --vocab-size 1024 --seq-length 128 --micro-batch-size 2
       --global-batch-size 8 --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01
       --mtp-num-layers 1 --train-iters 20 --eval-interval 10 --eval-iters 2 --lr 1e-3
       --device cuda --bf16 --mock-data)
  ./$B/app/weft train --log-interval 1 "${TBM[@]}" --tensorboard-dir "$T/np1" --log-jsonl "$T/np1.jsonl" > "$T/np1.log" 2>&1
  echo "train np1 rc=$?"; grep "iteration  *20/" "$T/np1.log" | cut -c1-400; tail -2 "$T/np1.log" | cut -c1-300
  python3 tests/gpu/tb_check.py "$T/np1" "$T/np1.jsonl"; echo "tb_check np1 rc=$?"
  mpirun -np 2 --bind-to none ./$B/app/weft train --log-interval 1 "${TBM[@]}" --pipeline-model-parallel-size 2 \
    --tensorboard-dir "$T/pp2" --tensorboard-log-interval 3 --log-jsonl "$T/pp2.jsonl" > "$T/pp2.log" 2>&1
  echo "train pp2 rc=$?"; tail -2 "$T/pp2.log" | cut -c1-300
  python3 tests/gpu/tb_check.py "$T/pp2" "$T/pp2.jsonl" --interval 3; echo "tb_check pp2 rc=$?"
  ;;
recompute)
  # Activation recomputation on CUDA (model/recompute.h): test_recompute (every recomputed run
  # bitwise equal to the plain one) at 1 and 8 ranks sharing the GPU; then weft at the size
  # curve's shapes (curve_shape) and the micro-batches of RC_RUNS (TAG:MBS:MODE, MODE none, full
  # = --recompute-granularity full --recompute-method uniform --recompute-num-layers 1, sel =
  # --recompute-activations --recompute-modules core_attn mlp, mlp = the same with mlp alone),
  # each with tokens/s (median of
  # iterations 4-10), weft's peak memory and `weft plan`'s; then PyTorch at RC_PT (TAG:MBS:MODE,
  # MODE eager | eager-ckpt | compile-ckpt: bench/gpu/pytorch_llama.py, -ckpt with
  # --checkpoint-blocks, compile with --compile-blocks). One line per run.
  export WEFT_TEST_DEVICE=cuda
  for np in 1 8; do
    timeout 300 mpirun -np $np --bind-to none ./$B/tests/train/test_recompute > "$OUT/test_recompute_np$np.log" 2>&1
    echo "test_recompute np$np rc=$? $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/test_recompute_np$np.log" | sort | uniq -c | tr '\n' ' ')"
  done
  unset WEFT_TEST_DEVICE
  R="$OUT/recompute"; mkdir -p "$R"
  for spec in ${RC_RUNS:-0.8b:8:none 0.8b:8:full 0.8b:8:sel 3b:4:none 3b:8:full 3b:8:sel}; do
    IFS=: read -r tag mbs mode <<< "$spec"
    read -r L H NH NG F _ <<< "$(curve_shape $tag)"
    WS=(--num-layers $L --hidden-size $H --num-attention-heads $NH --group-query-attention --num-query-groups $NG
        --ffn-hidden-size $F --vocab-size 32000 --seq-length 4096 --micro-batch-size $mbs --global-batch-size $mbs)
    case $mode in
      none) RF=() ;;
      full) RF=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1) ;;
      sel) RF=(--recompute-activations --recompute-modules core_attn mlp) ;;
      mlp) RF=(--recompute-activations --recompute-modules mlp) ;;
    esac
    f="$R/$tag-$mbs-$mode"
    plan=$(./$B/app/weft plan --world-size 1 --device cuda --bf16 "${WS[@]}" "${RF[@]}" --json 2>&1 |
           python3 -c "import json,sys; print('%.1f' % (json.load(sys.stdin)['max_peak'] / 2**30))" 2>/dev/null)
    timeout 240 ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${WS[@]}" "${RF[@]}" --train-iters 10 \
      --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$f.jsonl" > "$f.log" 2>&1
    rc=$?
    mfu=$(python3 bench/gpu/mfu.py --weft-jsonl "$f.jsonl" --layers $L --hidden $H --heads $NH --groups $NG --ffn $F 2>/dev/null)
    peak=$(grep -o "peak memory (MB): [0-9.]*" "$f.log" | tail -1 | awk '{printf "%.1f", $4 / 1024}')
    echo "weft $tag mbs $mbs $mode rc=$rc: $mfu peak ${peak:-?} GiB, plan ${plan:-?} GiB $(grep -m1 -iE 'error|out of memory' "$f.log" | cut -c1-200)"
  done
  for spec in ${RC_PT:-0.8b:8:eager 0.8b:8:eager-ckpt 0.8b:8:compile-ckpt 3b:8:eager-ckpt 3b:8:compile-ckpt}; do
    IFS=: read -r tag mbs mode <<< "$spec"
    read -r L H NH NG F _ <<< "$(curve_shape $tag)"
    PF=(); case $mode in *ckpt) PF+=(--checkpoint-blocks) ;; esac
    case $mode in compile*) PF+=(--compile-blocks) ;; esac
    f="$R/pt-$tag-$mbs-$mode"
    timeout 240 "$PY" bench/gpu/pytorch_llama.py --layers $L --hidden $H --heads $NH --groups $NG --ffn $F \
      --vocab 32000 --seq 4096 --mbs $mbs --steps 10 --warmup 4 "${PF[@]}" > "$f.json" 2> "$f.err"
    echo "pytorch $tag mbs $mbs $mode rc=$?: $(cat "$f.json") $(grep -m1 -iE 'Error' "$f.err" | cut -c1-200)"
  done
  ;;
moetests)
  export WEFT_TEST_DEVICE=cuda
  # The optimizer on CUDA: the fused AdamW, its device-side skip and clipping multiplier.
  mpirun -np 1 --bind-to none ./$B/tests/optim/test_optim > "$OUT/test_optim.log" 2>&1
  echo "tests/optim/test_optim rc=$? $(grep -E 'PASSED|FAILED' "$OUT/test_optim.log" | sort | uniq -c | tr '\n' ' ')"
  ./$B/tests/model/test_mamba > "$OUT/test_mamba.log" 2>&1
  echo "test_mamba rc=$? $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/test_mamba.log" | sort | uniq -c | tr '\n' ' ')"
  ./$B/tests/model/test_moe > "$OUT/test_moe.log" 2>&1
  echo "test_moe rc=$? $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/test_moe.log" | sort | uniq -c | tr '\n' ' ')"
  for t in tests/checkpoint/test_moe_checkpoint tests/train/test_moe_parity; do
    for np in 1 8; do
      timeout 400 mpirun -np $np --bind-to none ./$B/$t > "$OUT/$(basename $t)_np$np.log" 2>&1
      echo "$t np$np rc=$? $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/$(basename $t)_np$np.log" | sort | uniq -c | tr '\n' ' ')"
    done
  done
  ;;
esac
done
# extra stages used while debugging on the GPU machine
for stage in "$@"; do
case $stage in
crash)
  WEFT_TEST_DEVICE=cuda timeout 300 ./$B/tests/checkpoint/test_checkpoint \
    --gtest_filter='*Restart*' > "$OUT/crash.log" 2>&1
  echo "test_checkpoint *Restart* on cuda rc=$?"; grep -E "weft test:|pc |called from|OK \]|FAILED" "$OUT/crash.log" | head -20
  ;;
env)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null; which nvcc nsys ncu 2>/dev/null; df -h . /tmp | tail -2
  ;;
profile)
  S=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --group-query-attention --num-query-groups 12
     --ffn-hidden-size 2048 --vocab-size 32000 --seq-length 1024)
  ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 \
    --train-iters 7 --profile --use-pytorch-profiler --profile-step-start 4 --profile-step-end 6 --profile-dir "$OUT/prof1b" > "$OUT/prof1b.log" 2>&1
  echo "profile 1b rc=$?"; tail -3 "$OUT/prof1b.log" | cut -c1-300
  python3 bench/gpu/trace_summary.py "$OUT/prof1b/trace_rank0.json" --iters 2 --top 30
  ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${S[@]}" --micro-batch-size 8 --global-batch-size 8 \
    --train-iters 12 --profile --use-pytorch-profiler --profile-step-start 9 --profile-step-end 11 --profile-dir "$OUT/prof125m" > "$OUT/prof125m.log" 2>&1
  echo "profile 125m rc=$?"; tail -2 "$OUT/prof125m.log" | cut -c1-300
  python3 bench/gpu/trace_summary.py "$OUT/prof125m/trace_rank0.json" --iters 2 --top 15
  gzip -f "$OUT"/prof*/trace_rank0.json
  ;;
profcurve)
  # Profile summaries at the size curve's shapes (docs/performance.md "Where the time goes"):
  # iterations 5-6 of each size in PROF_SIZES (default: the curve's four, then 125m at
  # bench125m's micro-batch 8 x 1024 as "125m-s1024"; bench1b's 0.8B at micro-batch 2 is
  # "0.8b-m2", not in the default list), traced by `weft train --profile --use-pytorch-profiler` and summarised by
  # trace_summary.py (the PROF_TOP longest kernels, default 12) into $OUT/profcurve.txt; the
  # traces are not kept (size).
  P=/tmp/weft-profcurve; rm -rf $P; mkdir -p $P; : > "$OUT/profcurve.txt"
  for tag in ${PROF_SIZES:-125m 0.8b 1.5b 3b 125m-s1024}; do
    SEQ=4096
    if [ $tag = 125m-s1024 ]; then read -r L H NH NG F MBS <<< "12 768 12 12 2048 8"; SEQ=1024
    elif [ $tag = 0.8b-m2 ]; then read -r L H NH NG F MBS <<< "16 2048 16 8 5632 2"  # bench1b's
    else read -r L H NH NG F MBS <<< "$(curve_shape $tag)"; fi
    timeout 200 ./$B/app/weft train --log-interval 1 --device cuda --bf16 --num-layers $L --hidden-size $H \
      --num-attention-heads $NH --group-query-attention --num-query-groups $NG --ffn-hidden-size $F --vocab-size 32000 \
      --seq-length $SEQ --micro-batch-size $MBS --global-batch-size $MBS --train-iters 7 \
      ${PROF_EXTRA:-} --profile --use-pytorch-profiler --profile-step-start 4 --profile-step-end 6 --profile-dir $P/$tag > $P/$tag.log 2>&1
    rc=$?
    { echo "== $tag (layers $L hidden $H mbs $MBS seq $SEQ) rc=$rc"; grep -E "iteration +6/" $P/$tag.log | cut -c1-200
      python3 bench/gpu/trace_summary.py $P/$tag/trace_rank0.json --iters 2 --top ${PROF_TOP:-12}; } >> "$OUT/profcurve.txt" 2>&1
    rm -f $P/$tag/trace_rank0.json
  done
  grep -E "^==|device span|^  [a-z/]+ +[0-9.]+ +[0-9.]+%|ATen ops|cudaDeviceSynchronize" "$OUT/profcurve.txt"
  ;;
steady)
  # The step's device time against its wall time at bench1b's shape: 16 iterations, the middle
  # five (8-12) traced, every iteration's host-measured time printed, then the trace summary
  # over those five (span and busy per iteration, the idle gaps, host synchronisation).
  P=/tmp/weft-steady; rm -rf $P; mkdir -p $P
  timeout 300 ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${MODEL[@]}" --micro-batch-size 2 \
    --global-batch-size 2 --train-iters 16 ${PROF_EXTRA:-} --profile --use-pytorch-profiler --profile-step-start 7 \
    --profile-step-end 12 --profile-dir $P/t > $P/log 2>&1
  echo "steady rc=$?"; grep -oE "iteration +[0-9]+/|per iteration \(ms\): [0-9.]+" $P/log | paste -sd' ' | sed 's/ per iteration (ms)://g'
  python3 bench/gpu/trace_summary.py $P/t/trace_rank0.json --iters 5 --top ${PROF_TOP:-30} --gaps 12 | tee "$OUT/steady.txt" | cut -c1-160
  ;;
gencheck)
  # weft generate on CUDA: a tiny model trained on CUDA, then greedy continuations on CUDA and on
  # CPU from the same checkpoint (the KV cache on both devices; fp32, so they must agree), and a
  # hybrid (Mamba-2 state cache) model the same way.
  G=/tmp/weft-gencheck; rm -rf $G; mkdir -p $G
  GEN=(--num-layers 4 --hidden-size 64 --ffn-hidden-size 172 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --seq-length 64 --vocab-size 128 --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --lr 3e-3)
  ./$B/app/weft train --log-interval 1 --device cuda "${GEN[@]}" --save $G/dense > $G/train_dense.log 2>&1; echo "train dense rc=$?"
  HYBG=(--hybrid-layer-pattern "M*-M" --hidden-size 64 --ffn-hidden-size 172 --num-attention-heads 4
        --group-query-attention --num-query-groups 2 --mamba-state-dim 16 --mamba-head-dim 16 --mamba-num-groups 2 --seq-length 64
        --vocab-size 128 --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --lr 3e-3)
  ./$B/app/weft train --log-interval 1 --device cuda "${HYBG[@]}" --save $G/hybrid > $G/train_hybrid.log 2>&1; echo "train hybrid rc=$?"
  for m in dense hybrid; do
    for d in cuda cpu; do
      ./$B/app/weft generate --load $G/$m --prompt-ids "1 2 3 4 5" --greedy --max-new-tokens 40 --device $d \
        > $G/gen_${m}_$d.txt 2> $G/gen_${m}_$d.err; echo "generate $m $d rc=$? $(cat $G/gen_${m}_$d.err | tail -1)"
    done
    cmp -s $G/gen_${m}_cuda.txt $G/gen_${m}_cpu.txt && echo "$m: cuda and cpu continuations equal" || { echo "$m: DIFFER"; cat $G/gen_${m}_*.txt; }
  done
  ;;
profhyb)
  ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${HYB[@]}" --micro-batch-size 2 --global-batch-size 2 \
    --train-iters 7 --profile --use-pytorch-profiler --profile-step-start 4 --profile-step-end 6 --profile-dir "$OUT/profhyb" > "$OUT/profhyb.log" 2>&1
  echo "profile hybrid rc=$?"; tail -2 "$OUT/profhyb.log" | cut -c1-300
  python3 bench/gpu/trace_summary.py "$OUT/profhyb/trace_rank0.json" --iters 2 --top 30
  gzip -f "$OUT"/profhyb/trace_rank0.json
  ;;
ckpt)
  D=${WEFT_CKPT_DIR:-/tmp/weft-ckpt-bench}
  mpirun -np 1 --bind-to none ./$B/bench/bench_checkpoint --device cuda --bf16 --dir "$D" --repeats 2 --no-prewarm \
    --num-layers 16 --hidden-size 2048 --num-attention-heads 16 --num-query-groups 8 \
    --ffn-hidden-size 5632 --vocab-size 32000 --seq-length 4096 > "$OUT/ckpt_weft.log" 2>&1
  echo "bench_checkpoint rc=$?"; cat "$OUT/ckpt_weft.log" | tail -25
  timeout 400 python3 bench/gpu/pytorch_dcp.py --dir "$D-dcp" > "$OUT/ckpt_dcp.json" 2> "$OUT/ckpt_dcp.err"
  echo "dcp rc=$?"; cat "$OUT/ckpt_dcp.json"; tail -3 "$OUT/ckpt_dcp.err"
  ;;
bench125m)
  # weft eager and with --cuda-graph-impl local, then PyTorch eager, torch.compile and
  # torch.compile(mode="reduce-overhead") (CUDA graphs too); one summary line at the end.
  S=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --group-query-attention --num-query-groups 12
     --ffn-hidden-size 2048 --vocab-size 32000 --seq-length 1024)
  M=(--layers 12 --hidden 768 --heads 12 --groups 12 --ffn 2048 --vocab 32000 --seq 1024)
  R="$OUT/b125m"; rm -rf "$R"; mkdir -p "$R"
  for g in none local; do
    ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${S[@]}" --micro-batch-size 8 --global-batch-size 8 \
      --train-iters 30 --lr 3e-4 --lr-warmup-iters 2 --cuda-graph-impl $g \
      --log-jsonl "$R/weft_$g.jsonl" > "$R/weft_$g.log" 2>&1
    echo "weft 125m --cuda-graph-impl $g rc=$?"; tail -1 "$R/weft_$g.log" | cut -c1-300
    python3 bench/gpu/mfu.py --weft-jsonl "$R/weft_$g.jsonl" "${M[@]}" > "$R/weft_$g.mfu.json"
  done
  for mode in eager compile reduce-overhead; do
    X=(); [ $mode = compile ] && X=(--compile); [ $mode = reduce-overhead ] && X=(--compile --compile-mode reduce-overhead)
    timeout 300 python3 bench/gpu/pytorch_llama.py "${M[@]}" --mbs 8 --steps 30 --warmup 10 "${X[@]}" > "$R/pt_$mode.json" 2> "$R/pt_$mode.err"
    echo "pytorch 125m $mode rc=$?: $(cat "$R/pt_$mode.json")"; [ -s "$R/pt_$mode.json" ] || tail -3 "$R/pt_$mode.err"
  done
  "$PY" - "$R" <<'PYEOF'
import json, sys, os
r = sys.argv[1]
def tps(name):
    try:
        return json.load(open(os.path.join(r, name)))["tokens_per_sec"]
    except Exception:
        return None
w = {g: tps(f"weft_{g}.mfu.json") for g in ("none", "local")}
p = {m: tps(f"pt_{m}.json") for m in ("eager", "compile", "reduce-overhead")}
print("125m summary (tokens/s):", {**{"weft " + k: v for k, v in w.items()}, **{"pytorch " + k: v for k, v in p.items()}})
for g, v in w.items():
    if v:
        print(f"  weft {g}: " + ", ".join(f"{v / b:.2f}x {m}" for m, b in p.items() if b))
PYEOF
  ;;
curve)
  # Size curve (issue 13): weft, PyTorch eager and PyTorch compiled at each of the sizes of
  # curve_shape, then one table. Implementation-major, small to large (every weft run, then every
  # eager, then every compiled one), so the runs a late timeout loses are the largest compiled
  # ones; each run's timeout is cut to what is left of CURVE_BUDGET_S (default 480 s) and the
  # runs after it are skipped, so the stage ends on time with its table ($OUT/curve/table.md is
  # rewritten after every run, should the command itself be killed). CURVE_END_S (default 570):
  # the stage also ends by then, in seconds since run.sh started, so that `build curve` stays
  # within one 10-minute device command whatever the build took.
  # CURVE_COMPILE=blocks (default): pytorch_llama.py --compile-blocks (each block compiled, one
  # graph shared by the identical blocks: compile time independent of depth); =model: --compile
  # (the whole model, ~60-90 s of compilation at 0.8B alone). CURVE_SIZES: a subset, in order.
  C="$OUT/curve"; rm -rf "$C"; mkdir -p "$C"
  CURVE_SIZES=${CURVE_SIZES:-125m 0.8b 1.5b 3b}
  curve_deadline=$((SECONDS + ${CURVE_BUDGET_S:-480}))
  [ $curve_deadline -gt ${CURVE_END_S:-570} ] && curve_deadline=${CURVE_END_S:-570}
  CMODE=--compile-blocks; [ "${CURVE_COMPILE:-blocks}" = model ] && CMODE=--compile
  for tag in $CURVE_SIZES; do
    shape=$(curve_shape $tag) || { echo "curve: unknown size $tag (known: 125m 0.8b 1.5b 3b)"; exit 1; }
    read -r L H NH NG F MBS <<< "$shape"
    printf '{"layers": %d, "hidden": %d, "heads": %d, "groups": %d, "ffn": %d, "vocab": 32000, "seq": 4096, "mbs": %d}\n' \
      $L $H $NH $NG $F $MBS > "$C/$tag.shape.json"
  done
  for impl in weft eager compile; do
    for tag in $CURVE_SIZES; do
      read -r L H NH NG F MBS <<< "$(curve_shape $tag)"
      WS=(--num-layers $L --hidden-size $H --num-attention-heads $NH --group-query-attention --num-query-groups $NG
          --ffn-hidden-size $F --vocab-size 32000 --seq-length 4096 --micro-batch-size $MBS
          --global-batch-size $MBS)
      PS=(--layers $L --hidden $H --heads $NH --groups $NG --ffn $F --vocab 32000 --seq 4096
          --mbs $MBS --steps 10 --warmup 4)
      case $impl in
      weft)
        ./$B/app/weft plan --world-size 1 --device cuda --bf16 "${WS[@]}" --json > "$C/$tag.plan.json" 2>&1
        curve_run $tag weft 150 ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${WS[@]}" --train-iters 12 \
          --lr 3e-4 --lr-warmup-iters 2 --log-jsonl "$C/$tag.weft.jsonl" ;;
      eager) curve_run $tag eager 150 "$PY" bench/gpu/pytorch_llama.py "${PS[@]}" ;;
      compile) curve_run $tag compile 240 "$PY" bench/gpu/pytorch_llama.py "${PS[@]}" $CMODE ;;
      esac
    done
  done
  echo "size curve (weft, PyTorch eager, PyTorch ${CMODE#--}; MFU over 781 TFLOP/s):"
  cat "$C/table.md"
  ;;
weft1b)  # weft alone in variants (ratio in the same run); WEFT1B_VARIANTS, default "fused unfused":
  # fused (bench1b's weft), unfused (--no-fused-kernels), graph (--cuda-graph-impl local),
  # gradbf16 (--grad-reduce-in-bf16)
  for v in ${WEFT1B_VARIANTS:-fused unfused}; do
    X=(); [ $v = unfused ] && X=(--no-fused-kernels); [ $v = graph ] && X=(--cuda-graph-impl local)
    [ $v = gradbf16 ] && X=(--grad-reduce-in-bf16)
    rm -f "$OUT/weft_1b_$v.jsonl"
    ./$B/app/weft train --log-interval 1 --device cuda --bf16 "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 \
      --train-iters ${WEFT1B_ITERS:-12} --lr 3e-4 --lr-warmup-iters 2 "${X[@]}" --log-jsonl "$OUT/weft_1b_$v.jsonl" > "$OUT/weft_1b_$v.log" 2>&1
    echo "weft $v rc=$?"; tail -1 "$OUT/weft_1b_$v.log" | cut -c1-400
    python3 bench/gpu/mfu.py --weft-jsonl "$OUT/weft_1b_$v.jsonl"
  done
  ;;
esac
done
