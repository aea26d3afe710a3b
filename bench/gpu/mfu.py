#!/usr/bin/env python3
"""MFU of a Llama-style training run: model FLOPs per token times tokens/s over a peak.

FLOPs per token (forward + backward, no recomputation counted):
  6 * (layer parameters + output layer V*h)  +  6 * L * s * h   (causal attention: half of 12*L*s*h)
The embedding lookup is not a matmul and is not counted. The peak is 781 TFLOP/s, a dense bf16
8192^3 matmul measured from C++ on the H200 (docs/performance.md).
Mixture of experts (--experts E > 0, e.g. bench/gpu/pytorch_moe.py): the layer parameters are the
ACTIVE ones, the MLP counting topk * 3*h*f (each chosen expert's fc1 gate and up halves and its
fc2, f = --moe-ffn, or --ffn when that is 0) plus the router h*E instead of the dense 3*h*ffn;
the weights of the E - topk experts a token does not use are not counted, nor are the softmax,
top-k and token permutation of the routing.
Hybrid models (--pattern, weft's --hybrid-layer-pattern, e.g. bench/gpu/pytorch_hybrid.py): the
pattern alone gives the layers (--layers is ignored), one symbol each ('|' is ignored; E and '/'
(MTP) are not supported); per layer, counted as 6 * parameters like the rest:
  '*'  attention   h*(nh+2ng)*hd + nh*hd*h (qkv, proj) + h (its norm), plus 6*s*h for the
                   attention scores (the causal half of 12*s*h, as above), nh = --heads,
                   ng = --groups, hd = h / nh
  '-'  MLP         3*h*ffn + h (its norm)
  'M'  Mamba-2     h*(2*di + 2*G*N + H) (in_proj) + di*h (out_proj) + h (its pre-norm), plus the SSD
                   scan's matmuls, di = H*P, H = --mamba-heads or 2*h/P, P = --head-dim,
                   N = --state, G = --mamba-groups, Q = min(--chunk, s):
                     SSD FLOPs per token = 3 * H * (2*Q*N + 2*Q*P + 2*P*N + 2*P*N)
                   forward per token and head, in the chunked algorithm: 2*Q*N for its row of the
                   intra-chunk scores C.B^T, 2*Q*P for scores x (dt x), 2*P*N for its part of the
                   chunk state (dt x) B^T, 2*P*N for the state-to-output product C.state; times 3
                   for forward and backward. Full Q x Q blocks are counted (the kernels compute
                   them whole), C.B^T per head (although a group's heads could share it). Not
                   counted: the inter-chunk state passing (about 2*P*N*nc/Q per token and head),
                   the conv (8 per channel), the gated norm and other elementwise work, and the
                   conv, dt_bias, A_log, D and norm.weight parameters.
So --pattern of L repetitions of "*-" gives the dense formula of L layers.
--squared-relu (weft's and Megatron's flag): every MLP and expert is fc2(relu(fc1 x)^2) without a
gate, 2*h*f parameters instead of 3*h*f.
Usage: mfu.py TOKENS_PER_SEC [--layers --hidden --heads --groups --ffn --vocab --seq --peak]
                             [--experts (--num-experts) --topk --moe-ffn] [--squared-relu]
                             [--pattern --state --head-dim --mamba-groups --mamba-heads --chunk]
       mfu.py --weft-jsonl FILE ...   (median tokens/s over iterations after the first 3)
"""
import argparse
import json
import statistics


def hybrid_flops_per_token(a):
    h, s = a.hidden, a.seq
    hd = h // a.heads
    g = 2 if a.squared_relu else 3  # fc1 (+ gate) and fc2
    P, N, G = a.head_dim, a.state, a.mamba_groups
    H = a.mamba_heads or 2 * h // P
    di = H * P
    Q = min(a.chunk, s)
    per_layer = {  # (parameters, extra FLOPs per token, forward + backward)
        "*": (h * (a.heads + 2 * a.groups) * hd + a.heads * hd * h + h, 6 * s * h),
        "-": (g * h * a.ffn + h, 0),
        "M": (h * (2 * di + 2 * G * N + H) + di * h + h,
              3 * H * (2 * Q * N + 2 * Q * P + 2 * P * N + 2 * P * N)),
    }
    params, extra = a.vocab * h, 0
    for c in a.pattern.replace("|", ""):
        params += per_layer[c][0]
        extra += per_layer[c][1]
    return 6 * params + extra


def flops_per_token(a):
    if a.pattern:
        return hybrid_flops_per_token(a)
    hd = a.hidden // a.heads
    g = 2 if a.squared_relu else 3  # fc1 (+ gate) and fc2
    if a.experts > 0:  # active: topk experts of g*h*f each, plus the router
        mlp = a.topk * g * a.hidden * (a.moe_ffn or a.ffn) + a.hidden * a.experts
    else:
        mlp = g * a.hidden * a.ffn
    layer = (a.hidden * (a.heads + 2 * a.groups) * hd + a.heads * hd * a.hidden
             + mlp + 2 * a.hidden)
    return 6 * (a.layers * layer + a.vocab * a.hidden) + 6 * a.layers * a.seq * a.hidden


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tokens_per_sec", type=float, nargs="?")
    p.add_argument("--weft-jsonl")
    for k, v in dict(layers=16, hidden=2048, heads=16, groups=8, ffn=5632, vocab=32000,
                     seq=4096).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--experts", "--num-experts", dest="experts", type=int, default=0,
                   help="routed experts per layer; 0: a dense MLP")
    p.add_argument("--topk", type=int, default=2, help="experts per token")
    p.add_argument("--moe-ffn", type=int, default=0, help="expert FFN size; 0: --ffn")
    p.add_argument("--peak", type=float, default=781e12)
    p.add_argument("--squared-relu", action="store_true",
                   help="MLPs and experts without a gate (2*h*f parameters, not 3*h*f)")
    p.add_argument("--pattern", default="",
                   help="hybrid layer pattern (M Mamba-2, * attention, - MLP); replaces --layers")
    p.add_argument("--state", type=int, default=128, help="Mamba state size N")
    p.add_argument("--head-dim", type=int, default=64, help="Mamba head dim P")
    p.add_argument("--mamba-groups", type=int, default=8, help="Mamba groups G of B and C")
    p.add_argument("--mamba-heads", type=int, default=0, help="Mamba heads; 0: 2*hidden/head-dim")
    p.add_argument("--chunk", type=int, default=128, help="SSD chunk length Q")
    a = p.parse_args()
    bad = sorted(set(a.pattern.replace("|", "")) - set("M*-"))
    if bad:
        p.error(f"--pattern {a.pattern!r}: only M, *, - (and |) are supported, got {bad}")
    tps = a.tokens_per_sec
    if a.weft_jsonl:
        rows = [json.loads(l) for l in open(a.weft_jsonl) if l.strip()]
        rows = [r for r in rows if "tokens_per_sec" in r]  # not the validation records
        tps = statistics.median(r["tokens_per_sec"] for r in rows[3:] or rows)
    f = flops_per_token(a)
    print(json.dumps({"tokens_per_sec": tps, "flops_per_token": f, "mfu": tps * f / a.peak}))


if __name__ == "__main__":
    main()
