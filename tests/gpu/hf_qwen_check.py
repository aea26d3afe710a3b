#!/usr/bin/env python3
"""weft's Qwen2, Qwen3-MoE, Mixtral and DeepSeek-V3 imports (docs/hf-interop.md) against transformers.

Two phases, because transformers lives on the GPU machine and a full weft build (ICU, the
tokenizers) here:

  reference OUTDIR        (where transformers is; `bash bench/gpu/run.sh hfqwen`)
      saves five random models with save_pretrained under OUTDIR/<name>/model: Qwen2ForCausalLM
      tied (as Qwen2.5-0.5B) and untied (weft's --add-qkv-bias); Qwen3MoeForCausalLM with a
      dense first layer (mlp_only_layers), a head dim of its own and norm_topk_prob true and
      false (weft's --qk-layernorm MoE, --moe-router-pre-softmax for false); MixtralForCausalLM
      (weft's MoE without q/k norms, never compared with transformers before);
      DeepseekV3ForCausalLM (weft's multi-latent attention with a query latent and YaRN, a dense
      first layer, a sigmoid router with random expert biases over 4 groups, a shared expert and
      a routing scale). For each: a
      random sequence D of S token ids, transformers' float64 loss of predicting D[1:] + [D[0]]
      from D, and the same loss with a planted difference the check must tell apart (Qwen2: the
      q/k/v biases zeroed; Qwen3-MoE: norm_topk_prob flipped; Mixtral: the router zeroed;
      DeepSeek-V3: rope_interleave off).
      Biases, norm weights, routers, experts and the q/k scale are made random and large
      enough that every part moves the loss. The models are saved in bfloat16 and read back:
      the reference is transformers' float64 loss of the files, checked against a float64
      forward written in this script from the architectures' definitions (to 1e-7: transformers
      computes RMSNorm, the RoPE tables and the routers' softmax in float32 even in a float64
      model; DeepSeek-V3 has no such forward here: weft's test_model checks its MLA against a
      reference of its own).

  check OUTDIR WEFT       (here, with the weft binary WEFT)
      for each model: a corpus of 64 copies of D as NullTokenizer text (space-separated ids, no
      end-of-document token), so that every training sample weft draws is D followed by D[0];
      `weft data preprocess`, `weft ckpt import --format hf`, then one `weft train --finetune
      --use-checkpoint-args` iteration in float32 on the CPU, whose first batch
      (--dump-first-batch) must be D labelled D[1:] + [D[0]] in every sample; its iteration-1 lm
      loss (the imported weights') against transformers'. Passes when the relative difference is below
      TOL (1e-6) and the planted difference moves the loss by more than 100x that. Then `weft
      generate --greedy` from the import continues D[:8] by 24 tokens, which must be
      transformers' greedy `generate` of the same prompt (recorded with the smallest top-2
      logit gap along it).

  exported EXPORTDIR      (where transformers is)
      `check --export-dir EXPORTDIR` also exports each imported checkpoint with `weft ckpt
      export --dtype bf16` (its tensors must equal the original files' byte for byte) beside the
      reference; this phase loads each export with AutoModelForCausalLM in float64 and requires
      the reference's class and loss (to 1e-9): weft's config.json read by transformers.

Prints one JSON line per model; exits 0 when every model passes, 1 when one does not, 2 when
the input is not as expected.
"""
import argparse
import ast
import json
import os
import struct
import subprocess
import sys

GEN_PROMPT, GEN_NEW = 8, 24  # greedy decoding: prompt D[:8], 24 new tokens
TOL = 1e-6  # weft's float32 loss against the float64 references, relative
SHAPE = dict(hidden=256, ffn=704, layers=4, heads=8, groups=4, vocab=1024, seq=128)
MODELS = ("qwen2_tied", "qwen2_untied", "qwen3_moe_norm", "qwen3_moe_prob", "mixtral",
          "deepseek_v3")


def fail(msg):
    print(json.dumps({"error": msg}))
    sys.exit(2)


