#!/usr/bin/env python3
"""weft's byte-level BPE tokenizers against Hugging Face's own (the `tokenizers` library behind
transformers' AutoTokenizer, Megatron's HuggingFaceTokenizer), on the machine where transformers
is installed (the GPU machine; no network needed).

  hf_tokenizer_check.py WEFT OUTDIR

Two phases, so that each runs where it can: with transformers installed it writes the
tokenizers, the texts and OUTDIR/cases.json (transformers' ids); with WEFT (not "-") it runs
weft on them and compares. The GPU machine has transformers but builds weft without ICU; the CPU
machine has ICU but no transformers: run it there with WEFT "-", bring OUTDIR back, and run it
here on the same OUTDIR.

trains three byte-level BPE tokenizers with `tokenizers` on a generated multilingual corpus
(GPT-2's ByteLevel pipeline, also saved as vocab.json + merges.txt; Llama 3's Split +
ByteLevel + ignore_merges + BOS template; Qwen's NFC + Split with single digits), saves each as
transformers' save_pretrained does, runs `weft data preprocess --append-eod` on a text set, and
compares every token of the .bin with AutoTokenizer(text).input_ids + [eos_token_id] (also with
--tokenizer-special-tokens against add_special_tokens({"additional_special_tokens": ...}); and, for
the vocab.json + merges.txt pair, with GPT2BPETokenizer's encoding, where <|endoftext|> in a text
is text). Exit 1 naming the first document that differs.
"""
import json
import os
import random
import struct
import subprocess
import sys


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus(seed, n):
    rng = random.Random(seed)
    words = ["the", "model", "trains", "tokens", "gradient", "caf\u00e9", "na\u00efve",
             "stra\u00dfe", "\u65e5\u672c\u8a9e", "\u043f\u0440\u0438\u0432\u0435\u0442",
             "\u0645\u0631\u062d\u0628\u0627", "\U0001F600", "2024", "3.14159", "I'm", "DON'T",
             "we'll", "x=y+z;", "--flag", "e\u0301t\u00e9", "\u212b", "\u00a0nbsp"]
    syl = ["ka", "lo", "mi", "ne", "ru", "\u00e9", "\u65e5", "ST", "7", "42"]
    words += ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(200)]
    seps = [" ", " ", " ", "  ", "\n", "\t", " \n", "\r\n", "\n\n"]
    out = []
    for _ in range(n):
        m = rng.randint(3, 30)
        out.append("".join(rng.choice(words) + (rng.choice(seps) if k + 1 < m else "")
                           for k in range(m)))
    return out


def build(kind, texts, out):
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors)
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = {"gpt2": ["<|endoftext|>"],
                "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>"],
                "qwen": ["<|endoftext|>", "<|im_end|>"]}[kind]
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "qwen":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=1500, special_tokens=specials, initial_alphabet=alphabet,
                         show_progress=False)
    tok.train_from_iterator(texts, trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    eos = {"gpt2": "<|endoftext|>", "llama3": "<|end_of_text|>", "qwen": "<|endoftext|>"}[kind]
    bos = "<|begin_of_text|>" if kind == "llama3" else None
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos)
    if kind == "llama3":  # lstrip/rstrip on one added token
        from tokenizers import AddedToken
        fast.add_special_tokens({"additional_special_tokens": [
            AddedToken("<|user|>", lstrip=True, rstrip=True, special=True)]})
    fast.save_pretrained(out)
    if kind == "gpt2":
        tok.model.save(out)  # vocab.json, merges.txt


def read_bin(prefix):
    with open(prefix + ".idx", "rb") as f:
        code = f.read(18)[17]
    fmt, size = {8: ("H", 2), 4: ("i", 4)}[code]
    data = open(prefix + ".bin", "rb").read()
    return list(struct.unpack(f"<{len(data) // size}{fmt}", data))


def compare(name, want_docs, got):
    at = 0
    for n, want in enumerate(want_docs, 1):
        if not want:
            continue
        if got[at:at + len(want)] != want:
            print(f"{name}: document {n} differs\n  transformers {want[:40]}\n  weft         "
                  f"{got[at:at + len(want)][:40]}")
            return False
        at += len(want)
    if at != len(got):
        print(f"{name}: weft wrote {len(got) - at} more tokens")
        return False
    print(f"{name}: {at} tokens equal")
    return True


