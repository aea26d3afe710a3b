#!/usr/bin/env python3
"""weft's TikTokenizer against tiktoken itself, built as Megatron's TikTokenizer builds it
(megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py: the ranks shifted by the number
of special tokens, the special tokens at ids 0.., Encoding.encode(text, allowed_special="all")),
on the machine where tiktoken is installed (the GPU machine; no network needed).

  tiktoken_check.py WEFT OUTDIR

Two phases, as tests/gpu/hf_tokenizer_check.py: where tiktoken is installed (the GPU machine,
whose weft build has no ICU) run it with WEFT "-"; then, with OUTDIR brought back, run it where
weft has ICU.

builds a vocabulary and a text set with tests/data/tiktoken_reference.py's `make` (texts with
special tokens, vertical tab, NEL, mixed case, digits), runs `weft data preprocess --append-eod`
with patterns v2 and v1, and compares every token with tiktoken's. Exit 1 naming the first
document that differs.
"""
import base64
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data"))
from bpe_reference import compare_bin  # noqa: E402
from tiktoken_reference import DEFAULT_SPECIALS, PATTERN_V1, PATTERN_V2, make  # noqa: E402


class Tiktoken:
    """Megatron's TikTokenizer on the tiktoken library (its default, non-legacy system)."""

    def __init__(self, vocab_path, pattern, vocab_size, num_special=1000):
        import tiktoken
        specials = list(DEFAULT_SPECIALS)
        specials += [f"<SPECIAL_{i}>" for i in range(len(specials), num_special)]
        with open(vocab_path, encoding="utf-8") as f:
            entries = json.load(f)[:vocab_size - num_special]
        ranks = {base64.b64decode(e["token_bytes"]): e["rank"] + num_special for e in entries}
        self.enc = tiktoken.Encoding(name="weft-check", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens={t: i for i, t in enumerate(specials)})
        self.eod = specials.index("</s>")

    def encode(self, text):
        return self.enc.encode(text, allowed_special="all")


class Stored:
    """Phase 2: the ids tiktoken gave, text by text in the file's order."""

    def __init__(self, ids, eod):
        self.ids, self.eod = list(ids), eod

    def encode(self, text):
        return list(self.ids.pop(0))


def main(weft, out):
    """Phase 1 (tiktoken installed): the vocabulary, the texts and tiktoken_{v1,v2}.json;
    phase 2 (WEFT not "-", weft built with ICU): weft's tokens compared with them."""
    os.makedirs(out, exist_ok=True)
    vocab, texts = os.path.join(out, "vocab.json"), os.path.join(out, "texts.jsonl")
    patterns = (("v2", PATTERN_V2), ("v1", PATTERN_V1))
    try:
        import tiktoken
        make(out)
        with open(vocab, encoding="utf-8") as f:
            v = 1000 + len(json.load(f))
        for name, pattern in patterns:
            t = Tiktoken(vocab, pattern, v)
            with open(texts, encoding="utf-8") as f:
                ids = [t.encode(json.loads(line)["text"]) for line in f]
            with open(os.path.join(out, f"tiktoken_{name}.json"), "w") as f:
                json.dump({"version": tiktoken.__version__, "vocab_size": v, "eod": t.eod,
                           "ids": ids}, f)
    except ImportError:
        pass
    if weft == "-":
        return 0
    ok = True
    for name, _ in patterns:
        with open(os.path.join(out, f"tiktoken_{name}.json")) as f:
            ref = json.load(f)
        prefix = os.path.join(out, name)
        r = subprocess.run([weft, "data", "preprocess", "--input", texts, "--output-prefix",
                            prefix, "--append-eod", "--tokenizer-type", "TikTokenizer",
                            "--tokenizer-model", vocab, "--vocab-size", str(ref["vocab_size"]),
                            "--tiktoken-pattern", name], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"weft data preprocess ({name}) failed ({r.returncode}):\n{r.stderr}")
            ok = False
            continue
        at = compare_bin(Stored(ref["ids"], ref["eod"]), texts, prefix + "_text_document.bin")
        if at is None:
            ok = False
        else:
            print(f"TikTokenizer pattern {name}: {at} tokens equal to tiktoken {ref['version']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