def make_model(name, torch):
    """The random model `name` and how to plant its difference (a function of the model)."""
    from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)

    common = dict(
        vocab_size=SHAPE["vocab"], hidden_size=SHAPE["hidden"], intermediate_size=SHAPE["ffn"],
        num_hidden_layers=SHAPE["layers"], num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["groups"], max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, hidden_act="silu",
        use_sliding_window=False, sliding_window=32768, initializer_range=0.02)
    if name.startswith("qwen2"):
        cfg = Qwen2Config(tie_word_embeddings=name.endswith("tied") and not name.endswith("untied"),
                          max_window_layers=21, **common)
        model = Qwen2ForCausalLM(cfg)

        def plant(m):
            for n, p in m.named_parameters():
                if n.endswith("_proj.bias"):
                    p.zero_()
        return model, plant
    if name == "deepseek_v3":  # weft's MLA with YaRN and a DeepSeek-V3 MoE
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
        for k in ("use_sliding_window", "sliding_window", "num_key_value_heads"):
            del common[k]
        cfg = DeepseekV3Config(
            tie_word_embeddings=False, num_key_value_heads=SHAPE["heads"], q_lora_rank=96,
            kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
            n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2,
            moe_intermediate_size=128, n_shared_experts=1, first_k_dense_replace=1,
            routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
            **{**common, "rope_parameters": {
                "rope_type": "yarn", "rope_theta": 1e6, "factor": 40.0, "mscale": 0.9,
                "mscale_all_dim": 0.5, "original_max_position_embeddings": 4096,
                "beta_fast": 32.0, "beta_slow": 1.0}})
        model = DeepseekV3ForCausalLM(cfg)

        def plant(m):  # rotate the pairs as halves: weft's (Megatron's) de-interleave matters
            m.config.rope_interleave = False
        return model, plant
    if name == "mixtral":  # weft's MoE without q/k norms; transformers 5 fuses its experts too
        del common["use_sliding_window"]
        cfg = MixtralConfig(tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2,
                            router_jitter_noise=0.0, router_aux_loss_coef=0.001,
                            **{**common, "sliding_window": None, "intermediate_size": 128})
        model = MixtralForCausalLM(cfg)

        def plant(m):  # uniform routing
            for n, p in m.named_parameters():
                if n.endswith("gate.weight") and "experts" not in n:
                    p.zero_()
        return model, plant
    cfg = Qwen3MoeConfig(tie_word_embeddings=False, head_dim=64, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=128, mlp_only_layers=[0],
                         decoder_sparse_step=1, norm_topk_prob=name.endswith("norm"),
                         router_aux_loss_coef=0.001, **common)
    model = Qwen3MoeForCausalLM(cfg)

    def plant(m):
        for mod in m.modules():
            if hasattr(mod, "norm_topk_prob"):
                mod.norm_topk_prob = not mod.norm_topk_prob
    return model, plant


def independent_loss(model_dir, cfg, seq, labels, torch):
    """The float64 loss of the saved files by a forward written here from the architectures'
    definitions (RMSNorm, RoPE on halves, causal GQA attention, SwiGLU, softmax top-k routing),
    not by transformers: a third opinion where weft and transformers disagree."""
    import glob
    from safetensors.torch import load_file
    F = torch.nn.functional
    class Used(dict):  # records every tensor read, so none of the files goes unchecked
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __getitem__(self, k):
            self.seen.add(k)
            return dict.__getitem__(self, k)

        def get(self, k, default=None):
            return self[k] if k in self else default

    w = Used()
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        w.update({k: v.to(torch.float64) for k, v in load_file(f).items()})
    h, nh, ng = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or h // nh
    eps, S = cfg.rms_norm_eps, len(seq)
    theta = cfg.rope_parameters["rope_theta"]

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):  # [heads, S, hd]
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    def swiglu(x, g, u, d):
        return (F.silu(x @ g.T) * (x @ u.T)) @ d.T

    x = w["model.embed_tokens.weight"][torch.tensor(seq)]
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        xn = rms(x, w[p + "input_layernorm.weight"])
        q = lin(xn, p + "self_attn.q_proj").view(S, nh, hd).transpose(0, 1)
        k = lin(xn, p + "self_attn.k_proj").view(S, ng, hd).transpose(0, 1)
        v = lin(xn, p + "self_attn.v_proj").view(S, ng, hd).transpose(0, 1)
        if p + "self_attn.q_norm.weight" in w:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // ng, 0), v.repeat_interleave(nh // ng, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v
        x = x + lin(att.transpose(0, 1).reshape(S, nh * hd), p + "self_attn.o_proj")
        xn = rms(x, w[p + "post_attention_layernorm.weight"])
        blk, names = ((p + "block_sparse_moe.", ("w1", "w3", "w2")) if p + "block_sparse_moe.gate.weight" in w
                      else (p + "mlp.", ("gate_proj", "up_proj", "down_proj")))
        if blk + "gate.weight" in w:  # softmax over the experts, top k, renormalised or not
            probs = torch.softmax(xn @ w[blk + "gate.weight"].T, -1)
            top, idx = probs.topk(cfg.num_experts_per_tok, -1)
            if getattr(cfg, "norm_topk_prob", True):  # Mixtral always renormalises
                top = top / top.sum(-1, keepdim=True)
            y = torch.zeros_like(xn)
            for t in range(S):
                for j in range(idx.shape[1]):
                    e = f"{blk}experts.{int(idx[t, j])}."
                    y[t] += top[t, j] * swiglu(xn[t], *(w[e + n + ".weight"] for n in names))
            x = x + y
        else:
            x = x + swiglu(xn, *(w[p + "mlp." + n + "_proj.weight"] for n in ("gate", "up", "down")))
    x = rms(x, w["model.norm.weight"])
    out = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    unused = set(w) - w.seen
    if unused:
        fail(f"the forward written here does not read {sorted(unused)[:5]}")
    return F.cross_entropy(x @ out.T, labels).item()


