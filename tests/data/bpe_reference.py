#!/usr/bin/env python3
"""An independent byte-level BPE reference for weft's GPT2BPETokenizer and HuggingFaceTokenizer.

Written in Python on the `regex` module (Debian python3-regex), the engine GPT-2's own encoder
uses, with GPT-2's merge loop (the lowest-ranked pair, all its occurrences, until none is
ranked) rather than weft's heap; it shares no code with weft.

  bpe_reference.py make DIR    learns merges on a generated multilingual corpus and writes
                               DIR/gpt2/{vocab.json,merges.txt}, three tokenizer directories
                               (DIR/hf_gpt2, DIR/hf_llama3, DIR/hf_qwen: the pipelines of those
                               models' tokenizer.json files) and DIR/texts.jsonl to encode
  bpe_reference.py check KIND TOKDIR JSONL BIN
                               encodes every "text" of JSONL as KIND would (gpt2: vocab.json and
                               merges.txt; hf: tokenizer.json with the post-processor's special
                               tokens, transformers' tokenizer(text); hf-plain: without them), appends
                               the eod, and compares with weft's .bin (uint16 or int32 tokens, as
                               the .idx beside it says); exit 1
                               naming the first document that differs
"""
import json
import os
import random
import struct
import sys
import unicodedata

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_chars():
    """GPT-2's printable stand-ins, one per byte."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHAR = byte_chars()


def to_chars(text):
    return "".join(BYTE_CHAR[b] for b in text.encode("utf-8"))


def bpe(word, ranks):
    """GPT-2's merge loop on a string of stand-ins."""
    parts = list(word)
    while len(parts) > 1:
        pairs = {(parts[i], parts[i + 1]) for i in range(len(parts) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


def corpus(seed, lines):
    rng = random.Random(seed)
    words = ["the", "model", "trains", "tokens", "weft", "gradient", "pipeline", "Expert",
             "caf\u00e9", "na\u00efve", "\u00fcber", "stra\u00dfe", "\u65e5\u672c\u8a9e",
             "\u4e2d\u6587", "\u0645\u0631\u062d\u0628\u0627", "\u043f\u0440\u0438\u0432\u0435\u0442",
             "\U0001F600", "\U0001F680!", "2024", "3.14159", "1,000,000", "I'm", "DON'T", "we'll",
             "x=y+z;", "(a)", "--flag", "\"quoted\"", "e\u0301t\u00e9", "\u212b"]
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "so", "vi", "pe", "da", "\u00e9", "\u00fc",
                 "\u65e5", "\u672c", "Ka", "ST", "7", "42"]
    words += ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(60)]
    out = []
    for _ in range(lines):
        n = rng.randint(3, 14)
        seps = [" ", " ", " ", "  ", "\n", "\t", " \n", "\r\n"]
        out.append("".join(rng.choice(words) + (rng.choice(seps) if k + 1 < n else "")
                           for k in range(n)))
    return out


def learn_merges(texts, count):
    """Plain BPE training on GPT-2-pre-tokenized words (the most frequent pair, then the
    smallest pair on ties)."""
    freq = {}
    for t in texts:
        for w in regex.findall(GPT2_PATTERN, t):
            key = tuple(to_chars(w))
            freq[key] = freq.get(key, 0) + 1
    merges = []
    for _ in range(count):
        pairs = {}
        for word, f in freq.items():
            for i in range(len(word) - 1):
                pairs[word[i:i + 2]] = pairs.get(word[i:i + 2], 0) + f
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
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
    return merges


