#!/usr/bin/env python3
"""Time each GEMM of one weft training step at a Llama shape, with cuBLAS's default choice and
with other selections, to see what choosing the GEMM algorithm per shape could buy.

For a decoder of L layers (hidden h, heads nh of dim hd, KV groups ng, FFN f, vocabulary V) and T
tokens per micro-batch, the GEMMs are weft's: the forward y = x W^T, the input gradient dy W, and
the weight gradient dy^T x written in float32 (weft's fp32 main gradients, beta 0), for the QKV,
the output projection, the fused gate/up, the down projection and the tied output layer. Per
shape it prints ms per call under:
  default     torch.mm / addmm as weft calls them (ATen's cuBLAS path);
  cublaslt    torch.backends.cuda.preferred_blas_library("cublaslt");
  tunableop   torch.cuda.tunable (PyTorch's per-shape search of cuBLAS/cuBLASLt algorithms);
and the step's total per selection (each shape times its count), with TFLOP/s. The selections
alternate call by call (the GPU's clock falls as it heats); each figure is the best of --rounds.

    python3 bench/gpu/gemm_probe.py [--tokens 8192] [--layers 16] [--hidden 2048] ...
"""
import argparse
import os
import tempfile

import torch


def shapes(a):
    T, h, hd = a.tokens, a.hidden, a.hidden // a.heads
    qkv = (a.heads + 2 * a.groups) * hd
    out = []
    for name, n_out, k_in, count in [("qkv", qkv, h, a.layers), ("proj", h, a.heads * hd, a.layers),
                                     ("gate_up", 2 * a.ffn, h, a.layers), ("down", h, a.ffn, a.layers),
                                     ("lm_head", a.vocab, h, 1)]:
        out.append((f"{name} fwd", (T, k_in), (k_in, n_out), False, count))   # x [T,k] @ W^T [k,n]
        out.append((f"{name} dgrad", (T, n_out), (n_out, k_in), False, count))  # dy [T,n] @ W [n,k]
        out.append((f"{name} wgrad", (n_out, T), (T, k_in), True, count))  # dy^T [n,T] @ x [T,k] -> fp32
    return out


def make(m_k, k_n, fp32_out):
    (m, k), (_, n) = m_k, k_n
    # Row-major operands as weft passes them: x and dy contiguous, W^T a transposed view.
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    c = torch.empty(m, n, device="cuda", dtype=torch.float32 if fp32_out else torch.bfloat16)
    if fp32_out:
        def f():
            torch.addmm(c, a, b, out_dtype=torch.float32, beta=0, out=c)
    else:
        def f():
            torch.mm(a, b, out=c)
    return f


def time_ms(f, reps):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = shapes(a)
    modes = ["default", "cublaslt", "tunableop"]
    torch.cuda.tunable.set_filename(os.path.join(tempfile.mkdtemp(), "tunableop.csv"))
    torch.cuda.tunable.set_max_tuning_duration(200)

    def select(mode):
        torch.backends.cuda.preferred_blas_library("cublaslt" if mode == "cublaslt" else "cublas")
        torch.cuda.tunable.enable(mode == "tunableop")
        torch.cuda.tunable.tuning_enable(mode == "tunableop")

    # The selections alternate shape by shape and round by round, so that the GPU's clock, which
    # falls as it heats under a long run of GEMMs, weighs on all of them alike; the figure of a
    # shape and selection is its best round.
    res = {m: [float("inf")] * len(rows) for m in modes}
    for _ in range(a.rounds):
        for i, (name, mk, kn, fp32_out, count) in enumerate(rows):
            f = make(mk, kn, fp32_out)
            for mode in modes:
                select(mode)
                try:
                    res[mode][i] = min(res[mode][i], time_ms(f, a.reps))
                except Exception as ex:  # a selection that this torch lacks for a shape
                    print(f"{mode} {name}: {type(ex).__name__}: {str(ex)[:120]}")
                    res[mode][i] = float("nan")
    select("default")
    print(f"{'gemm':16s} {'m x k x n':>22s} {'count':>5s} " + " ".join(f"{m:>10s}" for m in modes) + "  TFLOP/s default")
    totals = {m: 0.0 for m in modes}
    flops_total = 0.0
    for i, (name, (m, k), (_, n), _, count) in enumerate(rows):
        fl = 2.0 * m * k * n
        flops_total += fl * count
        for mode in modes:
            totals[mode] += res[mode][i] * count
        print(f"{name:16s} {f'{m} x {k} x {n}':>22s} {count:5d} " +
              " ".join(f"{res[mode][i]:10.4f}" for mode in modes) +
              f"  {fl / res['default'][i] / 1e9:8.1f}")
    print("step total ms " + " ".join(f"{mode} {totals[mode]:.2f} ({flops_total / totals[mode] / 1e9:.1f} TFLOP/s)"
                                      for mode in modes))


if __name__ == "__main__":
    main()