def next_token_loss(m, seq, torch):
    """The float64 cross entropy of model m predicting seq[1:] + [seq[0]] from seq."""
    with torch.no_grad():
        logits = m(input_ids=seq.unsqueeze(0)).logits[0].double()
    return torch.nn.functional.cross_entropy(logits, torch.cat([seq[1:], seq[:1]])).item()


def greedy_of(m, prompt, torch):
    """transformers' greedy continuation (GEN_NEW tokens) of `prompt`, and the smallest gap
    between the two largest logits along it (how far the argmax is from a tie)."""
    m.generation_config.eos_token_id = None  # weft runs with --ignore-eos
    with torch.no_grad():
        out = m.generate(prompt.unsqueeze(0), max_new_tokens=GEN_NEW, do_sample=False,
                         pad_token_id=0)[0]
        logits = m(input_ids=out.unsqueeze(0)).logits[0, len(prompt) - 1:-1]
    if len(out) != len(prompt) + GEN_NEW:
        fail(f"transformers generated {len(out) - len(prompt)} tokens, not {GEN_NEW}")
    top2 = logits.topk(2, -1).values
    new = out[len(prompt):].tolist()
    if new != logits.argmax(-1).tolist():
        fail("transformers' generate and the argmax of its forward differ")
    return new, (top2[:, 0] - top2[:, 1]).min().item()


def eager_experts(model):
    """transformers 5 runs fused experts through torch._grouped_mm, which has no float64."""
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    elif hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "eager"


def cmd_reference(a):
    import torch
    import transformers

    for i, name in enumerate(MODELS):
        if name not in a.models:
            continue
        torch.manual_seed(11 + i)
        model, plant = make_model(name, torch)
        model = model.to(torch.float32)
        theta = (getattr(model.config, "rope_parameters", None) or {}).get("rope_theta")
        if theta != 1e6:  # transformers 4 would store rope_parameters but compute with 10000
            fail(f"{name}: transformers built the model with rope_theta {theta}, not 1e6")
        n_experts = 0
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                if n.endswith(("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_b_proj.weight")):
                    p.mul_(4.0)
                if n.endswith("_proj.bias"):
                    p.uniform_(-1.0, 1.0)
                if n.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):  # routers
                    # logits of std ~1: no expert takes all, so renormalising the top k matters
                    p.normal_(0.0, 0.06)
                if ".experts." in n:  # large enough that the experts' output rivals attention's
                    p.normal_(0.0, 0.06)
                    n_experts += 1
            for n, b in model.named_buffers():
                if n.endswith("e_score_correction_bias"):  # DeepSeek-V3: biases that choose;
                    # non-negative: transformers masks the groups left out with 0, Megatron
                    # (and weft) with -inf, which differ where a biased score is negative
                    b.uniform_(0.0, 0.3)
        if n_experts == 0 and not name.startswith("qwen2"):
            fail(f"{name}: no parameter named like '.experts.' to make larger")
        # Saved in bfloat16 (half the bytes to carry back from the GPU machine), then read back:
        # the in-memory model cannot be the reference, since .to(bfloat16) also rounds its RoPE
        # frequencies (a buffer), which a model read from the files recomputes.
        model = model.to(torch.bfloat16)
        out = os.path.join(a.outdir, name)
        model_dir = os.path.join(out, "model")
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(model_dir, safe_serialization=True)
        cls, config = type(model), model.config
        del model
        seq = torch.randint(0, SHAPE["vocab"], (SHAPE["seq"],), generator=torch.Generator().manual_seed(5 + i))
        labels = torch.cat([seq[1:], seq[:1]])

        def load(dtype):
            m = cls.from_pretrained(model_dir, dtype=dtype)
            eager_experts(m)
            return m.eval()

        def loss_of(m):
            return next_token_loss(m, seq, torch)

        m64 = load(torch.float64)
        ref = loss_of(m64)
        ref32 = loss_of(load(torch.float32))  # how far float32 arithmetic alone moves it
        indep = (None if name == "deepseek_v3" else
                 independent_loss(model_dir, config, seq.tolist(), labels, torch))
        if indep is not None and abs(indep - ref) > 1e-7 * abs(ref):  # transformers' norms, RoPE, routers in float32
            fail(f"{name}: transformers' loss {ref} and the forward written here {indep} differ")
        greedy, margin = greedy_of(m64, seq[:GEN_PROMPT], torch)
        with torch.no_grad():
            plant(m64)
        planted = loss_of(m64)
        rec = {"loss": ref, "loss_float32": ref32, "loss_independent": indep,
               "loss_planted": planted, "greedy": greedy, "greedy_min_margin": margin}
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump({"seq": seq.tolist(), **rec, "model": cls.__name__,
                       "transformers_version": transformers.__version__}, f)
        print(json.dumps({"model": name, **rec}))


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log) as f:
            tail = f.read()[-2000:]
        fail(f"{' '.join(cmd)} exited {r.returncode}: {tail}")


