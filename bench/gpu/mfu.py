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
Usage: mfu.py TOKENS_PER_SEC [--layers --hidden --heads --groups --ffn --vocab --seq --peak]
                             [--experts (--num-experts) --topk --moe-ffn]
       mfu.py --weft-jsonl FILE ...   (median tokens/s over iterations after the first 3)
"""
import argparse
import json
import statistics


def flops_per_token(a):
    hd = a.hidden // a.heads
    if a.experts > 0:  # active: topk experts of 3*h*f each, plus the router
        mlp = a.topk * 3 * a.hidden * (a.moe_ffn or a.ffn) + a.hidden * a.experts
    else:
        mlp = a.hidden * 2 * a.ffn + a.ffn * a.hidden
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
    a = p.parse_args()
    tps = a.tokens_per_sec
    if a.weft_jsonl:
        rows = [json.loads(l) for l in open(a.weft_jsonl) if l.strip()]
        tps = statistics.median(r["tokens_per_sec"] for r in rows[3:] or rows)
    f = flops_per_token(a)
    print(json.dumps({"tokens_per_sec": tps, "flops_per_token": f, "mfu": tps * f / a.peak}))


if __name__ == "__main__":
    main()
