#!/usr/bin/env python3
"""Probe: does an optimizer update on a side stream hide behind the next step's forward?

The 0.8B bench1b shapes (16 layers, hidden 2048, 16 heads, 8 groups, FFN 5632, seq 4096,
micro-batch 2): AdamW over the embedding and 16 layers' float32 state (with bf16 weights
written), and a forward of GEMMs and SDPA. Timed on one stream (update, then forward) and
overlapped: the update on a normal-priority side stream unit by unit, the forward on a
high-priority stream, each layer waiting for its own unit's update. Update kernels: PyTorch's
fused AdamW (plus the bf16 copy), then a one-pass Triton AdamW with a full grid and with
narrower persistent grids. docs/performance.md, "Overlapping the optimizer update".

    python3 bench/gpu/optimizer_overlap_probe.py
"""
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

L, H, FF, T, B, S = 16, 2048, 5632, 8192, 2, 4096
NH, NG, HD = 16, 8, 128
dev = "cuda"
units = [32000 * H] + [H * (H + 2 * NG * HD) + H * H + 3 * H * FF + 2 * H] * L
master = [torch.randn(n, device=dev) * 0.02 for n in units]
grad = [torch.randn(n, device=dev) * 1e-3 for n in units]
exp_avg = [torch.zeros(n, device=dev) for n in units]
exp_avg_sq = [torch.zeros(n, device=dev) for n in units]
steps = [torch.ones((), device=dev) for _ in units]  # the fused op does not count them
weights = [torch.zeros(n, device=dev, dtype=torch.bfloat16) for n in units]


@triton.jit
def adamw_kernel(p, g, m, v, w, n, lr, b1, b2, eps, wd, bc1, bc2_sqrt, BLOCK: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        o = start + tl.arange(0, BLOCK)
        k = o < n
        x, gr = tl.load(p + o, mask=k), tl.load(g + o, mask=k)
        a = tl.load(m + o, mask=k) * b1 + (1 - b1) * gr
        b = tl.load(v + o, mask=k) * b2 + (1 - b2) * gr * gr
        x = x * (1 - lr * wd) - lr / bc1 * a / (tl.sqrt(b) / bc2_sqrt + eps)
        tl.store(p + o, x, mask=k)
        tl.store(m + o, a, mask=k)
        tl.store(v + o, b, mask=k)
        tl.store(w + o, x.to(tl.bfloat16), mask=k)


kernel = {"kind": "torch", "grid": None}


def update(k):
    if kernel["kind"] == "torch":
        torch._fused_adamw_([master[k]], [grad[k]], [exp_avg[k]], [exp_avg_sq[k]], [], [steps[k]],
                            lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.01, eps=1e-8,
                            amsgrad=False, maximize=False)
        weights[k].copy_(master[k])
    else:
        n = units[k]
        grid = (kernel["grid"] or triton.cdiv(n, 1024),)
        adamw_kernel[grid](master[k], grad[k], exp_avg[k], exp_avg_sq[k], weights[k], n, 1e-4, 0.9,
                           0.95, 1e-8, 0.01, 0.1, 0.2, BLOCK=1024)


w_qkv = [torch.randn(H, H + 2 * NG * HD, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
w_o = [torch.randn(H, H, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
w_gu = [torch.randn(H, 2 * FF, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
w_d = [torch.randn(FF, H, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
x0 = torch.randn(T, H, device=dev, dtype=torch.bfloat16)


def forward(ready=None):
    x = x0
    for i in range(L):
        if ready:
            torch.cuda.current_stream().wait_event(ready[i + 1])
        q, k, v = (x @ w_qkv[i]).split([H, NG * HD, NG * HD], -1)
        q = q.view(B, S, NH, HD).transpose(1, 2)
        k = k.view(B, S, NG, HD).transpose(1, 2)
        v = v.view(B, S, NG, HD).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + a.transpose(1, 2).reshape(T, H) @ w_o[i]
        g, u = (x @ w_gu[i]).chunk(2, -1)
        x = x + (F.silu(g) * u) @ w_d[i]


side = torch.cuda.Stream()
normal = torch.cuda.Stream()
high = torch.cuda.Stream(priority=-1)


def serial():
    with torch.cuda.stream(high):
        for k in range(len(units)):
            update(k)
        forward()
    torch.cuda.current_stream().wait_stream(high)


def overlapped(compute):
    ready = [torch.cuda.Event() for _ in units]
    side.wait_stream(torch.cuda.current_stream())
    compute.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for k in range(len(units)):
            update(k)
            ready[k].record()
    with torch.cuda.stream(compute):
        torch.cuda.current_stream().wait_event(ready[0])
        forward(ready)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.current_stream().wait_stream(compute)


def ms(fn, n=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


with torch.no_grad():
    fwd = ms(forward)
    print(f"forward alone {fwd:.2f} ms")
    print("update kernels | update alone | serial | overlapped, normal-priority compute | "
          "overlapped, high-priority compute | saved (best) ms")
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for kind, grid in [("torch", None), ("triton", None), ("triton", 8 * sm), ("triton", 2 * sm),
                       ("triton", sm)]:
        kernel.update(kind=kind, grid=grid)
        alone = ms(lambda: [update(k) for k in range(len(units))])
        ser = ms(serial)
        same = ms(lambda: overlapped(normal))
        hi = ms(lambda: overlapped(high))
        name = kind if grid is None else f"{kind}, grid {grid}"
        print(f"{name} | {alone:.2f} | {ser:.2f} | {same:.2f} | {hi:.2f} | {ser - min(same, hi):.2f}")
