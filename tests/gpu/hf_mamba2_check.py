#!/usr/bin/env python3
"""Checks weft's Mamba-2 mixer against transformers' Mamba2Mixer (its plain-torch path).

Usage: hf_mamba2_check.py FILE.safetensors

FILE is written by weft's test: float32 tensors
  x [b, s, h]   the mixer's input (before its pre-norm)     y [b, s, h]   weft's mixer output
  in_proj.layer_norm_weight [h], in_proj.weight [2di + 2ng ds + nh, h], conv1d.weight
  [conv_dim, 1, 4], conv1d.bias [conv_dim], dt_bias [nh], A_log [nh], D [nh], norm.weight [di],
  out_proj.weight [h, di]
and string metadata hidden, state, head_dim, groups, heads, chunk, eps (the pre-norm's epsilon).

transformers' Mamba2Mixer has no pre-norm (Mamba2Block applies it outside), so the pre-norm is
computed here, in float32: x * rsqrt(mean(x^2) + eps) * in_proj.layer_norm_weight. Then
Mamba2Mixer's plain-torch path (torch_forward in transformers 4.x; forward in eval mode, without
a cache and with the hub kernels unreachable, in 5.x) with weft's weights, in float32 with TF32 off.
Its gated norm (MambaRMSNormGated: multiply by silu(gate), then RMS-normalise over the whole
inner width with eps = config.layer_norm_epsilon, then the weight) equals weft's per-group norm
(eps 1e-5) only with one group, so groups must be 1. dt = softplus(dt + dt_bias) is clamped to
time_step_limit, set to (0, inf): no clamp, as in weft.

Prints one JSON line {"max_abs_diff", "max_rel_diff" (max |diff| / max |y|), "pass": rel < 1e-5,
...}; exits 1 when it does not pass, 2 when the input or the transformers API is not as expected.
"""
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the mixer may look for hub kernels: fail fast

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

TOL = 1e-5
NAMES = ["in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight",
         "out_proj.weight"]


def fail(msg):
    print(json.dumps({"error": msg}))
    sys.exit(2)


def expand_for(h, di):
    """An expand with int(expand * h) == di (what the mixer computes its inner width from)."""
    if di % h == 0:
        return di // h
    e = di / h
    for _ in range(4):
        if int(e * h) == di:
            return e
        e = math.nextafter(e, math.inf)
    fail(f"no float expand gives int(expand * {h}) == {di}")


