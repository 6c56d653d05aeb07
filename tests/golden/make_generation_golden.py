#!/usr/bin/env python3
"""Golden references from the peer (llama.cpp via llama-cpp-python) for the engine tests.

Writes tests/fixtures/generation_smollm2.json with, for each prompt:
  - the prompt's token ids (so the generation test does not depend on the tokenizer),
  - llama.cpp's greedy continuation (up to 64 tokens, ending at EOS) and the margin between
    its best and second-best logit at every step,
  - whether llama.cpp's continuation is the same when it evaluates the prompt token by
    token instead of as one batch, and how far its top-5 logits move between the two over
    the whole prompt + continuation,
  - the top-5 (token, logit) pairs at the first 16 positions of prompt + continuation,
and tests/fixtures/perplexity_smollm2.json with the perplexity of the first 32K tokens of
tinyshakespeare.txt in windows of 1024 tokens, every token after a window's first scored
(the same quantity `strata perplexity` computes), with the token ids it used.

Usage: python3 tests/golden/make_generation_golden.py --text tinyshakespeare.txt [--model PATH]
       [--ppl-tokens N]   (or --skip-ppl instead of --text)
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

def _chat(question):
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n")


# Prose, code, lists and chat turns. Each is run twice by the peer (prompt evaluated as one
# batch, and token by token): where the two greedy continuations differ, llama.cpp itself
# does not determine the continuation (a near-tie flips with its own evaluation order), so
# the test does not count that prompt towards "identical continuations".
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    _chat("What is the tallest mountain in the world?"),
    "1, 2, 3, 4, 5, 6, 7,",
    "10, 20, 30, 40, 50,",
    _chat("Count from 1 to 30, separated by commas."),
    "Monday, Tuesday, Wednesday, Thursday,",
    _chat("What is 2 + 2?"),
    "import numpy as np\nimport",
    "Q: What is the capital of Germany?\nA:",
    "The sun rises in the",
    _chat("Write a haiku about the sea."),
    "for i in range(10):\n    print(i)\n",
    "Water boils at",
    "Python is a programming language that",
    # Lists whose continuation has no near-tie in llama.cpp's 64 greedy steps (every top-2
    # margin above 1 logit): the prompts on which "identical continuation" is well posed
    # for two runtimes whose logits differ by quantization noise (see golden_test.cc).
    "11, 12, 13, 14, 15,",
    "21, 22, 23, 24, 25,",
    "31, 32, 33, 34, 35,",
    "[1, 2, 3, 4, 5,",
    "{1, 2, 3, 4, 5,",
]


def default_model():
    home = os.environ.get("STRATA_HOME", os.path.expanduser("~/.cache/strata"))
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def log_softmax(row):
    row = row.astype(np.float64)
    m = row.max()
    return row - m - math.log(np.exp(row - m).sum())


def greedy(llm, toks, n_gen, sequential):
    """Greedy continuation (stops after EOS); returns (tokens, margins, logits rows used)."""
    llm.reset()
    if sequential:
        for t in toks:
            llm.eval([t])
    else:
        llm.eval(toks)
    gen, margins = [], []
    for _ in range(n_gen):
        row = np.array(llm.scores[llm.n_tokens - 1])
        s = np.sort(row)
        margins.append(float(s[-1] - s[-2]))
        nxt = int(row.argmax())
        gen.append(nxt)
        if nxt == llm.token_eos():
            break
        llm.eval([nxt])
    return gen, margins


def generation(llm, n_gen=64, n_top=5, n_pos=16):
    out = []
    for prompt in PROMPTS:
        toks = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        gen, margins = greedy(llm, toks, n_gen, sequential=False)
        gen_seq, _ = greedy(llm, toks, n_gen, sequential=True)
        # Logits of prompt + continuation evaluated as one batch and token by token: how
        # far the peer's logits move with its own evaluation order.
        full = toks + gen
        llm.reset()
        llm.eval(full)
        batch_rows = np.array(llm.scores[:len(full)])
        llm.reset()
        for t in full:
            llm.eval([t])
        seq_rows = np.array(llm.scores[:len(full)])
        top = []
        for pos in range(min(n_pos, len(full))):
            row = batch_rows[pos]
            idx = np.argsort(-row, kind="stable")[:n_top]
            top.append([[int(i), float(row[i])] for i in idx])
        self_diff = 0.0
        for pos in range(len(full)):
            idx = np.argsort(-batch_rows[pos], kind="stable")[:n_top]
            self_diff = max(self_diff, float(np.abs(batch_rows[pos][idx] - seq_rows[pos][idx]).max()))
        out.append({"prompt": prompt, "prompt_tokens": toks, "greedy": gen,
                    "greedy_margins": margins, "top5": top,
                    "peer_self_consistent": gen == gen_seq,
                    "peer_self_top5_max_diff": self_diff})
        print(f"prompt {len(out)}: {len(toks)} tokens, self-consistent {gen == gen_seq}, "
              f"self top-5 diff {self_diff:.3f} -> "
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
    ap.add_argument("--text", help="the perplexity text (the fixture's: tinyshakespeare.txt); "
                    "required unless --skip-ppl")
    ap.add_argument("--ppl-tokens", type=int, default=32768)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()
    if not args.skip_ppl and not args.text:
        ap.error("--text FILE is required for the perplexity fixture (it was made from "
                 "tinyshakespeare.txt); --skip-ppl writes the generation fixture alone")

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