def preprocess(weft, args):
    """weft data preprocess ARGS; False (with weft's message) when it fails."""
    r = subprocess.run([weft, "data", "preprocess"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"weft data preprocess {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r.returncode == 0


def tokens_to_ids(hf, text):
    """hf.convert_tokens_to_ids(hf.tokenize(text)), where a token it maps to None (seen with
    transformers 5 on an added token with lstrip/rstrip, whose token string keeps the spaces it
    absorbed) is recorded as {"token", "id"}: the id tokenizer(text) gives it (its content's)."""
    toks = hf.tokenize(text)
    ids = hf.convert_tokens_to_ids(toks)
    return [i if i is not None else {"token": t, "id": hf.convert_tokens_to_ids(t.strip())}
            for i, t in zip(ids, toks)]


def references(out):
    """Phase 1 (transformers): the tokenizers, the text set and cases.json, each case a name,
    weft's preprocess flags (paths relative to OUTDIR) and transformers' ids per text."""
    from transformers import AutoTokenizer
    texts = corpus(1, 2000)
    tests = corpus(2, 300) + [
        "", " ", "   leading and trailing   ", "a\n\n\nb", "<|endoftext|> in text<|endoftext|>",
        "hi <|user|>  there<|begin_of_text|>x", "numbers 1234567 and 12", "HE'S I'LL We'Ve",
        "e\u0301 vs \u00e9, \u212b", "\U0001F600\U0001F600 emoji\u200dzwj", "x" * 3000,
        "!!!???" * 200, "mixed\u00a0nbsp", "trailing newline\n", "\u00ad soft hyphen",
        "vertical\u000btab and\u0085next \u000b\u000b x\u0085", "\u0085\u000b", "a\u2028b\u2029 c\u000b",
        "a\u000b\u000b\u000bb and \u0085\u0085\u0085c",
        "tool <|tool|>the<|end_tool|> done the", "<|tool|><|tool|>x<|end_tool|", "the<|tool|"]
    with open(os.path.join(out, "texts.jsonl"), "w", encoding="utf-8") as f:
        for t in tests:
            f.write(json.dumps({"text": t}) + "\n")
    cases = []
    for kind in ("gpt2", "llama3", "qwen"):
        d = os.path.join(out, kind)
        build(kind, texts, d)
        hf = AutoTokenizer.from_pretrained(d)
        eos = [hf.eos_token_id]
        hf_flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kind]
        # Megatron's default since February 2026: the template's specials, tokenizer(text)
        cases.append({"name": f"HuggingFaceTokenizer {kind}", "flags": hf_flags,
                      "want": [hf(t).input_ids for t in tests], "eod": eos})
        # --tokenizer-hf-no-include-special-tokens: the text's tokens alone (tokenize +
        # convert_tokens_to_ids), Megatron's default before
        cases.append({"name": f"HuggingFaceTokenizer {kind} without the template's specials",
                      "flags": hf_flags + ["--tokenizer-hf-no-include-special-tokens"],
                      "want": [tokens_to_ids(hf, t) for t in tests],
                      "eod": eos})
        # --tokenizer-special-tokens: Megatron's HuggingFaceTokenizer passes them to
        # add_special_tokens({"additional_special_tokens": ...}): two new tokens, a vocabulary
        # token (now split out of the text), an added one and a repeat.
        word = next(w for w in ("the", "ka", "lo") if w in hf.get_vocab())
        extra = ["<|tool|>", word, hf.eos_token, "<|tool|>", "<|end_tool|>"]
        if kind == "llama3":  # an added token with lstrip/rstrip, given again
            extra.append("<|user|>")
        hx = AutoTokenizer.from_pretrained(d)
        hx.add_special_tokens({"additional_special_tokens": extra})
        cases.append({"name": f"HuggingFaceTokenizer {kind} --tokenizer-special-tokens {extra}",
                      "flags": hf_flags + ["--tokenizer-special-tokens"] + extra,
                      "want": [hx(t).input_ids for t in tests], "eod": [hx.eos_token_id]})
        if kind == "gpt2":  # Megatron's GPT2BPETokenizer: transformers' GPT-2 tokenizer on the
            # files; with --legacy-tokenizer its own GPT2Tokenizer, where <|endoftext|> is text
            files = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                     os.path.join(kind, "vocab.json"), "--merge-file",
                     os.path.join(kind, "merges.txt")]
            cases.append({"name": f"GPT2BPETokenizer --tokenizer-special-tokens {extra}",
                          "flags": files + ["--tokenizer-special-tokens"] + extra,
                          "want": [hx(t).input_ids for t in tests], "eod": [hx.eos_token_id]})
            for legacy in (False, True):
                cases.append({"name": f"GPT2BPETokenizer legacy={legacy}",
                              "flags": files + (["--legacy-tokenizer"] if legacy else []),
                              "want": [hf(t, split_special_tokens=legacy).input_ids
                                       for t in tests],
                              "eod": [hf.convert_tokens_to_ids("<|endoftext|>")]})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f)


def check(weft, out):
    """Phase 2 (weft built with ICU): preprocess with each case's flags and compare."""
    with open(os.path.join(out, "cases.json")) as f:
        cases = json.load(f)
    ok = True
    for n, c in enumerate(cases):
        prefix = os.path.join(out, f"w{n}")
        flags = [os.path.join(out, a) if os.path.exists(os.path.join(out, a)) else a
                 for a in c["flags"]]
        if not preprocess(weft, ["--input", os.path.join(out, "texts.jsonl"), "--output-prefix",
                                 prefix, "--append-eod"] + flags):
            ok = False
            continue
        unmapped = [x for w in c["want"] for x in w if isinstance(x, dict)]
        want = [[x["id"] if isinstance(x, dict) else x for x in w] for w in c["want"]]
        want = [w + c["eod"] if w else w for w in want]
        ok &= compare(c["name"], want, read_bin(prefix + "_text_document"))
        if unmapped:  # weft gives the added token's id, as tokenizer(text) does
            print(f"  ({len(unmapped)} token(s) transformers' tokenize + convert_tokens_to_ids "
                  f"maps to None, compared with their content's id: "
                  f"{sorted({(x['token'], x['id']) for x in unmapped})})")
    return ok


def main(weft, out):
    """WEFT "-": phase 1 only; without transformers: phase 2 only, on OUTDIR's cases.json."""
    os.makedirs(out, exist_ok=True)
    try:
        import transformers  # noqa: F401
        references(out)
    except ImportError:
        if not os.path.exists(os.path.join(out, "cases.json")):
            print("neither transformers nor a cases.json in", out)
            return 1
    return 0 if weft == "-" or check(weft, out) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
