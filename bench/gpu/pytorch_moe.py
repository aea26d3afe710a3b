#!/usr/bin/env python3
"""Baseline for weft's MoE benchmark: the same mixture-of-experts model as weft's, in plain PyTorch.

The model is bench/gpu/pytorch_llama.py's Llama-style decoder (RMSNorm, rotary GQA attention
through fused scaled-dot-product attention, tied embeddings) with every layer's MLP replaced by
a mixture of SwiGLU experts:
  router     logits = x @ Wr^T (bf16 under autocast); routing in fp32: the top-k logits, then a
             softmax over those k (Megatron's default order); no shared expert
  aux loss   per layer E / (k T^2) * sum_e (sum_t softmax(logits)[t, e]) * (pairs routed to e),
             added to the cross entropy with coefficient 0.01
  experts    fc1 [2f, h] (rows [0, f) gate, [f, 2f) up), fc2 [h, f];
             y_t = sum_j probs[t, j] * fc2(silu(gate) * up) of expert idx[t, j] on x_t
The expert computation comes in two forms (--experts):
  loop       the usual way it is written: one nn.Module per expert; for each expert the tokens
             routed to it (torch.where), its MLP on them, and index_add_ of the weighted rows into
             the output. torch.where syncs with the host once per expert and layer.
  grouped    stacked weights [E, 2f, h] and [E, h, f]; the T*k (token, slot) pairs sorted by
             expert, the rows gathered once, both expert matmuls as one torch._grouped_mm each
             (bf16, rows of expert e between cumulative offsets), the results scattered back to
             pair order and combined with the routing weights. No host sync.
Either may run eagerly or under torch.compile (--compile; the loop form graph-breaks at its
data-dependent shapes). Both forms draw identical initial weights, so their losses agree up to
bf16 rounding. bf16 autocast over fp32 parameters, fused AdamW, random tokens; prints one JSON
line with the median tokens/s over the timed steps, the total and the active parameter counts
(the embedding counted once, (E-k)/E of the expert weights left out of the active count), the
cross-entropy and aux losses of the last step and the peak memory. If torch._grouped_mm is
missing or fails on this device, --experts grouped prints a JSON line with "error" and exits 0.
Written for weft's benchmarks; no model code from other projects.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

AUX_COEFF = 0.01


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


def expert_counts(idx, experts):
    """Pairs routed to each expert: bincount(idx.flatten(), minlength=experts), but with a fixed
    output shape, so it neither waits on the device (CUDA bincount reads the maximum back) nor
    breaks a torch.compile graph."""
    flat = idx.flatten()
    return torch.zeros(experts, dtype=torch.int64, device=idx.device).scatter_add_(
        0, flat, torch.ones_like(flat))


class Expert(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.fc1 = nn.Linear(h, 2 * f, bias=False)  # rows [0, f) gate, [f, 2f) up
        self.fc2 = nn.Linear(f, h, bias=False)

    def forward(self, x):
        g, u = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(g) * u)


class LoopExperts(nn.Module):
    """One module per expert, run in turn on the tokens routed to it."""

    def __init__(self, a):
        super().__init__()
        self.experts = nn.ModuleList(Expert(a.hidden, a.moe_ffn) for _ in range(a.num_experts))

    @torch.no_grad()
    def reset_parameters(self, std1, std2, gen):
        w1, w2 = stacked_init(len(self.experts), self.experts[0].fc1.weight.shape,
                              self.experts[0].fc2.weight.shape, std1, std2, gen)
        for e, ex in enumerate(self.experts):
            ex.fc1.weight.copy_(w1[e])
            ex.fc2.weight.copy_(w2[e])

    def forward(self, x, idx, probs):  # x [T, h], idx [T, k] int64, probs [T, k] fp32
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            tok, slot = torch.where(idx == e)
            if tok.numel():
                y = probs[tok, slot, None] * ex(x[tok])
                out.index_add_(0, tok, y.to(out.dtype))
        return out


class GroupedExperts(nn.Module):
    """Stacked expert weights; both matmuls over all experts as one torch._grouped_mm each."""

    def __init__(self, a):
        super().__init__()
        E, h, f = a.num_experts, a.hidden, a.moe_ffn
        self.w1 = nn.Parameter(torch.empty(E, 2 * f, h))  # per expert: fc1, gate rows then up
        self.w2 = nn.Parameter(torch.empty(E, h, f))  # per expert: fc2

    @torch.no_grad()
    def reset_parameters(self, std1, std2, gen):
        w1, w2 = stacked_init(self.w1.shape[0], self.w1.shape[1:], self.w2.shape[1:], std1, std2,
                              gen)
        self.w1.copy_(w1)
        self.w2.copy_(w2)

    def forward(self, x, idx, probs):  # x [T, h], idx [T, k] int64, probs [T, k] fp32
        T, k = idx.shape
        order = torch.argsort(idx.flatten(), stable=True)  # pairs p = t*k + j, by expert
        offs = torch.cumsum(expert_counts(idx, self.w1.shape[0]), 0).to(torch.int32)
        rows = x.to(torch.bfloat16)[order // k]  # [T*k, h]
        # autocast does not cover _grouped_mm: cast the fp32 master weights as it would.
        gu = torch._grouped_mm(rows, self.w1.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        g, u = gu.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(g) * u, self.w2.to(torch.bfloat16).transpose(-2, -1),
                              offs=offs)  # [T*k, h], pairs in expert order
        out_pairs = torch.empty_like(y)
        out_pairs[order] = y  # back to pair order
        return (out_pairs.view(T, k, -1) * probs[..., None]).sum(1)


def stacked_init(E, fc1_shape, fc2_shape, std1, std2, gen):
    """Expert weights drawn stacked, the same way for both forms."""
    return (torch.empty(E, *fc1_shape).normal_(0.0, std1, generator=gen),
            torch.empty(E, *fc2_shape).normal_(0.0, std2, generator=gen))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.nh, self.ng, self.hd = a.heads, a.groups, a.hidden // a.heads
        self.E, self.k = a.num_experts, a.topk
        self.n1 = RMSNorm(a.hidden, 1e-5)
        self.qkv = nn.Linear(a.hidden, (self.nh + 2 * self.ng) * self.hd, bias=False)
        self.proj = nn.Linear(self.nh * self.hd, a.hidden, bias=False)
        self.n2 = RMSNorm(a.hidden, 1e-5)
        self.router = nn.Linear(a.hidden, a.num_experts, bias=False)
        self.moe = (GroupedExperts if a.experts == "grouped" else LoopExperts)(a)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        qkv = self.qkv(self.n1(x))
        q, k, v = qkv.split([self.nh * self.hd, self.ng * self.hd, self.ng * self.hd], dim=-1)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.ng, self.hd).transpose(1, 2)
        v = v.view(b, s, self.ng, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, -1))
        xn = self.n2(x).reshape(b * s, h)
        T = xn.shape[0]
        logits = self.router(xn).float()  # [T, E]
        top, idx = torch.topk(logits, self.k, dim=-1)
        probs = torch.softmax(top, -1)
        scores = torch.softmax(logits, -1)
        aux = (scores.sum(0) * expert_counts(idx, self.E).float()).sum() * (
            self.E / (self.k * T * T))
        return x + self.moe(xn, idx, probs).view(b, s, h), aux


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.out = nn.Linear(a.hidden, a.vocab, bias=False)
        self.out.weight = self.emb.weight  # tied
        # A generator of its own: the modules' default initialisation above draws differently
        # for the two expert forms, these draws do not.
        gen = torch.Generator().manual_seed(0)
        scaled = 0.02 / math.sqrt(2 * a.layers)
        for n, p in self.named_parameters():
            if p.dim() == 2 and ".moe." not in n:  # experts below, stacked in both forms
                nn.init.normal_(p, 0.0, scaled if n.endswith("proj.weight") else 0.02,
                                generator=gen)
        for blk in self.blocks:
            blk.moe.reset_parameters(0.02, scaled, gen)  # fc1 0.02, fc2 scaled like proj
        self.cos, self.sin = rope_tables(a.seq, a.hidden // a.heads, 10000.0, "cuda")

    def expert_numel(self):
        return sum(p.numel() for blk in self.blocks for p in blk.moe.parameters())

    def forward(self, tokens):
        x = self.emb(tokens)
        aux = 0.0
        for blk in self.blocks:
            x, layer_aux = blk(x, self.cos, self.sin)
            aux = aux + layer_aux
        return self.out(self.norm(x)), aux


def grouped_mm_error():
    """None if torch._grouped_mm runs here, else why not."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch._grouped_mm is not available in torch {torch.__version__}"
    try:  # the layouts of GroupedExperts, uneven groups and an empty one, forward and backward
        a = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(3, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        offs = torch.tensor([5, 5, 48], device="cuda", dtype=torch.int32)
        torch._grouped_mm(a, b.transpose(-2, -1), offs=offs).float().sum().backward()
        torch.cuda.synchronize()
    except (RuntimeError, NotImplementedError) as e:
        return f"torch._grouped_mm failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return None


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(layers=14, hidden=1024, heads=16, groups=8, num_experts=8, topk=2,
                     moe_ffn=2816, vocab=32000, seq=4096, mbs=2, steps=12, warmup=4).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--experts", choices=("loop", "grouped"), default="loop",
                   help="expert computation: per-expert loop, or torch._grouped_mm")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    impl = f"pytorch-moe-{a.experts}-{'compile' if a.compile else 'eager'}"
    if not 1 <= a.topk <= a.num_experts:
        p.error(f"--topk {a.topk} must be in [1, --num-experts {a.num_experts}]")
    if a.experts == "grouped":
        err = grouped_mm_error()
        if err:
            print(json.dumps({"impl": impl, "error": err}))
            sys.exit(0)
    torch.manual_seed(0)
    model = Model(a).cuda()
    params = sum(p.numel() for p in model.parameters())  # the tied embedding once
    active = params - model.expert_numel() // a.num_experts * (a.num_experts - a.topk)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=True)
    step_model = torch.compile(model) if a.compile else model
    g = torch.Generator(device="cuda").manual_seed(1)
    times = []
    for step in range(a.steps):
        tok = torch.randint(0, a.vocab, (a.mbs, a.seq + 1), device="cuda", generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, aux = step_model(tok[:, :-1])
        ce = F.cross_entropy(logits.float().view(-1, a.vocab), tok[:, 1:].reshape(-1))
        loss = ce + AUX_COEFF * aux
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    tps = a.mbs * a.seq / statistics.median(times)
    print(json.dumps({"impl": impl, "params": params, "active_params": active,
                      "tokens_per_sec": tps, "loss": ce.item(), "aux_loss": float(aux),
                      "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()
