#!/usr/bin/env python3
"""llama.cpp's perplexity on llama-quantize's mixes of the default model, for the engine test.

Writes tests/fixtures/perplexity_quant_files.json: for each file (by default the Q4_K_M and
Q5_K_M files that scripts/make_quant_files.sh writes), its size and a checksum of its bytes
(so the test knows it runs on the same file), and llama.cpp's perplexity on the first
windows of the token ids of tests/fixtures/perplexity_smollm2.json (tinyshakespeare, every
token after a window's first scored: the quantity `strata perplexity` computes).

The checksum is the sum and the xor of the file's little-endian 64-bit words (the last one
zero-padded): cheap on both sides, and enough to tell two quantizer outputs apart.

Usage: python3 tests/golden/make_quant_files_golden.py [--dir DIR] [--windows N]
Needs the llama-cpp-python binding (pip install llama-cpp-python, or one built elsewhere,
found through PYTHONPATH and LLAMA_CPP_LIB_PATH) and numpy.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures")


def checksum(path):
    data = np.fromfile(path, dtype=np.uint8)
    pad = (-len(data)) % 8
    words = np.concatenate([data, np.zeros(pad, np.uint8)]).view("<u8")
    with np.errstate(over="ignore"):
        total = int(np.add.reduce(words, dtype=np.uint64))
    return {"bytes": int(len(data)), "word_sum": "%016x" % total,
            "word_xor": "%016x" % int(np.bitwise_xor.reduce(words))}


def window_perplexity(llm, tokens, window, n_windows):
    out = []
    for w in range(n_windows):
        chunk = tokens[w * window:(w + 1) * window]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:window], dtype=np.float64)
        mx = logits.max(axis=1, keepdims=True)
        lse = (mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True)))[:, 0]
        nll = -sum(logits[i, chunk[i + 1]] - lse[i] for i in range(window - 1))
        out.append(math.exp(nll / (window - 1)))
        print(f"window {w + 1}/{n_windows}: ppl {out[-1]:.4f}", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.environ.get(
        "STRATA_HOME", os.path.expanduser("~/.cache/strata")), "quant"))
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with open(os.path.join(FIXTURES, "perplexity_smollm2.json")) as f:
        ref = json.load(f)
    window, tokens = ref["window"], ref["tokens"]
    n_windows = min(args.windows, len(tokens) // window)
    files = {}
    for t in args.types.split(","):
        name = "SmolLM2-135M-Instruct.%s.gguf" % t
        path = os.path.join(args.dir, name)
        llm = Llama(model_path=path, n_ctx=max(2048, window), n_batch=512, n_threads=args.threads,
                    n_threads_batch=args.threads, logits_all=True, verbose=False)
        entry = checksum(path)
        entry["window_perplexity"] = window_perplexity(llm, tokens, window, n_windows)
        files[name] = entry
        del llm
    out = {"source": "perplexity_smollm2.json", "window": window, "windows": n_windows,
           "files": files}
    with open(os.path.join(FIXTURES, "perplexity_quant_files.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
