#!/usr/bin/env python3
"""Summarise a Kineto Chrome trace written by `weft train --profile` (or torch.profiler).

Prints, for the device activity in the trace: the wall span from the first to the last device
event, the time the device was busy (union of kernel/memcpy/memset intervals) and idle, the
longest idle gaps with the device events around them, the time per kind of kernel (matmul, attention, elementwise, reduction, copy, NCCL, other), and the
kernels with the largest total time. Also the host time spent in synchronising CUDA calls.

    python3 bench/gpu/trace_summary.py profile/trace_rank0.json [--top 25] [--iters N] [--gaps N]
"""
import argparse
import collections
import json
import re

KINDS = [
    ("nccl", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|sm\d+_xmma|cublas|matmul", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor", re.I)),
    ("fused", re.compile(r"weft::kernels", re.I)),
    ("reduction", re.compile(r"reduce_kernel|softmax|nll_loss|SoftMax", re.I)),
    ("copy/cast", re.compile(r"copy|(?<!no)cast|CatArray|index|gather|scatter|memcpy|memset|Fill", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise", re.I)),
]


def kind_of(name):
    for k, rx in KINDS:
        if rx.search(name):
            return k
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--iters", type=int, default=1, help="iterations in the trace (per-step figures)")
    ap.add_argument("--gaps", type=int, default=6, help="longest device idle gaps to list")
    a = ap.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    dev = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not dev:
        print("no device events in", a.trace)
        return
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in dev)
    busy, cur_s, cur_e = 0.0, iv[0][0], iv[0][1]
    for s, e in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = iv[-1][1] - iv[0][0]
    n = a.iters
    print(f"device span {span/1e3/n:.2f} ms/iter, busy {busy/1e3/n:.2f} ms/iter ({100*busy/span:.1f}%), "
          f"idle {(span-busy)/1e3/n:.2f} ms/iter, {len(dev)//n} device events/iter")
    # The longest stretches with no device event, with what ran before and after them (at the
    # step boundary: the last optimizer kernel and the next step's first).
    named = sorted(((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
                     e["name"] if e["cat"] == "kernel" else e["cat"]) for e in dev))
    gaps, end, last = [], named[0][1], named[0][2]
    for s0, e0, name in named[1:]:
        if s0 > end:
            gaps.append((s0 - end, last, name))
        if e0 >= end:
            end, last = e0, name
    if a.gaps > 0 and gaps:
        print(f"longest device idle gaps (us: the event before -> the one after; {len(gaps)} gaps in all):")
        for d, before, after in sorted(gaps, reverse=True)[:a.gaps]:
            print(f"  {d:9.1f}  {before[:60]} -> {after[:60]}")
    by_kind = collections.Counter()
    by_name = collections.Counter()
    count = collections.Counter()
    for e in dev:
        name = e["name"] if e["cat"] == "kernel" else e["cat"]
        d = float(e.get("dur", 0))
        by_kind[kind_of(name) if e["cat"] == "kernel" else "copy/cast"] += d
        by_name[name] += d
        count[name] += 1
    total = sum(by_kind.values())
    print("kernel time by kind (ms/iter, share of summed device time):")
    for k, d in by_kind.most_common():
        print(f"  {k:<12} {d/1e3/n:9.2f}  {100*d/total:5.1f}%")
    print(f"top {a.top} kernels (ms/iter, calls/iter, us/call):")
    for name, d in by_name.most_common(a.top):
        c = count[name]
        print(f"  {d/1e3/n:8.2f} {c//n:6d} {d/c:9.1f}  {name[:150]}")
    host = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and \
                re.search(r"Synchronize|Memcpy(?!Async)|EventSynchronize", e.get("name", "")):
            host[e["name"]] += float(e.get("dur", 0))
    if host:
        print("host time in synchronising CUDA calls (ms/iter):")
        for name, d in host.most_common(8):
            print(f"  {d/1e3/n:8.2f}  {name}")
    nops = 0
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            nops += 1
    print(f"{nops//n} CPU-side ATen ops/iter")


if __name__ == "__main__":
    main()
