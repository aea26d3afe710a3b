#!/usr/bin/env python3
"""Checks weft's Hugging Face interop against transformers (docs/hf-interop.md).

Two subcommands, run by `bash bench/gpu/run.sh hfcheck` on the GPU machine (torch,
transformers 5.x, safetensors):

  make OUTDIR --hidden H --ffn F --layers L --heads NH --groups NG --vocab V --seq S
       [--arch llama|qwen3] [--head-dim D] [--rotary-base B] [--rope-scaling-factor F]
       [--rope-linear-factor F] [--qk-gain G]
       [--norm-epsilon E] [--untied] [--seed N]
      saves a randomly initialised LlamaForCausalLM with exactly weft's shapes (the config a
      `weft train` flag set describes) with save_pretrained (safetensors), for `weft ckpt import`.
      --head-dim D: heads of D channels (weft's --kv-channels; default hidden / heads).
      --arch qwen3: a Qwen3ForCausalLM instead (q_norm and k_norm, weft's --qk-layernorm).
      --rope-scaling-factor F: Llama 3's RoPE scaling (rope_type llama3, low/high frequency
      factors 1 and 4, original context 8192), weft's --use-rope-scaling --rope-scaling-factor F.
      --rope-linear-factor F: linear position interpolation (rope_type linear), weft's
      --rotary-seq-len-interpolation-factor F.
      --qk-gain G multiplies the q_proj and k_proj weights by G: at the default initialisation
      the attention is nearly uniform and the positions barely matter to the loss, so a RoPE
      error would hide under the tolerance.

  loss HFDIR BATCH_NPY LOG_JSONL ITERATION [--drop-rope-scaling]
      loads HFDIR with AutoModelForCausalLM.from_pretrained in float32 (LlamaForCausalLM,
      Qwen3ForCausalLM or NemotronHForCausalLM, as its config.json says), computes the mean
      cross-entropy on the tokens and labels weft dumped with --dump-first-batch (an .npy of
      int64 [2, G, S]: tokens, then labels = tokens shifted by one inside each sample), and
      compares it with weft's lm_loss of iteration ITERATION in LOG_JSONL (the loss of the batch
      that run started with). weft's loss is the mean over all G*S label positions, so is this.
      --drop-rope-scaling loads the model with the default RoPE instead of its llama3 or linear scaling:
      the planted bug that the scaling check must catch (it must then fail).

Prints one JSON line {"weft": ..., "transformers": ..., "rel_diff": ..., "pass": ...}; exits 0
when the relative difference is below 1e-5, 1 when not, 2 when the input is not as expected.
"""
import argparse
import json
import sys


def fail(msg):
    print(json.dumps({"error": msg}))
    sys.exit(2)


def cmd_make(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(a.seed)
    rope = {"rope_type": "default", "rope_theta": a.rotary_base}
    if a.rope_scaling_factor:
        rope = {"rope_type": "llama3", "rope_theta": a.rotary_base,
                "factor": a.rope_scaling_factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
    if a.rope_linear_factor and a.rope_scaling_factor:
        fail("--rope-linear-factor and --rope-scaling-factor: a config has one rope_type")
    if a.rope_linear_factor:
        rope = {"rope_type": "linear", "rope_theta": a.rotary_base, "factor": a.rope_linear_factor}
    Config, Model = (Qwen3Config, Qwen3ForCausalLM) if a.arch == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    extra = {"use_sliding_window": False} if a.arch == "qwen3" else {"mlp_bias": False}
    cfg = Config(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.groups,
        head_dim=a.head_dim or a.hidden // a.heads, max_position_embeddings=a.seq, rms_norm_eps=a.norm_epsilon,
        rope_parameters=rope,
        tie_word_embeddings=not a.untied, hidden_act="silu", attention_bias=False,
        initializer_range=0.02, **extra)
    model = Model(cfg).to(torch.float32)
    # RMSNorm weights start at one; make them random so the check covers their mapping too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(a.qk_gain)
    model.save_pretrained(a.outdir, safe_serialization=True)
    print(json.dumps({"saved": a.outdir, "params": sum(p.numel() for p in model.parameters())}))


def cmd_loss(a):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoModelForCausalLM

    batch = np.load(a.batch)
    if batch.ndim != 3 or batch.shape[0] != 2 or batch.dtype != np.int64:
        fail(f"{a.batch}: expected int64 [2, G, S], got {batch.dtype} {list(batch.shape)}")
    tokens = torch.from_numpy(batch[0])
    labels = torch.from_numpy(batch[1])
    if not torch.equal(tokens[:, 1:], labels[:, :-1]):
        fail("labels are not the tokens shifted by one inside each sample")
    weft = None
    with open(a.log) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("iteration") == a.iteration and "lm_loss" in rec:
                weft = rec["lm_loss"]
    if weft is None:
        fail(f"{a.log}: no lm_loss for iteration {a.iteration}")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs = {}
    if a.drop_rope_scaling:
        cfg = AutoConfig.from_pretrained(a.hfdir)
        theta = cfg.rope_parameters["rope_theta"]
        if cfg.rope_parameters.get("rope_type") not in ("llama3", "linear"):
            fail(f"{a.hfdir}: --drop-rope-scaling on a model without llama3 or linear RoPE scaling")
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": theta}
        kwargs["config"] = cfg
    model = AutoModelForCausalLM.from_pretrained(a.hfdir, dtype=torch.float32, **kwargs).to(dev).eval()
    rope = getattr(model.config, "rope_parameters", None) or {}  # NemotronH has none
    rope_type = rope.get("rope_type")
    with torch.no_grad():
        logits = model(input_ids=tokens.to(dev)).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.to(dev).reshape(-1),
                               reduction="mean").item()
    rel = abs(loss - weft) / abs(weft)
    ok = rel < 1e-5
    import transformers
    print(json.dumps({"weft": weft, "transformers": loss, "rel_diff": rel, "pass": ok,
                      "iteration": a.iteration, "batch": list(batch.shape[1:]),
                      "transformers_version": transformers.__version__, "hfdir": a.hfdir,
                      "rope_type": rope_type, "model": type(model).__name__}))
    sys.exit(0 if ok else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("outdir")
    for flag in ("--hidden", "--ffn", "--layers", "--heads", "--groups", "--vocab", "--seq"):
        m.add_argument(flag, type=int, required=True)
    m.add_argument("--head-dim", type=int, default=0)
    m.add_argument("--arch", choices=["llama", "qwen3"], default="llama")
    m.add_argument("--rotary-base", type=float, default=10000.0)
    m.add_argument("--rope-scaling-factor", type=float, default=0.0)
    m.add_argument("--rope-linear-factor", type=float, default=0.0)
    m.add_argument("--qk-gain", type=float, default=1.0)
    m.add_argument("--norm-epsilon", type=float, default=1e-5)
    m.add_argument("--untied", action="store_true")
    m.add_argument("--seed", type=int, default=0)
    lo = sub.add_parser("loss")
    lo.add_argument("hfdir")
    lo.add_argument("batch")
    lo.add_argument("log")
    lo.add_argument("iteration", type=int)
    lo.add_argument("--drop-rope-scaling", action="store_true")
    a = p.parse_args()
    cmd_make(a) if a.cmd == "make" else cmd_loss(a)


if __name__ == "__main__":
    main()
