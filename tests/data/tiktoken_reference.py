#!/usr/bin/env python3
"""An independent reference for weft's TikTokenizer (Megatron's --tokenizer-type TikTokenizer).

Written from tiktoken's and Megatron's behaviour on Python's `regex` module (Debian
python3-regex), with Megatron's split patterns verbatim and tiktoken's merge loop as tiktoken
writes it (rescan every pair after each merge, the leftmost lowest rank first), not weft's heap;
it shares no code with weft.

  tiktoken_reference.py make DIR
      learns byte pair merges on a generated multilingual corpus and writes DIR/vocab.json in
      Megatron's tiktoken form ([{"rank", "token_bytes" (base64), "token_str"}, ...]) and
      DIR/texts.jsonl (texts holding special tokens, vertical tab, NEL, mixed case, digits)
  tiktoken_reference.py check VOCAB JSONL BIN [--pattern v1|v2] [--vocab-size V]
                              [--num-special N] [--legacy] [--special T ...]
      encodes every "text" of JSONL as Megatron's TikTokenizer would, appends the eod (</s>), and
      compares with weft's .bin (uint16 or int32, as the .idx says); exit 1 naming the first
      document that differs
"""
import argparse
import base64
import json
import os
import sys

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_reference import compare_bin, corpus  # noqa: E402  (texts and the .bin comparison)

# Megatron's strings, as its tokenizer module spells them.
PATTERN_V1 = r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
PATTERN_V2 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEFAULT_SPECIALS = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]
LEGACY_SPECIALS = ["<unk>", "<s>", "</s>"]


def learn(texts, count):
    """Byte pair training on v2-split words: the most frequent adjacent pair of byte strings."""
    freq = {}
    for t in texts:
        for w in regex.findall(PATTERN_V2, t):
            key = tuple(bytes([b]) for b in w.encode("utf-8"))
            freq[key] = freq.get(key, 0) + 1
    tokens = []
    for _ in range(count):
        pairs = {}
        for word, f in freq.items():
            for i in range(len(word) - 1):
                pairs[word[i:i + 2]] = pairs.get(word[i:i + 2], 0) + f
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        tokens.append(best[0] + best[1])
        new = {}
        for word, f in freq.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + f
        freq = new
    return tokens


def make(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    texts = corpus(3, 600) + ["HelloWorld CamelCaseWords ALLCAPS and/or a//b\x0bvt\x85nel"] * 20
    texts += ["qq " * 30]  # "qq" a token, "qqq" none: equal ranks side by side in "qqq"
    vocab = [bytes([b]) for b in range(256)]
    seen = set(vocab)
    for t in learn(texts, 500):
        if t not in seen:
            seen.add(t)
            vocab.append(t)
    # tokens no merge reaches (a whole piece equal to one is that token: tiktoken's fast path)
    for t in ["zqxj".encode(), " unreachable".encode(), "\u00e9\u00e9\u00e9".encode()]:
        if t not in seen:
            seen.add(t)
            vocab.append(t)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump([{"rank": i, "token_bytes": base64.b64encode(b).decode("ascii"),
                    "token_str": b.decode("utf-8", errors="replace")}
                   for i, b in enumerate(vocab)], f)
    tests = corpus(4, 150) + [
        "", " ", "   leading and trailing   ", "a\n\n\nb", "tabs\t\tand\u3000ideographic space",
        # "<sep>>" is a special token of the custom list below as well as "<sep>": the longer
        # wins, weft's rule (tiktoken's follows a hash map's order there)
        "<s>begin</s> end <pad><SPECIAL_12><SPECIAL_1> <unk>x", "</s></s>", "<s", "<sep>>",
        "HelloWorld CamelCase ALLCAPS lowerUPPER", "a/b//c\n/ and/or ?!/\n", "x\x0by\x85z\u2028w",
        "numbers 1234567 and 12", "e\u0301 vs \u00e9, \u212b vs \u00c5 \u00e9\u00e9\u00e9",
        "\U0001F600\U0001F600 emoji\u200dzwj", "zqxj zqxj zqxjzqxj unreachable", "qqq qqqqq", "x" * 3000,
        "!!!???" * 200, "\u00ad soft hyphen", "mixed\u00a0nbsp", "trailing newline\n",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u0645\u0631\u062d\u0628\u0627 \u0639\u0627\u0644\u0645"]
    with open(os.path.join(out_dir, "texts.jsonl"), "w", encoding="utf-8") as f:
        for t in tests:
            f.write(json.dumps({"text": t}) + "\n")


def merge(piece, ranks):
    """tiktoken's byte pair merge: rescan all pairs, join the leftmost lowest-ranked."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return [ranks[p] for p in parts]


class Reference:
    def __init__(self, vocab_path, pattern, vocab_size, num_special, legacy, specials):
        self.pattern = PATTERN_V1 if pattern == "v1" else PATTERN_V2
        specials = list(specials) or list(LEGACY_SPECIALS if legacy else DEFAULT_SPECIALS)
        specials += [f"<SPECIAL_{i}>" for i in range(len(specials), num_special)]
        with open(vocab_path, encoding="utf-8") as f:
            entries = json.load(f)[:vocab_size - num_special]
        self.ranks = {base64.b64decode(e["token_bytes"]): e["rank"] + num_special for e in entries}
        self.specials = {} if legacy else {s: i for i, s in enumerate(specials)}
        self.eod = specials.index("</s>")

    def ordinary(self, text):
        ids = []
        for m in regex.finditer(self.pattern, text):
            piece = m.group().encode("utf-8")
            ids += [self.ranks[piece]] if piece in self.ranks else merge(piece, self.ranks)
        return ids

    def encode(self, text):
        if not self.specials:
            return self.ordinary(text)
        alternation = "|".join(regex.escape(s) for s in sorted(self.specials, key=len, reverse=True))
        ids, at = [], 0
        for m in regex.finditer(alternation, text):
            ids += self.ordinary(text[at:m.start()]) + [self.specials[m.group()]]
            at = m.end()
        return ids + self.ordinary(text[at:])


def check(argv):
    p = argparse.ArgumentParser()
    p.add_argument("vocab")
    p.add_argument("jsonl")
    p.add_argument("bin")
    p.add_argument("--pattern", default="v2")
    p.add_argument("--vocab-size", type=int, default=2 ** 17)
    p.add_argument("--num-special", type=int, default=1000)
    p.add_argument("--legacy", action="store_true")
    p.add_argument("--special", nargs="*", default=[])
    a = p.parse_args(argv)
    ref = Reference(a.vocab, a.pattern, a.vocab_size, a.num_special, a.legacy, a.special)
    at = compare_bin(ref, a.jsonl, a.bin)
    if at is None:
        return 1
    print(f"TikTokenizer {a.pattern}{' legacy' if a.legacy else ''}: {at} tokens equal")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2:]))