def make(out_dir):
    texts = corpus(1, 600)
    merges = learn_merges(texts, 350)
    vocab = {BYTE_CHAR[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    eot = len(vocab)
    vocab["<|endoftext|>"] = eot
    os.makedirs(os.path.join(out_dir, "gpt2"), exist_ok=True)
    with open(os.path.join(out_dir, "gpt2", "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "gpt2", "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))

    def added(content, tid, lstrip=False, rstrip=False):
        return {"id": tid, "content": content, "single_word": False, "lstrip": lstrip,
                "rstrip": rstrip, "normalized": False, "special": True}

    def write(name, tj, config):
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)

    def model(ignore_merges, array_merges):
        m = [[a, b] for a, b in merges] if array_merges else [f"{a} {b}" for a, b in merges]
        return {"type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                "byte_fallback": False, "ignore_merges": ignore_merges, "vocab": vocab,
                "merges": m}

    # GPT-2's tokenizer.json: ByteLevel with its own regex, <|endoftext|> added.
    write("hf_gpt2", {
        "version": "1.0", "added_tokens": [added("<|endoftext|>", eot)], "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel"}, "model": model(False, False)},
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})
    # Llama 3's: Split + ByteLevel(use_regex false), ignore_merges, BOS by template, specials
    # past the vocabulary, one with lstrip/rstrip.
    bos, eos, user = eot + 1, eot + 2, eot + 3
    write("hf_llama3", {
        "version": "1.0",
        "added_tokens": [added("<|begin_of_text|>", bos), added("<|end_of_text|>", eos),
                         added("<|user|>", user, lstrip=True, rstrip=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [], "special_tokens": {"<|begin_of_text|>": {
                 "id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel"}, "model": model(True, True)},
        {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}})
    # Qwen's: NFC, Split with single digits, no BOS.
    write("hf_qwen", {
        "version": "1.0", "added_tokens": [added("<|endoftext|>", eot), added("<|im_end|>", eos)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel"}, "model": model(False, False)},
        {"eos_token": "<|endoftext|>", "bos_token": None, "pad_token": "<|endoftext|>"})
    tests = corpus(2, 150) + [
        "", " ", "   leading and trailing   ", "a\n\n\nb", "tabs\t\tand\u3000ideographic space",
        "<|endoftext|> in the text<|endoftext|>", "hi <|user|>  there<|begin_of_text|>x",
        "a\u00a0\u3000<|user|>\u2003\nb <|user|>\u200bc",
        "numbers 1234567 and 12 and 1", "HE'S I'LL We'Ve", "e\u0301 vs \u00e9, \u212b vs \u00c5",
        "\U0001F600\U0001F600 emoji\u200dzwj", "x" * 3000, "!!!???" * 200, "\u00ad soft hyphen",
        "mixed\u00a0nbsp", "trailing newline\n",
        # Unicode's White_Space beyond the ASCII ones (vertical tab, NEL, the line and
        # paragraph separators), around words, alone and in runs
        "vertical\u000btab and\u0085next \u000b\u000b x\u0085", "\u0085\u000b", "a\u2028b\u2029 c\u000b",
        "a\u000b\u000b\u000bb and \u0085\u0085\u0085c"]
    with open(os.path.join(out_dir, "texts.jsonl"), "w", encoding="utf-8") as f:
        for t in tests:
            f.write(json.dumps({"text": t}) + "\n")


class Reference:
    def __init__(self, kind, tok_dir):
        plain = kind == "hf-plain"
        self.template, self.added, self.nfc = ([], []), [], False
        if kind == "gpt2":
            with open(os.path.join(tok_dir, "vocab.json"), encoding="utf-8") as f:
                self.vocab = json.load(f)
            with open(os.path.join(tok_dir, "merges.txt"), encoding="utf-8") as f:
                lines = [l.rstrip("\n") for l in f][1:]
            merges = [tuple(l.split(" ")) for l in lines if l]
            self.splits = [(GPT2_PATTERN, "Isolated")]
            self.ignore_merges = False
            self.eod = self.vocab["<|endoftext|>"]
        else:
            with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
                tj = json.load(f)
            with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
                config = json.load(f)
            m = tj["model"]
            self.vocab = m["vocab"]
            merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]
            self.ignore_merges = m.get("ignore_merges", False)
            self.nfc = (tj["normalizer"] or {}).get("type") == "NFC"
            pre = tj["pre_tokenizer"]
            steps = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
            self.splits = []
            for s in steps:
                if s["type"] == "Split":
                    self.splits.append((s["pattern"]["Regex"], s["behavior"]))
                elif s["type"] == "ByteLevel" and s.get("use_regex", True):
                    self.splits.append((GPT2_PATTERN, "Isolated"))
            self.added = [(a["content"], a["id"], a["lstrip"], a["rstrip"])
                          for a in tj["added_tokens"]]
            post = tj["post_processor"]
            for p in (post["processors"] if post["type"] == "Sequence" else [post]):
                if p["type"] == "TemplateProcessing":
                    before, after, seen = [], [], False
                    for item in p["single"]:
                        if "Sequence" in item:
                            seen = True
                        else:
                            name = item["SpecialToken"]["id"]
                            (after if seen else before).extend(p["special_tokens"][name]["ids"])
                    self.template = ([], []) if plain else (before, after)
            eos = config["eos_token"]
            eos = eos["content"] if isinstance(eos, dict) else eos
            self.eod = next((i for c, i, _, _ in self.added if c == eos), self.vocab.get(eos))
        self.ranks = {pair: r for r, pair in reversed(list(enumerate(merges)))}

    def pieces(self, text):
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        parts = [text]
        for pattern, behavior in self.splits:
            assert behavior == "Isolated"
            out = []
            for p in parts:
                at = 0
                for mt in regex.finditer(pattern, p):
                    out += [x for x in (p[at:mt.start()], mt.group()) if x]
                    at = mt.end()
                if p[at:]:
                    out.append(p[at:])
            parts = out
        return parts

    def encode_plain(self, text):
        ids = []
        for piece in self.pieces(text):
            chars = to_chars(piece)
            if self.ignore_merges and chars in self.vocab:
                ids.append(self.vocab[chars])
                continue
            ids += [self.vocab[t] for t in bpe(chars, self.ranks)]
        return ids

    def encode(self, text):
        ids, at = [], 0
        while True:
            best = None  # (start, -length, ...) leftmost, then longest
            for content, tid, lstrip, rstrip in self.added:
                k = text.find(content, at)
                if k >= 0 and (best is None or (k, -len(content)) < (best[0], -len(best[1]))):
                    best = (k, content, tid, lstrip, rstrip)
            if best is None:
                ids += self.encode_plain(text[at:])
                break
            k, content, tid, lstrip, rstrip = best
            b, e = k, k + len(content)
            def ws(ch):  # Unicode White_Space, as Rust's char::is_whitespace
                return regex.fullmatch(r"\s", ch) is not None
            while lstrip and b > at and ws(text[b - 1]):
                b -= 1
            while rstrip and e < len(text) and ws(text[e]):
                e += 1
            ids += self.encode_plain(text[at:b]) + [tid]
            at = e
        return self.template[0] + ids + self.template[1]


def compare_bin(ref, jsonl, bin_path):
    """Compares weft's .bin with ref.encode(text) + [ref.eod] for every "text" of JSONL (uint16 or
    int32, as the .idx says); the number of tokens equal, or None after naming what differs."""
    with open(bin_path, "rb") as f:
        data = f.read()
    with open(bin_path[:-4] + ".idx", "rb") as f:
        code = f.read(18)[17]  # Megatron's dtype code: 8 uint16, 4 int32
    fmt, size = {8: ("H", 2), 4: ("i", 4)}[code]
    got = list(struct.unpack(f"<{len(data) // size}{fmt}", data))
    at = 0
    with open(jsonl, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            want = ref.encode(json.loads(line)["text"])
            if not want:  # Megatron's preprocess writes no empty document
                continue
            want.append(ref.eod)
            if got[at:at + len(want)] != want:
                print(f"document {n} differs:\n  reference {want[:40]}\n  weft      "
                      f"{got[at:at + len(want)][:40]}")
                return None
            at += len(want)
    if at != len(got):
        print(f"weft wrote {len(got) - at} tokens more than the reference")
        return None
    return at


def check(kind, tok_dir, jsonl, bin_path):
    ref = Reference(kind, tok_dir)
    at = compare_bin(ref, jsonl, bin_path)
    if at is None:
        return 1
    print(f"{kind} {os.path.basename(tok_dir)}: {at} tokens equal")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(check(*sys.argv[2:6]))
