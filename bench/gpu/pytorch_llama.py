#!/usr/bin/env python3
"""Baseline for bench/gpu/run_1b.sh: the same Llama-style model as weft's, in plain PyTorch.

Same shapes, batch and sequence as the weft run; bf16 autocast over fp32 parameters, fused
scaled-dot-product attention (GQA), fused AdamW; eager or torch.compile. Prints one JSON line
with the median tokens/s over the timed steps, the peak memory allocated (GiB) and the first
step's seconds (with --compile, mostly compilation). Written for weft's benchmarks; no model code
from other projects.

--compile compiles the whole model (one graph of every block; compile time grows with the
layers: ~60-90 s at 0.8B on the H200). --compile-blocks compiles each decoder block on its own
("regional compilation": the identical blocks share one compiled graph, so compile time does not
grow with the layers); the embedding, the final norm, the output layer and the loss stay eager
in both modes. The model is built directly on the GPU (no CPU init of billions of parameters).
--checkpoint-blocks recomputes each decoder block in the backward (torch.utils.checkpoint,
non-reentrant), the PyTorch counterpart of weft's --recompute-granularity full
--recompute-method uniform --recompute-num-layers 1; it combines with either compile mode.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight.type_as(x)


def rope_tables(seq, hd, base, device):
    inv = base ** (-torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):  # x [b, heads, s, hd], rotate-half
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return (x.float() * cos + rot.float() * sin).type_as(x)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.nh, self.ng, self.hd = a.heads, a.groups, a.hidden // a.heads
        self.n1 = RMSNorm(a.hidden, 1e-5)
        self.qkv = nn.Linear(a.hidden, (self.nh + 2 * self.ng) * self.hd, bias=False)
        self.proj = nn.Linear(self.nh * self.hd, a.hidden, bias=False)
        self.n2 = RMSNorm(a.hidden, 1e-5)
        self.fc1 = nn.Linear(a.hidden, 2 * a.ffn, bias=False)
        self.fc2 = nn.Linear(a.ffn, a.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qkv = self.qkv(self.n1(x))
        q, k, v = qkv.split([self.nh * self.hd, self.ng * self.hd, self.ng * self.hd], dim=-1)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.ng, self.hd).transpose(1, 2)
        v = v.view(b, s, self.ng, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, -1))
        g, u = self.fc1(self.n2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.out = nn.Linear(a.hidden, a.vocab, bias=False)
        self.out.weight = self.emb.weight  # tied
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * a.layers) if n.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
        self.cos, self.sin = rope_tables(a.seq, a.hidden // a.heads, 10000.0, "cuda")
        self.checkpoint_blocks = a.checkpoint_blocks

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, self.cos, self.sin, use_reentrant=False)
            else:
                x = blk(x, self.cos, self.sin)
        return self.out(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(layers=16, hidden=2048, heads=16, groups=8, ffn=5632, vocab=32000, seq=4096,
                     mbs=2, steps=12, warmup=4).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--compile", action="store_true", help="torch.compile the whole model")
    p.add_argument("--compile-blocks", action="store_true",
                   help="torch.compile each decoder block (regional compilation)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode with --compile (e.g. reduce-overhead: CUDA graphs)")
    p.add_argument("--checkpoint-blocks", action="store_true",
                   help="recompute each decoder block in the backward (torch.utils.checkpoint)")
    a = p.parse_args()
    if a.compile and a.compile_blocks:
        p.error("--compile and --compile-blocks: choose one")
    if a.steps <= a.warmup:
        p.error(f"--steps {a.steps} must exceed --warmup {a.warmup} (the timed steps follow it)")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Model(a)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=True)
    step_model = torch.compile(model, mode=a.compile_mode) if a.compile else model
    if a.compile_blocks:
        for blk in model.blocks:
            blk.compile()
    g = torch.Generator(device="cuda").manual_seed(1)
    times = []
    for step in range(a.steps):
        tok = torch.randint(0, a.vocab, (a.mbs, a.seq + 1), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_model(tok[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), tok[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tps = a.mbs * a.seq / statistics.median(times[a.warmup:])
    impl = (f"pytorch-compile-{a.compile_mode}" if a.compile and a.compile_mode else
            "pytorch-compile" if a.compile else
            "pytorch-compile-blocks" if a.compile_blocks else "pytorch-eager")
    if a.checkpoint_blocks:
        impl += "-checkpoint"
    print(json.dumps({"impl": impl, "params": params, "mbs": a.mbs, "seq": a.seq,
                      "tokens_per_sec": tps, "loss": loss.item(),
                      "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30,
                      "first_step_s": times[0]}))


if __name__ == "__main__":
    main()
