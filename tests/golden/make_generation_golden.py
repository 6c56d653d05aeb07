#!/usr/bin/env python3
"""Golden references from the peer (llama.cpp via llama-cpp-python) for the engine tests.

Writes tests/fixtures/generation_smollm2.json with, for each prompt:
  - the prompt's token ids (so the generation test does not depend on the tokenizer),
  - llama.cpp's greedy continuation (64 tokens),
  - the top-5 (token, logit) pairs at the first 16 positions of prompt + continuation,
and tests/fixtures/perplexity_smollm2.json with the perplexity of the first 32K tokens of
tinyshakespeare.txt in windows of 1024 tokens, every token after a window's first scored
(the same quantity `strata perplexity` computes), with the token ids it used.

Usage: python3 tests/golden/make_generation_golden.py [--model PATH] [--ppl-tokens N]
Needs: pip install llama-cpp-python numpy (not needed by the tests themselves).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
from llama_cpp import Llama, llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "1, 2, 3, 4, 5, 6, 7,",
]


def default_model():
    home = os.environ.get("STRATA_HOME", os.path.expanduser("~/.cache/strata"))
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def log_softmax(row):
    row = row.astype(np.float64)
    m = row.max()
    return row - m - math.log(np.exp(row - m).sum())


def generation(llm, n_gen=64, n_top=5, n_pos=16):
    out = []
    for prompt in PROMPTS:
        toks = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(toks)
        gen = []
        for _ in range(n_gen):
            row = np.array(llm.scores[llm.n_tokens - 1])
            nxt = int(row.argmax())
            gen.append(nxt)
            llm.eval([nxt])
        seq = toks + gen
        top = []
        for pos in range(min(n_pos, len(seq))):
            row = np.array(llm.scores[pos])
            idx = np.argsort(-row, kind="stable")[:n_top]
            top.append([[int(i), float(row[i])] for i in idx])
        # The margin between the best and second-best logit at each greedy step: a test
        # that sees a different choice can tell whether it was a near-tie.
        margins = []
        for i in range(len(gen)):
            row = np.array(llm.scores[len(toks) - 1 + i])
            s = np.sort(row)
            margins.append(float(s[-1] - s[-2]))
        out.append({"prompt": prompt, "prompt_tokens": toks, "greedy": gen, "top5": top,
                    "greedy_margins": margins})
        print(f"prompt {len(out)}: {len(toks)} tokens -> "
              f"{llm.detokenize(gen).decode('utf-8', 'replace')!r}", file=sys.stderr)
    return out


def perplexity(llm, text, n_tokens, window):
    toks = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)[:n_tokens]
    n_windows = len(toks) // window
    total, scored, per_window = 0.0, 0, []
    for w in range(n_windows):
        chunk = toks[w * window:(w + 1) * window]
        llm.reset()
        llm.eval(chunk)
        nll = 0.0
        for i in range(window - 1):
            ls = log_softmax(np.array(llm.scores[i]))
            nll -= ls[chunk[i + 1]]
        total += nll
        scored += window - 1
        per_window.append(math.exp(nll / (window - 1)))
        print(f"window {w + 1}/{n_windows}: ppl {per_window[-1]:.4f}", file=sys.stderr)
    return {"tokens": toks[:n_windows * window], "window": window, "windows": n_windows,
            "scored": scored, "perplexity": math.exp(total / scored),
            "window_perplexity": per_window}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data",
                                                   "tinyshakespeare.txt"))
    ap.add_argument("--ppl-tokens", type=int, default=32768)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()

    llm = Llama(model_path=args.model, n_ctx=max(2048, args.window), n_batch=512,
                n_threads=args.threads, n_threads_batch=args.threads, logits_all=True,
                verbose=False, seed=0)
    meta = {"peer": "llama.cpp via llama-cpp-python " + __import__("llama_cpp").__version__,
            "model": os.path.basename(args.model),
            "system_info": llama_cpp.llama_print_system_info().decode()}
    os.makedirs(FIXTURES, exist_ok=True)
    gen = {"meta": meta, "prompts": generation(llm)}
    with open(os.path.join(FIXTURES, "generation_smollm2.json"), "w") as f:
        json.dump(gen, f, indent=1)
    if not args.skip_ppl:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        ppl = perplexity(llm, text, args.ppl_tokens, args.window)
        ppl["meta"] = dict(meta, text=os.path.basename(args.text))
        print(f"perplexity {ppl['perplexity']:.4f}", file=sys.stderr)
        with open(os.path.join(FIXTURES, "perplexity_smollm2.json"), "w") as f:
            json.dump(ppl, f)


if __name__ == "__main__":
    main()
