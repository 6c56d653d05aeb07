#!/usr/bin/env python3
"""Tokenizer golden references from the peer (llama.cpp via llama-cpp-python).

Loads the default model's vocabulary (SmolLM2-135M-Instruct, byte-level BPE with the
"smollm" pre-tokenizer) and writes tests/fixtures/tokenizer_smollm2.json: for each test
string the token ids llama.cpp produces (with and without parse_special where it
matters), each token's bytes as llama.cpp renders them (token_to_piece, special=False and
special=True, hex) and the detokenized text. tests/model/tokenizer_golden_test.cc checks
that Strata reproduces every id and every byte.

Usage: python3 tests/golden/make_tokenizer_golden.py --text tinyshakespeare.txt [--model PATH]
       [--out PATH]
Needs: pip install llama-cpp-python (not needed by the tests themselves).
"""
import argparse
import ctypes
import hashlib
import json
import os

import llama_cpp
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")

# (name, text, parse_special values to record)
CASES = [
    ("empty", "", [False]),
    ("ascii_prose", "Hello world! This is a simple test of the tokenizer, nothing more.", [False]),
    ("single_letter", "a", [False]),
    ("single_space", " ", [False]),
    ("accented_latin", "Café naïve façade résumé Ångström Zürich señor Øresund ŒUVRE œuvre",
     [False]),
    ("cjk", "日本語のテキストと中文文本，还有한국어 텍스트。漢字かなカナ", [False]),
    ("emoji", "I ❤️ emoji 😀👍🏽 and 👨‍👩‍👧‍👦 families 🏳️‍🌈 flags 🇫🇷", [False]),
    ("spaces", "a  b   c    d     e", [False]),
    ("only_spaces", "     ", [False]),
    ("tabs_newlines", "\t\ttabs\tand  spaces \n\n\nnewlines\r\nwindows\r\n", [False]),
    ("leading_trailing", "   leading and trailing   ", [False]),
    ("mixed_whitespace", " \t \n mixed \n\t  x\n \n", [False]),
    ("newline_runs", "line1\n\n\n\nline2\n", [False]),
    ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u200be\u2028f", [False]),
    ("digits", "1234567890 3.14159 1,000,000 2024-01-15 0x1F 12345678901234567890", [False]),
    ("unicode_numbers", "Roman Ⅻ, superscript ², fractions ½ ¾, Arabic ٣٤٥, full-width １２３",
     [False]),
    ("code_python", "def f(x):\n    return x**2 + 1  # square\n\n\nclass A:\n\tpass\n", [False]),
    ("code_c", "int main() { printf(\"%d\\n\", a[i]); return 0; }  // done", [False]),
    ("contractions", "I'm sure you're right, it's what we've said: they'll go, he'd've. "
     "DON'T SHOUT, IT'S LOUD. 'quoted' ''", [False]),
    ("typographic_quotes", "it’s ‘quoted’ “double” — dash … ellipsis", [False]),
    ("punctuation", "Hello!!! What?!... (yes) [no] {maybe} <tag> --- *** @user #tag $5 %",
     [False]),
    ("scripts", "naïveté ΑΒΓ αβγ Привет мир שלום עולם مرحبا नमस्ते", [False]),
    ("control_bytes", "bell\x07 eot\x04 del\x7f esc\x1b[0m nul-free", [False]),
    ("special_tokens", "<|im_start|>user\nhi<|im_end|>", [False, True]),
    ("special_adjacent", "<|im_end|><|im_start|>assistant<|endoftext|>", [False, True]),
    ("special_partial", "<|im_start| <|im_end <repo_name><file_sep>x<filename>", [False, True]),
    ("chat", CHAT, [False, True]),
]


def token_piece(model, token, special):
    """The bytes llama.cpp renders for one token (LlamaModel.token_to_piece returns its whole
    32-byte buffer, so call the C function and keep only the length it reports)."""
    size = 256
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_cpp.llama_token_to_piece(model.vocab, token, buf, size, 0, special)
    if n < 0:
        raise RuntimeError(f"token {token}: piece longer than {size} bytes")
    return buf.raw[:n]


def default_model():
    home = os.environ.get("STRATA_HOME", os.path.expanduser("~/.cache/strata"))
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def shakespeare_cases(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # A paragraph from the start and one from the middle (whole lines).
    start = text[:3000]
    start = start[: start.rfind("\n") + 1]
    mid_at = text.find("\n\n", len(text) // 2) + 2
    mid = text[mid_at: mid_at + 2000]
    mid = mid[: mid.rfind("\n") + 1]
    return [("shakespeare_start", start, [False]), ("shakespeare_middle", mid, [False])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures",
                                                  "tokenizer_smollm2.json"))
    ap.add_argument("--text", required=True,
                    help="the text whose start and middle become two cases (the fixture's: "
                    "tinyshakespeare.txt)")
    args = ap.parse_args()
    llm = Llama(model_path=args.model, vocab_only=True, verbose=False)
    model = llm._model
    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()

    cases = []
    for name, text, specials in CASES + shakespeare_cases(args.text):
        for special in specials:
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            with_bos = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            cases.append({
                "name": name,
                "text": text,
                "parse_special": special,
                "ids": ids,
                # add_bos only adds BOS when the model asks for it (SmolLM2 does not).
                "ids_add_bos": with_bos,
                "pieces_hex": [token_piece(model, t, False).hex() for t in ids],
                # Control tokens render as "" unless special; recorded where they can occur.
                "pieces_special_hex": ([token_piece(model, t, True).hex() for t in ids]
                                       if special else None),
                "decoded_hex": llm.detokenize(ids, special=True).hex(),
            })
    out = {
        "generator": "tests/golden/make_tokenizer_golden.py",
        "peer": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "model_sha256": sha,
        "n_vocab": llm.n_vocab(),
        "bos": model.token_bos(),
        "eos": model.token_eos(),
        "cases": cases,
    }
    # One case per line keeps the fixture small and its diffs readable.
    header = {k: v for k, v in out.items() if k != "cases"}
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                            for c in cases))
        f.write("\n]}\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
