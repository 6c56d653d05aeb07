#!/usr/bin/env python3
"""Strata against llama.cpp on the same machine, in the same run: prompt processing (pp),
generation (tg) and peak RSS, batch 1, same thread count.

Both are measured the way llama-bench measures: pp = one forward pass over N random prompt
tokens from an empty context; tg = N single-token forward passes from an empty context; no
sampling; the median of --reps runs after one warm-up pass. Each runtime runs in its own
child process so its peak RSS (from wait4) is its own. llama.cpp runs inside Python
(llama-cpp-python); the interpreter's own RSS before the model is loaded is reported and
subtracted, so llama.cpp is not charged for Python.

Usage: python3 bench/compare_llamacpp.py [--strata build/bin/strata] [--model PATH]
           [--threads 2] [--pp 512] [--tg 128] [--reps 3] [--json OUT]
Needs: pip install llama-cpp-python (benchmarks only, never CI).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PEER = r"""
import json, random, resource, statistics, sys, time
def rss():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
model, threads, pp, tg, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
import llama_cpp
from llama_cpp import Llama
base = rss()
llm = Llama(model_path=model, n_ctx=pp + tg, n_batch=max(pp, 1), n_ubatch=max(pp, 1),
            n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
rng = random.Random(42)
prompt = [rng.randrange(llm.n_vocab()) for _ in range(pp)]
llm.reset(); llm.eval([1])  # warm-up
pps, tgs = [], []
for _ in range(reps):
    if pp:
        llm.reset()
        t = time.perf_counter(); llm.eval(prompt); pps.append(pp / (time.perf_counter() - t))
    if tg:
        llm.reset(); tok = 1
        t = time.perf_counter()
        for i in range(tg):
            llm.eval([tok]); tok = (tok * 7919 + i) % llm.n_vocab()
        tgs.append(tg / (time.perf_counter() - t))
print(json.dumps({"pp_tokens_per_second": statistics.median(pps) if pps else 0,
                  "tg_tokens_per_second": statistics.median(tgs) if tgs else 0,
                  "pp_runs": pps, "tg_runs": tgs, "interpreter_rss_bytes": base,
                  "version": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode()}))
"""


def run_child(cmd):
    """Runs cmd, returns (stdout, peak RSS bytes of the child)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace")
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}):\n{err}")
    return text, ru.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "bin", "strata"))
    ap.add_argument("--model", default=os.path.join(
        os.environ.get("STRATA_HOME", os.path.expanduser("~/.cache/strata")),
        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    common = [str(args.threads), str(args.pp), str(args.tg), str(args.reps)]
    peer_out, peer_rss = run_child([sys.executable, "-c", PEER, args.model] + common)
    peer = json.loads(peer_out)
    ours_out, ours_rss = run_child([args.strata, "bench", "-m", args.model, "-t",
                                    str(args.threads), "--pp", str(args.pp), "--tg",
                                    str(args.tg), "--reps", str(args.reps), "--json"])
    ours = json.loads(ours_out)
    peer_rss_net = peer_rss - peer["interpreter_rss_bytes"]

    rows = [
        (f"pp{args.pp} (tok/s)", ours["pp_tokens_per_second"], peer["pp_tokens_per_second"]),
        (f"tg{args.tg} (tok/s)", ours["tg_tokens_per_second"], peer["tg_tokens_per_second"]),
        ("peak RSS (MiB)", ours_rss / 2**20, peer_rss_net / 2**20),
    ]
    print(f"model {os.path.basename(args.model)}, {args.threads} threads, batch 1, "
          f"median of {args.reps} runs; strata kernels {ours['kernels']}; "
          f"llama.cpp {peer['version']} (llama-cpp-python)")
    print(f"llama.cpp peak RSS {peer_rss / 2**20:.1f} MiB minus the Python interpreter's "
          f"{peer['interpreter_rss_bytes'] / 2**20:.1f} MiB before loading the model")
    print("| metric | strata | llama.cpp | strata / llama.cpp |")
    print("|---|---:|---:|---:|")
    for name, a, b in rows:
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"strata": ours, "strata_peak_rss_bytes": ours_rss, "llama_cpp": peer,
                       "llama_cpp_peak_rss_bytes": peer_rss,
                       "llama_cpp_net_rss_bytes": peer_rss_net}, f, indent=2)


if __name__ == "__main__":
    main()
