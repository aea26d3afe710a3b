#!/usr/bin/env python3
"""Reads weft's TensorBoard event files with TensorBoard's own reader and compares them with
the --log-jsonl of the same run (docs/observability.md).

Usage: tb_check.py TBDIR LOG_JSONL [--interval N]

TBDIR is the run's --tensorboard-dir, N its --tensorboard-log-interval (default 1). Loads TBDIR
with tensorboard.backend.event_processing.event_accumulator.EventAccumulator (which checks
the TFRecord framing and parses the Event protos) and checks, for every iteration line of the
jsonl whose iteration is a multiple of N, that "lm loss", "grad-norm", "learning-rate",
"tokens-per-sec", "iteration-time" (and "mfu", "load_balancing_loss", "mtp loss" where the
jsonl has them) hold the jsonl's values at that step, and for every validation line that
"lm loss validation" does; and that no other step was written. Values are float32 in the file,
so the tolerance is relative 1e-6.

Run by `bash bench/gpu/run.sh tbcheck` on the GPU machine (tensorboard installed there).
Prints one JSON line {"scalars": n, "tags": [...], "mismatches": [...], "pass": ...}; exits 0
when everything matches, 1 when not, 2 when the input is not as expected.
"""
import argparse
import json
import math
import sys


def fail(msg):
    print(json.dumps({"error": msg}))
    sys.exit(2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tbdir")
    p.add_argument("jsonl")
    p.add_argument("--interval", type=int, default=1)
    a = p.parse_args()
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        fail(f"tensorboard is not installed: {e}")
    ea = EventAccumulator(a.tbdir, size_guidance={"scalars": 0})
    ea.Reload()
    tags = sorted(ea.Tags().get("scalars", []))
    if not tags:
        fail(f"{a.tbdir}: no scalars found")
    got = {t: {e.step: e.value for e in ea.Scalars(t)} for t in tags}
    rows = [json.loads(l) for l in open(a.jsonl) if l.strip()]
    if not rows:
        fail(f"{a.jsonl}: empty")

    mismatches, checked = [], 0
    def check(tag, step, want):
        nonlocal checked
        if want is None:
            return
        have = got.get(tag, {}).get(step)
        checked += 1
        if have is None:
            mismatches.append(f"{tag}@{step}: missing (jsonl {want})")
        elif not math.isclose(have, want, rel_tol=1e-6, abs_tol=1e-30):
            mismatches.append(f"{tag}@{step}: {have} vs jsonl {want}")

    train_steps = set()
    for r in rows:
        it = r["iteration"]
        if "test_lm_loss" in r:  # console and JSONL only
            continue
        if "valid_lm_loss" in r:  # a --multiple-validation-sets set: "lm loss validation-NAME"
            suffix = "-" + r["valid_set"] if "valid_set" in r else ""
            check("lm loss validation" + suffix, it, r["valid_lm_loss"])
            continue
        if it % a.interval:
            continue
        train_steps.add(it)
        for tag, key in [("lm loss", "lm_loss"), ("grad-norm", "grad_norm"),
                         ("learning-rate", "lr"), ("tokens-per-sec", "tokens_per_sec"),
                         ("mfu", "mfu")]:
            check(tag, it, r.get(key))
        check("iteration-time", it, r["ms"] / 1000)
        if "load_balancing_loss" in got:
            check("load_balancing_loss", it, r["aux_loss"])
        if "mtp loss" in got:
            check("mtp loss", it, r["mtp_loss"])
    extra = sorted(set(got.get("lm loss", {})) - train_steps)
    if extra:
        mismatches.append(f"lm loss written at steps {extra} that the jsonl does not log")
    ok = not mismatches and checked > 0
    print(json.dumps({"scalars": checked, "tags": tags, "mismatches": mismatches[:20],
                      "pass": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
