"""Writes a Llama-shaped Hugging Face model directory of random bf16 weights for
tests/checkpoint/hf_import_memory.sh: config.json, two safetensors shards and their index.

Usage: hf_import_memory.py OUT LAYERS HIDDEN FFN VOCAB   (prints the parameter count)
       hf_import_memory.py check HFDIR CKPTDIR   (weft's float32 weights against the bf16 ones)
       hf_import_memory.py same HFDIR1 HFDIR2    (the same bytes for every tensor)
Pure Python (no numpy, no torch): the values are pseudo-random bf16 numbers in [-0.5, 0.5)
drawn from one seeded generator, so the file holds no NaN or infinity.
"""
import json
import os
import random
import struct
import sys


def bf16_block(rng, count):
    # A 64 Ki-value pattern repeated: distinct values within a tensor, cheap to write.
    base = bytes(
        b for _ in range(65536)
        for b in struct.pack("<H", (struct.unpack("<I", struct.pack("<f", rng.random() - 0.5))[0] >> 16)))
    reps, rest = divmod(count, 65536)
    return base * reps + base[: 2 * rest]


def write_shard(path, tensors, rng):
    header, offset = {}, 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in tensors:
            n = 1
            for d in shape:
                n *= d
            f.write(bf16_block(rng, n))


def read_safetensors(path, names):
    """The bytes of those of `names` that the file holds."""
    out = {}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        for name in names:
            if name in header:
                begin, end = header[name]["data_offsets"]
                f.seek(8 + n + begin)
                out[name] = f.read(end - begin)
    return out


def check(hf, ckpt):
    """The embedding, the output layer and layer 0's gate/up (fc1 = gate rows, then up rows):
    each float32 value must be its bf16 value exactly (the bf16 bits, then 16 zero bits)."""
    hf_names = ["model.embed_tokens.weight", "lm_head.weight",
                "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    src = {}
    for file in sorted(os.listdir(hf)):
        if file.endswith(".safetensors"):
            src.update(read_safetensors(os.path.join(hf, file), hf_names))
    dst = read_safetensors(os.path.join(ckpt, "iter_0000000", "shard_00000.safetensors"),
                           ["embedding.word_embeddings.weight@0", "output_layer.weight@0",
                            "decoder.layers.0.mlp.linear_fc1.weight@0"])
    pairs = [("embedding.word_embeddings.weight@0", src["model.embed_tokens.weight"]),
             ("output_layer.weight@0", src["lm_head.weight"]),
             ("decoder.layers.0.mlp.linear_fc1.weight@0",
              src["model.layers.0.mlp.gate_proj.weight"] + src["model.layers.0.mlp.up_proj.weight"])]
    for name, bf16 in pairs:
        f32 = dst[name]
        ok = (len(f32) == 2 * len(bf16) and f32[2::4] == bf16[0::2] and f32[3::4] == bf16[1::2]
              and f32[0::4].count(0) == len(bf16) // 2 and f32[1::4].count(0) == len(bf16) // 2)
        print(f"{name}: {len(f32)} bytes {'equal' if ok else 'DIFFER'}")
        if not ok:
            sys.exit(1)


def same(a, b):
    """Every tensor of Hugging Face directory `a` in `b` with the same bytes, and nothing more."""
    def tensors(d):
        out = {}
        for file in sorted(os.listdir(d)):
            if file.endswith(".safetensors"):
                with open(os.path.join(d, file), "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    header = json.loads(f.read(n))
                out.update({k: (file, n, v) for k, v in header.items() if k != "__metadata__"})
        return out
    ta, tb = tensors(a), tensors(b)
    if sorted(ta) != sorted(tb):
        sys.exit(f"different tensor names: {sorted(set(ta) ^ set(tb))[:5]}")
    for name in ta:
        got = []
        for d, (file, n, v) in ((a, ta[name]), (b, tb[name])):
            begin, end = v["data_offsets"]
            with open(os.path.join(d, file), "rb") as f:
                f.seek(8 + n + begin)
                got.append((v["dtype"], v["shape"], f.read(end - begin)))
        if got[0] != got[1]:
            sys.exit(f"{name} differs")
    print(f"{len(ta)} tensors: the same bytes")


def main():
    if sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
        return
    out, layers, hidden, ffn, vocab = sys.argv[1], *map(int, sys.argv[2:6])
    heads = hidden // 64
    os.makedirs(out, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tensors = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", [hidden]),
                    (p + "self_attn.q_proj.weight", [hidden, hidden]),
                    (p + "self_attn.k_proj.weight", [hidden, hidden]),
                    (p + "self_attn.v_proj.weight", [hidden, hidden]),
                    (p + "self_attn.o_proj.weight", [hidden, hidden]),
                    (p + "post_attention_layernorm.weight", [hidden]),
                    (p + "mlp.gate_proj.weight", [ffn, hidden]),
                    (p + "mlp.up_proj.weight", [ffn, hidden]),
                    (p + "mlp.down_proj.weight", [hidden, ffn])]
    tensors += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    half = len(tensors) // 2
    rng = random.Random(7)
    shards = {"model-00001-of-00002.safetensors": tensors[:half],
              "model-00002-of-00002.safetensors": tensors[half:]}
    weight_map = {}
    for file, part in shards.items():
        write_shard(os.path.join(out, file), part, rng)
        weight_map.update({name: file for name, _ in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    params = sum(eval("*".join(map(str, s))) for _, s in tensors)
    print(params)


if __name__ == "__main__":
    main()
