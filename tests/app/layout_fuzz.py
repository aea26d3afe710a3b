"""Random models on random layouts against one rank (invariants 1 and 2 of DESIGN.md, drawn
rather than listed).

Each trial draws a model (dense, MoE or hybrid Mamba; GQA/MQA/MHA, tied or not, q/k norms,
q/k/v biases, a head dim of its own, partial/interpolated/Llama-3-scaled/no RoPE, squared ReLU,
MoE layer patterns, top 1 (weighing the experts' input or output) or 2, softmax or sigmoid
routing, expert bias, shared experts, token dropping (a capacity factor, either policy, padded
or not), MTP; per-token loss, clipping) and a batch (micro-batch 1, 2 or 4, global 8 or 16),
then one of two checks against the same model trained 4 iterations on one rank, in
float32 on the CPU:
- parity: 4 iterations on a drawn layout (2 or 4 ranks; pp 1 or 2 with an uneven split or a
  '|' in the hybrid pattern, ep 2, HSDP with 2 replicas; the overlapped gradient reduce and
  parameter gather, the tp-pp-dp rank order and activation recomputation (full uniform or
  block, or selective modules), which change no number, now and then);
- reshard: 2 iterations saved on one drawn layout (synchronously or with --async-save), then 2
  more loaded on another.
Every iteration's lm loss, aux loss, MTP loss and grad norm must agree to a relative 1e-5
(layouts only reorder float32 sums: measured worst 2.3e-7 over 100 trials).

Usage: layout_fuzz.py WEFT MPIRUN...   (MPIRUN: the mpirun command and its options, no -np)
WEFT_FUZZ_SEED (default 2) and WEFT_FUZZ_TRIALS (default 6) pick the trials; a failure prints
the two commands that reproduce it.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

TOL = 1e-5


def draw_model(rng):
    kind = rng.choice(["dense", "moe", "hybrid"])
    heads = rng.choice([4, 8])
    groups = rng.choice([g for g in (1, 2, 4, heads) if heads % g == 0])
    dp_max = 4
    mbs = rng.choice([1, 2, 4])
    gbs = rng.choice([g for g in (8, 16) if g % (mbs * dp_max) == 0] or [mbs * dp_max])
    a = ["--hidden-size", "64", "--num-attention-heads", str(heads),
         "--group-query-attention", "--num-query-groups", str(groups), "--seq-length", "32",
         "--vocab-size", str(rng.choice([96, 101, 128])), "--ffn-hidden-size", "96",
         "--micro-batch-size", str(mbs), "--global-batch-size", str(gbs),
         "--eval-interval", "0", "--mock-data", "--train-iters", "4", "--lr", "1e-3",
         "--seed", str(rng.randint(1, 1000))]
    if rng.random() < 0.5:
        a.append("--untie-embeddings-and-output-weights")
    if rng.random() < 0.3:
        a.append("--qk-layernorm")
    # Multi-latent attention (DeepSeek's; its own RoPE, so none of the position flags below;
    # no --group-query-attention, which Megatron refuses beside it).
    mla = kind != "hybrid" and rng.random() < 0.25
    if mla:
        gqa = a.index("--group-query-attention")
        del a[gqa:gqa + 3]  # the flag and --num-query-groups G
        a += ["--multi-latent-attention", "--kv-lora-rank", "24", "--qk-head-dim", "16",
              "--qk-pos-emb-head-dim", "8", "--v-head-dim", str(rng.choice([8, 16]))]
        if rng.random() < 0.5:
            a += ["--q-lora-rank", "20"]
        if rng.random() < 0.5:  # YaRN with mscales (tables and softmax scale)
            a += ["--rotary-scaling-factor", "40", "--mscale", "0.9", "--mscale-all-dim", "0.5"]
        else:
            a += ["--rope-type", "rope"]
    if not mla and rng.random() < 0.3:
        a.append("--add-qkv-bias")
    if rng.random() < 0.3:
        a += ["--kv-channels", "32"]
    # Position encodings (Megatron's flags): part of each head rotated, linear position
    # interpolation, Llama 3's scaling, or none; all are per position, so no layout changes them.
    rope = 1.0 if mla else rng.random()
    if rope < 0.1:
        a += ["--rotary-percent", "0.5"]
    elif rope < 0.2:
        a += ["--rotary-seq-len-interpolation-factor", str(rng.choice([2, 4]))]
    elif rope < 0.3:
        a += ["--use-rope-scaling", "--rope-scaling-factor", "8", "--rotary-base", "500000"]
    elif rope < 0.35:
        a += ["--position-embedding-type", "none"]
    if rng.random() < 0.15:
        a.append("--squared-relu")
    if rng.random() < 0.2:
        a.append("--calculate-per-token-loss")
    if rng.random() < 0.2:  # clipping that acts (the grad norms here are above 0.5)
        a += ["--clip-grad", "0.5"]
    layers = rng.choice([2, 3, 4])
    moe = []
    if kind != "dense":
        topk = rng.choice([1, 2])
        moe = ["--num-experts", "4", "--moe-router-topk", str(topk),
               "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff", "0.01"]
        sigmoid = rng.random() < 0.3
        if rng.random() < 0.3:
            moe += ["--moe-shared-expert-intermediate-size", "32"]
        if sigmoid:
            moe += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
        # top 1 under the softmax router needs the softmax before the top-k (Megatron's rule)
        if rng.random() < 0.3 or (topk == 1 and not sigmoid):
            moe.append("--moe-router-pre-softmax")
        if topk == 1 and rng.random() < 0.3:  # the weight on the expert's input (Llama 4's)
            moe.append("--moe-apply-probs-on-input")
        # Token dropping: each micro-batch's pairs capped per expert, on every layout alike.
        if rng.random() < 0.3:
            moe += ["--moe-expert-capacity-factor", str(rng.choice([0.5, 1.0, 1.25])),
                    "--moe-token-drop-policy", rng.choice(["probs", "position"])]
            if rng.random() < 0.3:
                moe.append("--moe-pad-expert-input-to-capacity")
    if kind == "dense":
        a += ["--num-layers", str(layers)]
    elif kind == "moe":
        freq = [rng.choice([0, 1]) for _ in range(layers)]
        freq[-1] = 1
        a += ["--num-layers", str(layers), "--moe-layer-freq",
              "[" + ",".join(map(str, freq)) + "]"] + moe
    else:
        a += ["--hybrid-layer-pattern", "".join(rng.choice("M*-E") for _ in range(layers + 1)),
              "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--mamba-state-dim", "16"] + moe
    if kind != "hybrid" and rng.random() < 0.3:
        a += ["--mtp-num-layers", "1"]
    # Megatron's increasing weight decay and the router z-loss: the same on every layout.
    if rng.random() < 0.2:
        a += ["--weight-decay-incr-style", rng.choice(["linear", "cosine"]),
              "--start-weight-decay", "0.01", "--end-weight-decay", "0.2"]
    if kind != "dense" and rng.random() < 0.3:
        a += ["--moe-z-loss-coeff", "0.01"]
    return kind, a


def draw_layout(rng, kind, model):
    """(ranks, the model flags with any '|' cut into the hybrid pattern, the layout flags)."""
    model = list(model)
    ranks = rng.choice([2, 4])
    pp = rng.choice([1, 2])
    lay = ["--pipeline-model-parallel-size", str(pp)]
    if pp == 2 and kind == "hybrid":
        i = model.index("--hybrid-layer-pattern") + 1
        cut = rng.randint(1, len(model[i]) - 1)
        model[i] = model[i][:cut] + "|" + model[i][cut:]
    elif pp == 2:
        n = int(model[model.index("--num-layers") + 1])
        if n % 2:
            lay += ["--decoder-first-pipeline-num-layers", str(n // 2)]
    rest = ranks // pp
    if kind != "dense" and rest >= 2 and rng.random() < 0.6:
        lay += ["--expert-model-parallel-size", "2"]
    if rest == 4 and rng.random() < 0.5:
        lay += ["--num-distributed-optimizer-instances", "2"]
    # Scheduling and rank order only: the same numbers. (The tp-pp-dp order with pp and ep both
    # above 1 is refused: its dense and expert pipeline groups would differ.)
    for flag in ("--overlap-grad-reduce", "--overlap-param-gather", "--use-tp-pp-dp-mapping"):
        if rng.random() < 0.3 and not (flag == "--use-tp-pp-dp-mapping" and pp > 1 and
                                       "--expert-model-parallel-size" in lay):
            lay.append(flag)
    # Activation recomputation keeps less and computes the same numbers.
    r = rng.random()
    if r < 0.2:
        method, n = rng.choice(["uniform", "block"]), rng.choice([1, 2])
        mtp = "--mtp-num-layers" in model or any("/" in x for x in model)
        if method == "uniform" and mtp:
            n = 1  # Megatron recomputes MTP depths only as one-layer chunks
        lay += ["--recompute-granularity", "full", "--recompute-method", method,
                "--recompute-num-layers", str(n)]
    elif r < 0.35:
        mods = [m for m in ("core_attn", "mlp", "moe", "shared_experts") if rng.random() < 0.5]
        lay += ["--recompute-activations"] + (["--recompute-modules"] + mods if mods else [])
    return ranks, model, lay


def main():
    weft, mpirun = sys.argv[1], sys.argv[2:]
    seed = int(os.environ.get("WEFT_FUZZ_SEED", "2"))
    trials = int(os.environ.get("WEFT_FUZZ_TRIALS", "6"))
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="weft-fuzz-")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def train(ranks, args, tag):
        log = os.path.join(work, tag + ".jsonl")
        if os.path.exists(log):
            os.remove(log)
        cmd = mpirun + ["-np", str(ranks), weft, "train"] + args + ["--log-jsonl", log]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            lines = (r.stdout + r.stderr).splitlines()
            why = [l for l in lines if "error" in l][:2] or lines[-3:] or [f"exit {r.returncode}"]
            return None, " ".join(cmd), why
        rows = [json.loads(line) for line in open(log)]
        return [(x["iteration"], x["lm_loss"], x["aux_loss"], x["mtp_loss"], x["z_loss"],
                 x["grad_norm"])
                for x in rows], " ".join(cmd), None

    failed = 0
    try:
        for trial in range(trials):
            kind, model = draw_model(rng)
            mode = "parity" if trial % 2 == 0 else "reshard"
            ranks_a, model_a, lay_a = draw_layout(rng, kind, model)
            ref, ref_cmd, why = train(1, model, "ref")
            runs = []
            if ref is not None:
                if mode == "parity":
                    runs.append(train(ranks_a, model_a + lay_a, "a"))
                else:
                    ckpt = os.path.join(work, "ckpt")
                    shutil.rmtree(ckpt, ignore_errors=True)
                    ranks_b, model_b, lay_b = draw_layout(rng, kind, model)
                    save = ["--save", ckpt, "--save-interval", "2", "--exit-interval", "2"]
                    if rng.random() < 0.5:
                        save.append("--async-save")
                    runs.append(train(ranks_a, model_a + lay_a + save, "a"))
                    if runs[-1][0] is not None:
                        runs.append(train(ranks_b, model_b + lay_b + ["--load", ckpt], "b"))
            got = [row for rows, _, _ in runs if rows is not None for row in rows]
            errors = [(cmd, w) for rows, cmd, w in [(ref, ref_cmd, why)] + runs if rows is None]
            worst, bad = 0.0, bool(errors) or len(got) != 4 or ref is None
            if not bad:
                for r, g in zip(ref, got):
                    if r[0] != g[0]:
                        bad = True
                    for x, y in zip(r[1:], g[1:]):
                        worst = max(worst, abs(x - y) / max(1e-6, abs(x)))
                bad = bad or worst > TOL
            mla = ", MLA" if "--multi-latent-attention" in model else ""
            print(f"trial {trial} ({mode}, {kind}{mla}): {'FAIL' if bad else 'ok'}, worst relative "
                  f"difference {worst:.2e}", flush=True)
            if bad:
                failed += 1
                print("  one rank: " + ref_cmd)
                for rows, cmd, w in runs:
                    print("  layout:   " + cmd)
                for cmd, w in errors:
                    print(f"  failed:   {w}")
                if ref is not None and got:
                    print(f"  one rank: {ref}\n  layouts:  {got}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{trials - failed}/{trials} trials agree (seed {seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