def read_npy_int64(path):
    """The shape and values of a little-endian int64 .npy file (no numpy here)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        fail(f"{path}: not an .npy file")
    major = data[6]
    hlen = struct.unpack("<H" if major == 1 else "<I", data[8:10] if major == 1 else data[8:12])[0]
    start = 10 if major == 1 else 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    if header["descr"] != "<i8" or header["fortran_order"]:
        fail(f"{path}: expected C-order little-endian int64, got {header}")
    body = data[start + hlen:]
    return header["shape"], list(struct.unpack(f"<{len(body) // 8}q", body))


def safetensors_tensors(model_dir):
    """{name: (dtype, shape, bytes)} of every .safetensors file in model_dir."""
    out = {}
    for fn in sorted(os.listdir(model_dir)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        for k, v in header.items():
            if k != "__metadata__":
                a, b = v["data_offsets"]
                out[k] = (v["dtype"], v["shape"], data[a:b])
    return out


def same_tensors(ours, theirs):
    """Whether two {name: (dtype, shape, bytes)} maps hold the same tensors byte for byte, but
    for a float32 tensor of ours where theirs is bfloat16 (the expert biases, which weft always
    writes in float32): equal when theirs widened to float32 (two zero bytes below each
    little-endian bfloat16) is ours."""
    if ours.keys() != theirs.keys():
        print(f"tensor names differ: ours only {sorted(ours.keys() - theirs.keys())[:4]}, "
              f"theirs only {sorted(theirs.keys() - ours.keys())[:4]}")
        return False
    for k, (dt, shape, data) in ours.items():
        tdt, tshape, tdata = theirs[k]
        if shape != tshape:
            return False
        if dt == "F32" and tdt == "BF16":
            tdata = b"".join(b"\0\0" + tdata[i:i + 2] for i in range(0, len(tdata), 2))
        elif dt != tdt:
            return False
        if data != tdata:
            print(f"{k}: {dt} bytes differ from the original's {tdt}")
            return False
    return True


def cmd_exported(a):
    """transformers reads weft's exports (check --export-dir) and gives the reference loss."""
    import torch
    from transformers import AutoModelForCausalLM
    ok_all = True
    for name in a.models:
        d = os.path.join(a.exportdir, name)
        with open(os.path.join(d, "weft_reference.json")) as f:
            ref = json.load(f)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64)
        eager_experts(m)
        loss = next_token_loss(m.eval(), torch.tensor(ref["seq"]), torch)
        rel = abs(loss - ref["loss"]) / abs(ref["loss"])
        ok = rel < 1e-9 and type(m).__name__ == ref["model"]
        ok_all = ok_all and ok
        print(json.dumps({"model": name, "class": type(m).__name__, "loss": loss,
                          "reference": ref["loss"], "rel_diff": rel, "pass": ok}))
    sys.exit(0 if ok_all else 1)


