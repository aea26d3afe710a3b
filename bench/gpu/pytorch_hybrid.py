#!/usr/bin/env python3
"""Baseline for weft's hybrid (Mamba-2 / attention / MLP) benchmark, in plain PyTorch.

The model is weft's hybrid decoder (--hybrid-layer-pattern), one layer per pattern symbol:
  M   x + mixer(x)                 the Mamba-2 mixer below (its pre-norm is inside)
  *   x + attention(rmsnorm(x))    bench/gpu/pytorch_llama.py's attention half: rotary GQA
                                   attention through fused scaled-dot-product attention
  -   x + mlp(rmsnorm(x))          pytorch_llama.py's SwiGLU MLP half
  |   (pipeline stage separator)   ignored
then the final RMSNorm and the output layer tied to the embedding.

The Mamba-2 mixer (Megatron's MambaMixer, as weft's src/weft/model/mamba.h):
  proj        = in_proj(rmsnorm(x) * in_norm), rows [z (di), x (di), B (ng ds), C (ng ds), dt (nh)]
  x, B, C     = silu(causal depthwise conv1d(x, B, C channels; kernel 4, bias))
  dt          = softplus(dt + dt_bias),  A = -exp(A_log)
  y           = SSD(x, dt, A, B, C) + D * x        (head h reads group h // (nh / ng))
  out         = out_proj(rmsnorm_per_group(y * silu(z)) * norm)   (ng groups of di / ng, eps 1e-5)
with di = nh * hd and nh = 2 * hidden / hd unless --mamba-heads. in_proj and out_proj run under
bf16 autocast; everything from the conv to the gated norm runs in float32 with autocast off.
The conv is F.conv1d(groups=channels, padding=3) cut to the first s steps. The SSD scan
  h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t     (an [hd, ds] state per head)
is the Mamba-2 paper's chunked ("minimal") algorithm, written here with torch ops: chunks of Q
steps (--chunk); segment sums of the log-decays dt*A within a chunk by a masked cumsum;
  1. diagonal blocks: y_l += sum_{s<=l} (C_l . B_s) exp(segsum[l, s]) dt_s x_s     (einsum)
  2. chunk states:    S_c = sum_s exp(cs_last - cs_s) dt_s x_s B_s^T
  3. across chunks:   the states entering each chunk from an [nc+1, nc+1] decay matrix
                      (segment sums of the chunks' total decays) times the stacked states
  4. state to output: y_l += exp(cs_l) C_l . E_c
C . B^T is formed once per group and shared by its heads.

Initialisation as Megatron's: in_proj, qkv, fc1, embedding N(0, 0.02); out_proj
N(0, 0.02 / sqrt(layers)); attention proj and fc2 N(0, 0.02 / sqrt(2 layers)) (as
pytorch_llama.py); A_log = log U[1, 16]; dt_bias = inverse softplus of dt = exp(U[log 1e-3,
log 1e-1]) floored at 1e-4; D = 1; norm weights 1; the conv keeps PyTorch's default init.

bf16 autocast over fp32 parameters, fused AdamW (lr 3e-4, betas 0.9/0.95, wd 0.01), gradient
clipping at 1.0, random tokens; eager or torch.compile (--compile; if compiling fails, one JSON
line with "error" and exit 0). Prints one JSON line with the parameter count (embedding counted
once), the median tokens/s over the timed steps, the last loss and the peak memory.
Written for weft's benchmarks; no model code from other projects.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

# 3 Mamba layers to 1 attention layer, each followed by an MLP (Nemotron-H-like); 21 layers.
DEFAULT_PATTERN = "M-M-M*-M-M-M*-M-M-M*-"


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


class Attention(nn.Module):  # '*': x + proj(attention(rmsnorm(x)))
    def __init__(self, a):
        super().__init__()
        self.nh, self.ng, self.hd = a.heads, a.groups, a.hidden // a.heads
        self.n1 = RMSNorm(a.hidden, 1e-5)
        self.qkv = nn.Linear(a.hidden, (self.nh + 2 * self.ng) * self.hd, bias=False)
        self.proj = nn.Linear(self.nh * self.hd, a.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qkv = self.qkv(self.n1(x))
        q, k, v = qkv.split([self.nh * self.hd, self.ng * self.hd, self.ng * self.hd], dim=-1)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.ng, self.hd).transpose(1, 2)
        v = v.view(b, s, self.ng, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return x + self.proj(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):  # '-': x + fc2(silu(gate) * up), [gate; up] = fc1(rmsnorm(x))
    def __init__(self, a):
        super().__init__()
        self.n2 = RMSNorm(a.hidden, 1e-5)
        self.fc1 = nn.Linear(a.hidden, 2 * a.ffn, bias=False)
        self.fc2 = nn.Linear(a.ffn, a.hidden, bias=False)

    def forward(self, x, cos, sin):
        g, u = self.fc1(self.n2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(g) * u)


def segsum(a):
    """a [..., T] -> [..., T, T] with entry (i, j) = a[j+1] + ... + a[i] for j <= i (0 on the
    diagonal) and -inf above it. Summed by a masked cumsum (no differences of long prefix sums)."""
    t = a.shape[-1]
    ones = torch.ones(t, t, dtype=torch.bool, device=a.device)
    below = ones.tril(-1)
    rows = a.unsqueeze(-1).expand(*a.shape, t)               # (i, j) -> a[i]
    sums = rows.masked_fill(~below, 0.0).cumsum(dim=-2)       # (i, j) -> sum_{j < k <= i} a[k]
    return sums.masked_fill(~ones.tril(0), float("-inf"))


def ssd(x, dt, A, B, C, chunk):
    """Chunked SSD scan in float32. x [b, s, nh, hd], dt [b, s, nh] (> 0), A [nh] (< 0),
    B, C [b, s, ng, ds]. Returns y [b, s, nh, hd] without the D skip."""
    b, s, nh, hd = x.shape
    ng, ds = B.shape[2], B.shape[3]
    r = nh // ng
    q = min(chunk, s)
    nc = -(-s // q)
    pad = nc * q - s
    if pad:  # padding steps: dt = 0, so no decay and no input
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    # Chunk layout: [b, nc, ng, (r,) q, ...]; heads of a group next to each other.
    u = (x * dt.unsqueeze(-1)).reshape(b, nc, q, ng, r, hd).permute(0, 1, 3, 4, 2, 5)
    Bc = B.reshape(b, nc, q, ng, ds).transpose(2, 3)             # [b, nc, ng, q, ds]
    Cc = C.reshape(b, nc, q, ng, ds).transpose(2, 3)
    la = (dt * A).reshape(b, nc, q, ng, r).permute(0, 1, 3, 4, 2)  # log-decays [b, nc, ng, r, q]
    cs = la.cumsum(-1)

    # 1. diagonal blocks: masked, decay-weighted C B^T applied to dt x.
    decay = torch.exp(segsum(la))                             # [b, nc, ng, r, q, q]
    cb = torch.einsum("bcgln,bcgsn->bcgls", Cc, Bc)           # [b, nc, ng, q, q]
    y = torch.einsum("bcgrls,bcgrsp->bcgrlp", cb.unsqueeze(3) * decay, u)

    # 2. each chunk's final state.
    to_end = torch.exp(cs[..., -1:] - cs)                     # [b, nc, ng, r, q]
    states = torch.einsum("bcgsn,bcgrsp->bcgrpn", Bc, u * to_end.unsqueeze(-1))

    # 3. the state entering each chunk: decay matrix over chunk totals times the stacked states.
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)  # [b, nc+1, ng, r, hd, ds]
    totals = F.pad(cs[..., -1].permute(0, 2, 3, 1), (1, 0))   # [b, ng, r, nc+1]
    chunk_decay = torch.exp(segsum(totals))                   # [b, ng, r, nc+1, nc+1]
    entering = torch.einsum("bgrzc,bcgrpn->bzgrpn", chunk_decay, states)[:, :-1]

    # 4. the entering state's contribution inside each chunk.
    y_off = torch.einsum("bcgln,bcgrpn->bcgrlp", Cc, entering) * torch.exp(cs).unsqueeze(-1)
    y = (y + y_off).permute(0, 1, 4, 2, 3, 5).reshape(b, nc * q, nh, hd)
    return y[:, :s]


class Mamba(nn.Module):  # 'M': x + mixer(x)
    def __init__(self, a):
        super().__init__()
        h, hd = a.hidden, a.head_dim
        self.hd, self.nh = hd, a.mamba_heads or 2 * h // hd
        self.ng, self.ds, self.chunk = a.mamba_groups, a.state, a.chunk
        self.di = self.nh * hd
        self.conv_dim = self.di + 2 * self.ng * self.ds
        self.in_norm = RMSNorm(h, 1e-5)
        self.in_proj = nn.Linear(h, self.di + self.conv_dim + self.nh, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, 4, groups=self.conv_dim, padding=3,
                                bias=True)
        self.dt_bias = nn.Parameter(torch.empty(self.nh))
        self.A_log = nn.Parameter(torch.empty(self.nh))
        self.D = nn.Parameter(torch.ones(self.nh))
        self.norm = nn.Parameter(torch.ones(self.di))
        self.out_proj = nn.Linear(self.di, h, bias=False)
        with torch.no_grad():
            self.A_log.copy_(torch.empty(self.nh).uniform_(1.0, 16.0).log())
            lo, hi = math.log(1e-3), math.log(1e-1)
            dt = torch.exp(torch.rand(self.nh) * (hi - lo) + lo).clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        nh, hd, ng, ds, di = self.nh, self.hd, self.ng, self.ds, self.di
        z, xbc, dt = self.in_proj(self.in_norm(x)).split([di, self.conv_dim, nh], dim=-1)
        with torch.autocast("cuda", enabled=False):
            xbc = F.conv1d(xbc.float().transpose(1, 2), self.conv1d.weight, self.conv1d.bias,
                           padding=3, groups=self.conv_dim)[..., :s]
            xbc = F.silu(xbc.transpose(1, 2).contiguous())        # [b, s, conv_dim]
            xs, Bm, Cm = xbc.split([di, ng * ds, ng * ds], dim=-1)
            xs = xs.reshape(b, s, nh, hd)
            dt = F.softplus(dt.float() + self.dt_bias)
            A = -torch.exp(self.A_log)
            y = ssd(xs, dt, A, Bm.reshape(b, s, ng, ds), Cm.reshape(b, s, ng, ds), self.chunk)
            y = y + xs * self.D.unsqueeze(-1)
            g = (y.reshape(b, s, di) * F.silu(z.float())).reshape(b, s, ng, di // ng)
            g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)
            g = g.reshape(b, s, di) * self.norm
        return x + self.out_proj(g)


class Model(nn.Module):
    def __init__(self, a, symbols):
        super().__init__()
        kinds = {"M": Mamba, "*": Attention, "-": MLP}
        self.emb = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(kinds[c](a) for c in symbols)
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.out = nn.Linear(a.hidden, a.vocab, bias=False)
        self.out.weight = self.emb.weight  # tied
        n = len(symbols)
        nn.init.normal_(self.emb.weight, 0.0, 0.02)
        for blk in self.blocks:
            if isinstance(blk, Mamba):
                nn.init.normal_(blk.in_proj.weight, 0.0, 0.02)
                nn.init.normal_(blk.out_proj.weight, 0.0, 0.02 / math.sqrt(n))
            elif isinstance(blk, Attention):
                nn.init.normal_(blk.qkv.weight, 0.0, 0.02)
                nn.init.normal_(blk.proj.weight, 0.0, 0.02 / math.sqrt(2 * n))
            else:
                nn.init.normal_(blk.fc1.weight, 0.0, 0.02)
                nn.init.normal_(blk.fc2.weight, 0.0, 0.02 / math.sqrt(2 * n))
        self.cos, self.sin = rope_tables(a.seq, a.hidden // a.heads, 10000.0, "cuda")

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.out(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pattern", default=DEFAULT_PATTERN,
                   help="one symbol per layer: M Mamba-2, * attention, - MLP ('|' ignored)")
    for k, v in dict(hidden=2048, heads=16, groups=8, ffn=5632, vocab=32000, seq=4096, mbs=2,
                     state=128, head_dim=64, mamba_groups=8, mamba_heads=0, chunk=128, steps=12,
                     warmup=4).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    symbols = a.pattern.replace("|", "")
    bad = sorted(set(symbols) - set("M*-"))
    if not symbols or bad:
        p.error(f"--pattern {a.pattern!r}: only M, *, - (and |) are supported, got {bad}")
    nh = a.mamba_heads or 2 * a.hidden // a.head_dim
    if "M" in symbols and nh % a.mamba_groups:
        p.error(f"{nh} Mamba heads do not split into --mamba-groups {a.mamba_groups}")
    impl = "pytorch-compile" if a.compile else "pytorch-eager"
    torch.manual_seed(0)
    model = Model(a, symbols).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=True)
    step_model = torch.compile(model) if a.compile else model
    g = torch.Generator(device="cuda").manual_seed(1)
    times = []
    try:
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
            if step >= a.warmup:
                times.append(time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - only a failing torch.compile is reported, not raised
        if not a.compile or isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        print(json.dumps({"impl": impl, "params": params,
                          "error": f"{type(e).__name__}: {e}"[:2000]}))
        return
    tps = a.mbs * a.seq / statistics.median(times)
    print(json.dumps({"impl": impl, "params": params, "tokens_per_sec": tps, "loss": loss.item(),
                      "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()
