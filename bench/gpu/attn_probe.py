#!/usr/bin/env python3
"""Time causal GQA attention at one training shape under each SDPA backend PyTorch offers, in the
layout weft hands it (q, k, v [b, s, heads, hd] contiguous, viewed as [b, heads, s, hd]) and in
the contiguous [b, heads, s, hd] layout, to see what the attention's choice of kernel could buy.

Per case: forward ms, forward+backward ms (the backward's gradient in the output's layout, as
weft's projection hands it back), TFLOP/s of the causal FLOPs (forward 2 * 2 * b * nh * s^2 * hd
/ 2, backward 2.5x that), and the kernels of one forward+backward with their times.

    python3 bench/gpu/attn_probe.py [--batch 2] [--seq 4096] [--heads 16] [--groups 8] [--hd 128]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gemm_probe import time_ms  # bench/gpu/gemm_probe.py: ms per call after 3 warm-up calls


def tensors(a, layout, expand):
    b, s, nh, ng, hd = a.batch, a.seq, a.heads, a.groups, a.hd
    kv = nh if expand else ng

    def make(h):
        if layout == "bshd":  # weft's: [b, s, h, hd] storage, [b, h, s, hd] view
            t = torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        else:
            t = torch.randn(b, h, s, hd, device="cuda", dtype=torch.bfloat16)
        return t.detach().requires_grad_()

    q, k, v = make(nh), make(kv), make(kv)
    if layout == "bshd":
        g = torch.randn(b, s, nh, hd, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    else:
        g = torch.randn(b, nh, s, hd, device="cuda", dtype=torch.bfloat16)
    return q, k, v, g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    fwd_flop = 2 * 2 * a.batch * a.heads * a.seq * a.seq * a.hd / 2
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}; b {a.batch} s {a.seq} heads {a.heads} groups {a.groups} hd {a.hd}")
    print(f"{'backend':10} {'layout':6} {'gqa':8} {'fwd ms':>8} {'fwd+bwd ms':>10} {'bwd ms':>8} "
          f"{'fwd TF/s':>9} {'bwd TF/s':>9}")
    for name, be in backends.items():
        for layout in ("bshd", "bhsd"):
            for expand in (False, True):
                q, k, v, g = tensors(a, layout, expand)

                def fwd():
                    with torch.no_grad():
                        if be is None:
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not expand)
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not expand)

                def fwdbwd():
                    if be is None:
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not expand)
                    else:
                        with sdpa_kernel(be):
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not expand)
                    o.backward(g)

                tag = "expanded" if expand else "gqa"
                try:
                    tf = time_ms(fwd, a.reps)
                    tb = time_ms(fwdbwd, a.reps)
                except RuntimeError as e:
                    print(f"{name:10} {layout:6} {tag:8} unsupported: {str(e).splitlines()[0][:90]}")
                    continue
                print(f"{name:10} {layout:6} {tag:8} {tf:8.3f} {tb:10.3f} {tb - tf:8.3f} "
                      f"{fwd_flop / tf / 1e9:9.1f} {2.5 * fwd_flop / (tb - tf) / 1e9:9.1f}")
                if layout == "bshd" and not expand:
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                        fwdbwd()
                        torch.cuda.synchronize()
                    kernels = {}
                    for ev in p.events():
                        if ev.device_type == torch.autograd.DeviceType.CUDA:
                            t, n = kernels.get(ev.name, (0.0, 0))
                            kernels[ev.name] = (t + ev.device_time, n + 1)
                    for kname, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
                        print(f"    {t / 1e3:8.3f} ms  {n:3d}x  {kname[:110]}")
                del q, k, v, g


if __name__ == "__main__":
    main()