def build_mixer(meta, device):
    try:
        from transformers.models.mamba2 import modeling_mamba2 as mm
    except ImportError as e:
        fail(f"cannot import transformers.models.mamba2.modeling_mamba2: {e}")
    Config = getattr(mm, "Mamba2Config", None)
    if Config is None:
        from transformers.models.mamba2.configuration_mamba2 import Mamba2Config as Config
    if not hasattr(mm, "Mamba2Mixer"):
        fail("transformers.models.mamba2.modeling_mamba2 has no Mamba2Mixer")
    h, nh, hd = meta["hidden"], meta["heads"], meta["head_dim"]
    kwargs = dict(hidden_size=h, state_size=meta["state"], head_dim=hd, num_heads=nh,
                  n_groups=meta["groups"], expand=expand_for(h, nh * hd), conv_kernel=4,
                  use_conv_bias=True, use_bias=False, chunk_size=meta["chunk"],
                  time_step_limit=(0.0, float("inf")), layer_norm_epsilon=1e-5, rms_norm=True,
                  hidden_act="silu", num_hidden_layers=1, vocab_size=64)
    try:
        config = Config(**kwargs)
    except (ValueError, TypeError) as e:
        # A config validating hidden_size * expand == num_heads * head_dim in floating point may
        # reject a non-integral expand: build a consistent one and set the fields afterwards.
        try:
            config = Config(**dict(kwargs, expand=2, num_heads=2 * h // hd))
            config.expand, config.num_heads = kwargs["expand"], nh
        except Exception as e2:  # noqa: BLE001
            fail(f"Mamba2Config({kwargs}) failed: {e}; fallback failed: {e2}")
    # Newer mixers read config.layer_types[layer_idx]; older configs have no such field.
    if not getattr(config, "layer_types", None):
        try:
            config.layer_types = ["mamba"]
        except Exception:  # noqa: BLE001
            pass
    try:
        mixer = mm.Mamba2Mixer(config, layer_idx=0)
    except Exception as e:  # noqa: BLE001
        fail(f"Mamba2Mixer(config, layer_idx=0) failed: {type(e).__name__}: {e}")
    mixer = mixer.to(device=device, dtype=torch.float32).eval()
    # The mixer reads these from the config; check they came out as weft's.
    want = {"intermediate_size": nh * hd, "num_heads": nh, "head_dim": hd,
            "n_groups": meta["groups"], "ssm_state_size": meta["state"],
            "chunk_size": meta["chunk"]}
    got = {k: getattr(mixer, k, None) for k in want}
    if got != want:
        fail(f"Mamba2Mixer dimensions {got} differ from weft's {want}")
    if tuple(getattr(mixer, "time_step_limit", (0.0, float("inf")))) != (0.0, float("inf")):
        fail(f"Mamba2Mixer.time_step_limit is {mixer.time_step_limit}, want (0, inf)")
    norm = getattr(mixer, "norm", None)
    if norm is None or not hasattr(norm, "weight"):
        fail("Mamba2Mixer has no gated norm 'norm' with a weight")
    for attr in ("variance_epsilon", "eps"):
        if hasattr(norm, attr):
            setattr(norm, attr, 1e-5)  # weft's gated-norm epsilon
    return mixer


def main():
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        raw = f.metadata() or {}
    keys = ["hidden", "state", "head_dim", "groups", "heads", "chunk"]
    missing = [k for k in keys + ["eps"] if k not in raw]
    if missing:
        fail(f"{path}: metadata lacks {missing} (has {sorted(raw)})")
    meta = {k: int(raw[k]) for k in keys}
    eps = float(raw["eps"])
    absent = [n for n in NAMES + ["x", "y", "in_proj.layer_norm_weight"] if n not in tensors]
    if absent:
        fail(f"{path}: tensors {absent} missing (has {sorted(tensors)})")
    if meta["groups"] != 1:
        fail(f"groups = {meta['groups']}: transformers' Mamba2 gated norm spans the whole inner "
             "width, which matches weft's per-group norm only with 1 group")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    mixer = build_mixer(meta, device)
    params = dict(mixer.named_parameters())
    with torch.no_grad():
        for n in NAMES:
            if n not in params:
                fail(f"Mamba2Mixer has no parameter {n!r} (has {sorted(params)})")
            t = tensors[n]
            if tuple(params[n].shape) != tuple(t.shape):
                fail(f"{n}: weft's shape {tuple(t.shape)} vs Mamba2Mixer's {tuple(params[n].shape)}")
            params[n].copy_(t.to(torch.float32))
        extra = sorted(set(params) - set(NAMES))
        if extra:
            fail(f"Mamba2Mixer has parameters weft has not: {extra}")

        x = tensors["x"].to(device=device, dtype=torch.float32)
        w = tensors["in_proj.layer_norm_weight"].to(device=device, dtype=torch.float32)
        xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        # transformers 4.x: torch_forward is the plain-torch path. 5.x: forward in eval mode with
        # no cache runs the torch chunk scan (the fused kernel is only tried when training, and
        # the hub kernels are not reachable offline, so the torch fallbacks run).
        run = getattr(mixer, "torch_forward", None) or mixer.forward
        try:
            out = run(xn)
        except Exception as e:  # noqa: BLE001
            fail(f"Mamba2Mixer {run.__name__}(hidden_states) failed: {type(e).__name__}: {e}")
        if isinstance(out, (tuple, list)):
            out = out[0]
        y = tensors["y"].to(device=device, dtype=torch.float32)
        if tuple(out.shape) != tuple(y.shape):
            fail(f"output shape {tuple(out.shape)} vs weft's {tuple(y.shape)}")
        diff = (out.float() - y).abs().max().item()
        scale = y.abs().max().item()
    rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
    ok = rel < TOL
    import transformers
    print(json.dumps({"max_abs_diff": diff, "max_rel_diff": rel, "pass": ok,
                      "max_abs_y": scale, "shape": list(y.shape), "device": device,
                      "transformers": transformers.__version__, **meta, "eps": eps}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