def cmd_check(a):
    ok_all = True
    for name in a.models:
        d = os.path.join(a.outdir, name)
        ref_path = os.path.join(d, "reference.json")
        if not os.path.exists(ref_path):
            fail(f"{ref_path} is missing: run the reference phase first")
        with open(ref_path) as f:
            ref = json.load(f)
        work = os.path.join(a.workdir, name)
        os.makedirs(work, exist_ok=True)
        text = " ".join(str(t) for t in ref["seq"])
        corpus = os.path.join(work, "corpus.jsonl")
        with open(corpus, "w") as f:
            for _ in range(64):
                f.write(json.dumps({"text": text}) + "\n")
        tok = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(SHAPE["vocab"])]
        run([a.weft, "data", "preprocess", "--input", corpus, "--json-keys", "text",
             "--output-prefix", os.path.join(work, "corpus"), *tok, "--workers", "1"],
            os.path.join(work, "preprocess.log"))
        imported = os.path.join(work, "imported")
        run([a.weft, "ckpt", "import", "--format", "hf", os.path.join(d, "model"), imported],
            os.path.join(work, "import.log"))
        jsonl = os.path.join(work, "ft.jsonl")
        run([a.weft, "train", "--load", imported, "--finetune", "--use-checkpoint-args",
             "--seq-length", str(SHAPE["seq"]), "--micro-batch-size", "2",
             "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-4", "--log-interval",
             "1", "--data-path", os.path.join(work, "corpus_text_document"), *tok,
             "--log-jsonl", jsonl, "--device", "cpu", "--dump-first-batch",
             os.path.join(work, "batch.npy")], os.path.join(work, "train.log"))
        # Every sample weft trained on must be D, labelled D[1:] + [D[0]].
        shape, values = read_npy_int64(os.path.join(work, "batch.npy"))
        seq = ref["seq"]
        want = [seq, seq[1:] + seq[:1]]
        if len(shape) != 3 or shape[0] != 2 or shape[2] != len(seq):
            fail(f"{work}/batch.npy has shape {shape}, expected [2, G, {len(seq)}]")
        n = len(seq)
        for k in range(2):
            for g in range(shape[1]):
                off = (k * shape[1] + g) * n
                if values[off:off + n] != want[k]:
                    fail(f"{work}/batch.npy: sample {g}'s {'labels' if k else 'tokens'} are not "
                         "the reference sequence's")
        weft = None
        with open(jsonl) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("iteration") == 1 and "lm_loss" in rec:
                    weft = rec["lm_loss"]
        if weft is None:
            fail(f"{jsonl}: no lm_loss for iteration 1")
        rel = abs(weft - ref["loss"]) / abs(ref["loss"])
        planted_rel = abs(ref["loss_planted"] - ref["loss"]) / abs(ref["loss"])
        ok = rel < TOL and planted_rel > 100 * TOL
        greedy = None
        if "greedy" in ref:  # weft generate --greedy on the import against transformers' generate
            r = subprocess.run([a.weft, "generate", "--load", imported, "--greedy", "--ignore-eos",
                                "--prompt-ids",
                                " ".join(str(t) for t in seq[:GEN_PROMPT]), "--max-new-tokens",
                                str(GEN_NEW)], capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"weft generate exited {r.returncode}: {r.stderr[-1000:]}")
            greedy = [int(t) for t in r.stdout.split()]
            if greedy != ref["greedy"]:
                print(f"{name}: weft's greedy tokens {greedy} differ from transformers' "
                      f"{ref['greedy']} (smallest top-2 logit gap {ref['greedy_min_margin']:.3g})")
                ok = False
        if a.export_dir:  # weft's export of the import, for the `exported` phase
            exp = os.path.join(a.export_dir, name)
            run([a.weft, "ckpt", "export", imported, exp, "--dtype", "bf16"],
                os.path.join(work, "export.log"))
            same = same_tensors(safetensors_tensors(exp),
                                safetensors_tensors(os.path.join(d, "model")))
            if not same:
                print(f"{name}: weft's bf16 export does not hold the imported files' tensors "
                      "byte for byte")
            ok = ok and same
            with open(os.path.join(exp, "weft_reference.json"), "w") as f:
                json.dump(ref, f)
        ok_all = ok_all and ok
        print(json.dumps({"model": name, "weft": weft, "transformers": ref["loss"],
                          "rel_diff": rel, "planted_rel_diff": planted_rel,
                          "transformers_float32_rel_diff":
                              abs(ref["loss_float32"] - ref["loss"]) / abs(ref["loss"]),
                          "greedy_equal": None if greedy is None else greedy == ref["greedy"],
                          "greedy_min_margin": ref.get("greedy_min_margin"), "pass": ok,
                          "transformers_version": ref["transformers_version"]}))
    sys.exit(0 if ok_all else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("outdir")
    c = sub.add_parser("check")
    c.add_argument("outdir")
    c.add_argument("weft")
    c.add_argument("--workdir", default="/tmp/weft-hf-qwen")
    c.add_argument("--export-dir", help="also export each import here, for `exported`")
    e = sub.add_parser("exported")
    e.add_argument("exportdir")
    for q in (r, c, e):
        q.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    a = p.parse_args()
    {"reference": cmd_reference, "check": cmd_check, "exported": cmd_exported}[a.cmd](a)


if __name__ == "__main__":
    main()
