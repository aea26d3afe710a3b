#!/usr/bin/env python3
"""Baseline for weft's checkpoint benchmark: torch.distributed.checkpoint (DCP) saving and
loading the training state of the ~0.8B model of bench/gpu/pytorch_llama.py on the GPU.

State: the fp32 parameters and AdamW's two fp32 moments after one step (what PyTorch keeps;
weft's bf16 run also keeps bf16 compute weights). Save = dcp.save() with FileSystemWriter
(its default fsyncs every file); load = dcp.load() into the live state after the files were
evicted from the page cache (posix_fadvise DONTNEED). Prints one JSON line per round:
bytes, seconds and GB/s (1e9 bytes) of both.
"""
import argparse
import json
import os
import shutil
import sys
import time

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_llama import Model  # noqa: E402


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def evict(d):
    for r, _, fs in os.walk(d):
        for f in fs:
            fd = os.open(os.path.join(r, f), os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(layers=16, hidden=2048, heads=16, groups=8, ffn=5632, vocab=32000, seq=4096,
                     repeats=2).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--dir", default="/tmp/weft-dcp-bench")
    a = p.parse_args()
    if not torch.distributed.is_initialized():  # one process; DCP plans over a group of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29577")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = Model(a).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    for prm in model.parameters():  # one step materialises both moments
        prm.grad = torch.randn_like(prm) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    torch.cuda.synchronize()
    for r in range(a.repeats):
        shutil.rmtree(a.dir, ignore_errors=True)
        os.sync()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=a.dir)
        torch.cuda.synchronize()
        ts = time.perf_counter() - t0
        nbytes = dir_bytes(a.dir)
        evict(a.dir)
        t0 = time.perf_counter()
        dcp.load(state, checkpoint_id=a.dir)
        torch.cuda.synchronize()
        tl = time.perf_counter() - t0
        print(json.dumps({"impl": "torch.distributed.checkpoint", "round": r, "bytes": nbytes,
                          "save_s": ts, "save_gbps": nbytes / ts / 1e9, "load_s": tl,
                          "load_gbps": nbytes / tl / 1e9}), flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
