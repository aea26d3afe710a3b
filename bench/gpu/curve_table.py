#!/usr/bin/env python3
"""The size-curve table of `bash bench/gpu/run.sh curve`: weft against PyTorch eager and compiled.

Reads, for each size TAG named on the command line (in that order), the files the stage leaves in
DIR:
  TAG.shape.json            {"layers", "hidden", "heads", "groups", "ffn", "vocab", "seq", "mbs"}
  TAG.weft.jsonl, .out      weft train --log-jsonl and its stdout (the log line's
                            "peak memory (MB)": torch's max allocated, MiB)
  TAG.eager.out             bench/gpu/pytorch_llama.py's JSON line (tokens_per_sec, peak_mem_gb)
  TAG.compile.out           the same with --compile-blocks (or --compile)
  TAG.IMPL.rc, .err         the exit status of that run ("skipped": no time left), its stderr
  TAG.plan.json             `weft plan --json` of weft's flags (optional)
and prints one markdown table: size, parameters, seq, micro-batch, then per implementation
tokens/s, MFU and peak GiB, then weft/eager and weft/compile (tokens/s ratios; equal tokens per
step), and one line of weft plan's estimated peak over weft's measured one per size.
tokens/s: weft's median over iterations 4.. (as bench/gpu/mfu.py --weft-jsonl), PyTorch's median
over its timed steps. MFU: bench/gpu/mfu.py's model FLOPs per token for the same shape
over --peak (781 TFLOP/s, the measured dense bf16 matmul of the H200), the same for all three.
Parameters: the exact count of the tied Llama model (embedding counted once), as `weft plan`.
A missing or failed run prints its reason (not run, skipped, timeout, OOM, rc=N) instead; a
failed run that left figures (weft's jsonl grows per iteration) prints them with that reason.
Usage: curve_table.py DIR TAG... [--peak 781e12]
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mfu import flops_per_token  # noqa: E402

IMPLS = ("weft", "eager", "compile")


def llama_params(s):
    """Parameters of the tied Llama model: embedding, per layer qkv, proj, SwiGLU and two norms,
    the final norm."""
    h, hd = s["hidden"], s["hidden"] // s["heads"]
    layer = (h * (s["heads"] + 2 * s["groups"]) * hd + s["heads"] * hd * h
             + 3 * h * s["ffn"] + 2 * h)
    return s["vocab"] * h + s["layers"] * layer + h


def flops(s):
    a = argparse.Namespace(layers=s["layers"], hidden=s["hidden"], heads=s["heads"],
                           groups=s["groups"], ffn=s["ffn"], vocab=s["vocab"], seq=s["seq"],
                           experts=0, topk=0, moe_ffn=0, pattern="")
    return flops_per_token(a)


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def failure(d, tag, impl):
    """Why TAG's IMPL run has no result: its rc file and its error output."""
    rc = read_text(os.path.join(d, f"{tag}.{impl}.rc"))
    if rc is None:
        return "not run"
    rc = rc.strip()
    if rc == "skipped":
        return "skipped"
    if rc in ("124", "137"):
        return "timeout"
    err = "".join(read_text(os.path.join(d, f"{tag}.{impl}.{ext}")) or ""
                  for ext in ("err", "out"))
    if re.search(r"out of memory|OutOfMemoryError", err, re.I):
        return "OOM"
    return f"rc={rc}"


def weft_result(d, tag):
    """(tokens/s, peak GiB) of weft's run, or None."""
    text = read_text(os.path.join(d, f"{tag}.weft.jsonl"))
    if not text:
        return None
    rows = [json.loads(l) for l in text.splitlines() if l.strip()]
    rows = [r for r in rows if "tokens_per_sec" in r]  # not the validation records
    if not rows:
        return None
    tps = statistics.median(r["tokens_per_sec"] for r in rows[3:] or rows)
    log = read_text(os.path.join(d, f"{tag}.weft.out")) or ""
    mem = re.findall(r"peak memory \(MB\): ([0-9.]+)", log)
    return tps, float(mem[-1]) / 1024 if mem else None


def plan_peak_gib(d, tag):
    try:
        with open(os.path.join(d, f"{tag}.plan.json")) as f:
            return json.load(f)["max_peak"] / 2**30
    except (OSError, ValueError, KeyError):
        return None


def pytorch_result(d, tag, impl):
    text = read_text(os.path.join(d, f"{tag}.{impl}.out"))
    try:
        j = json.loads(text.strip().splitlines()[-1])
    except (AttributeError, IndexError, ValueError):
        return None
    if "tokens_per_sec" not in j:
        return None
    return j["tokens_per_sec"], j.get("peak_mem_gb")


def table(d, tags, peak):
    impls_head = " | ".join(f"{i} tokens/s | {i} MFU | {i} peak GiB" for i in IMPLS)
    plan = []  # weft plan's estimated peak / weft's measured peak
    lines = [f"| size | parameters | seq | mbs | {impls_head} | weft/eager | weft/compile |",
             "|" + "---|" * (4 + 3 * len(IMPLS) + 2)]
    for tag in tags:
        try:
            with open(os.path.join(d, f"{tag}.shape.json")) as f:
                s = json.load(f)
        except (OSError, ValueError):
            lines.append(f"| {tag} | (no shape file) |")
            continue
        f = flops(s)
        cells, tps = [], {}
        for impl in IMPLS:
            r = weft_result(d, tag) if impl == "weft" else pytorch_result(d, tag, impl)
            if r is None:
                cells += [failure(d, tag, impl), "", ""]
                continue
            tps[impl] = r[0]
            rc = (read_text(os.path.join(d, f"{tag}.{impl}.rc")) or "0").strip()
            cut = "" if rc == "0" else f" ({failure(d, tag, impl)})"  # e.g. weft's jsonl of a timeout
            if impl == "weft" and r[1]:
                est = plan_peak_gib(d, tag)
                if est is not None:
                    plan.append(f"{tag} {est:.1f}/{r[1]:.1f} = {est / r[1]:.3f}")
            mem = "?" if r[1] is None else f"{r[1]:.1f}"
            cells += [f"{r[0]:,.0f}{cut}", f"{100 * r[0] * f / peak:.1f}%", mem]
        ratios = [f"{tps['weft'] / tps[b]:.2f}x" if "weft" in tps and b in tps else ""
                  for b in ("eager", "compile")]
        row = [tag, f"{llama_params(s):,}", str(s["seq"]), str(s["mbs"])] + cells + ratios
        lines.append("| " + " | ".join(row) + " |")
    if plan:
        lines.append("\nweft plan / measured peak GiB: " + ", ".join(plan))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("tags", nargs="+")
    p.add_argument("--peak", type=float, default=781e12)
    a = p.parse_args()
    print(table(a.dir, a.tags, a.peak))


if __name__ == "__main__":
    main()
