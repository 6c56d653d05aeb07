#!/usr/bin/env python3
"""Strata against native llama.cpp on random-weight models with real models' shapes.

For each shape and weight type: writes the GGUF (make_shaped_model for Q4_0 and Q8_0; an F16
file requantized by llama.cpp's llama-quantize for Q4_K_M, so the K mix is llama.cpp's own),
then runs `llama-bench -p PP -n TG -r REPS -t THREADS -fa 0,1` (the faster flash-attention
setting of each test) and `strata bench` on the same file, one after the other, and prints a markdown table: tokens/s of both, their ratio, peak RSS of
both (llama-bench's from /usr/bin/time, Strata's from its own report), and the share of the
machine's read bandwidth one Strata decode step reaches (weight bytes a step streams x
tokens/s, against bench_kernels' 2-thread StreamRead). Files are deleted after their row
unless --keep. Random weights: speed and memory only, the outputs mean nothing.

  python3 bench/models/compare_shapes.py --peer ~/.cache/strata-peer/bin \\
      --shapes llama-3.2-1b,qwen2.5-1.5b --types q4_0,q4_k_m,q8_0 --dir /var/tmp/shapes

--depth N adds decode at depth N (llama-bench -d N -p 0; strata bench -d N --pp 0) with
full KV in RAM, and Strata's disk policy (--kv disk) beside it; it needs --text FILE, the text
the disk policy's key adapters are calibrated on.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p


def make_file(args, shape, typ, env):
    path = os.path.join(args.dir, "%s.%s.gguf" % (shape, typ))
    if os.path.exists(path):
        return path
    maker = os.path.join(args.build, "bench/models/make_shaped_model")
    if typ in ("q4_0", "q8_0", "q4_1", "q4_k", "q6_k", "f16"):
        run([maker, "--shape", shape, "--type", typ, "-o", path])
    else:  # a llama-quantize preset (q4_k_m, q5_k_m, ...) from an F16 original
        f16 = make_file(args, shape, "f16", env)
        run([os.path.join(args.peer, "llama-quantize"), f16, path, typ.upper()], env)
        if not args.keep:
            os.remove(f16)
    return path


def stream_gbps(args):
    # The median of five, with their range: on a shared machine one run can be far off.
    out = run([os.path.join(args.build, "bench/kernels/bench_kernels"),
               "--benchmark_filter=StreamRead/Q4_0/l1b.*threads:2$",
               "--benchmark_repetitions=5"]).stdout
    rates = sorted(float(r) for r in re.findall(r"threads:2 .*GB/s=([0-9.]+)", out))
    if not rates:
        sys.exit("no StreamRead rate in bench_kernels' output:\n" + out)
    return rates[len(rates) // 2], rates[0], rates[-1]


def llama(args, path, env, pp, tg, depth=0):
    cmd = ["/usr/bin/time", "-f", "maxrss %M", os.path.join(args.peer, "llama-bench"), "-m", path,
           "-p", str(pp), "-n", str(tg), "-r", str(args.reps), "-t", str(args.threads), "-o", "json",
           "-fa", args.peer_fa]
    if depth:
        cmd += ["-d", str(depth)]
    p = run(cmd, env)
    rows = json.loads(p.stdout)
    # The peer at its best: with several flash-attention settings, the faster of each test
    # (llama-bench's default, auto, turns it on for the CPU, the slower setting on some
    # machines, most of all at depth).
    speed = {}
    for r in rows:
        test = "pp" if r["n_gen"] == 0 else "tg"
        speed[test] = max(speed.get(test, 0), r["avg_ts"])
    rss = int(re.search(r"maxrss (\d+)", p.stderr).group(1)) * 1024
    return speed, rss


def strata(args, path, pp, tg, depth=0, kv="memory"):
    cmd = [os.path.join(args.build, "bin/strata"), "bench", "-m", path, "--pp", str(pp), "--tg",
           str(tg), "--reps", str(args.reps), "--threads", str(args.threads), "--json",
           "--kv", kv]
    if depth:
        cmd += ["-d", str(depth), "--ctx", str(depth + max(pp, tg) + 16)]
    if kv == "disk":
        cmd += ["--kv-dir", args.kv_dir]
        adapters = os.path.splitext(path)[0] + ".adapters"
        if not os.path.exists(adapters):  # the disk policy's key adapters, made once per file
            run([os.path.join(args.build, "bin/strata"), "calibrate", "-m", path, "--text",
                 args.text, "--threads", str(args.threads), "-o", adapters])
    return json.loads(run(cmd).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", required=True, help="directory of llama-bench and llama-quantize")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--shapes", default="llama-3.2-1b")
    ap.add_argument("--types", default="q4_0,q4_k_m,q8_0")
    ap.add_argument("--dir", default="/var/tmp/strata-shapes", help="where the files are written")
    ap.add_argument("--kv-dir", default="/var/tmp", help="disk KV store for the depth runs")
    ap.add_argument("--text", help="calibration text for the disk policy's adapters, "
                    "required with --depth (the tables in docs/experiments used "
                    "tinyshakespeare.txt)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, help="also decode at this depth")
    ap.add_argument("--keep", action="store_true", help="keep the model files")
    ap.add_argument("--peer-fa", default="0,1",
                    help="llama-bench's -fa values; the faster of each test is reported")
    args = ap.parse_args()
    if args.depth and not args.text:
        ap.error("--text FILE is required with --depth: the disk policy's runs calibrate key "
                 "adapters on it")
    os.makedirs(args.dir, exist_ok=True)
    env = dict(os.environ, LD_LIBRARY_PATH=args.peer)
    bw, bw_lo, bw_hi = stream_gbps(args)
    print("read bandwidth (bench_kernels StreamRead, 2 threads): median of 5 %.1f GB/s "
          "(%.1f-%.1f)\n" % (bw, bw_lo, bw_hi))
    print("| shape | type | pp llama.cpp | pp Strata | ratio | tg llama.cpp | tg Strata | ratio "
          "| RSS llama.cpp MiB | RSS Strata MiB | ratio | tg share of read bandwidth |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        for typ in args.types.split(","):
            path = make_file(args, shape, typ, env)
            ls, lrss = llama(args, path, env, args.pp, args.tg)
            s = strata(args, path, args.pp, args.tg)
            spp, stg = s["pp_tokens_per_second"], s["tg_tokens_per_second"]
            share = stg * s["decode_weight_bytes"] / 1e9 / bw
            print("| %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.0f | %.0f | %.2f | %.0f%% |"
                  % (shape, typ, ls["pp"], spp, spp / ls["pp"], ls["tg"], stg, stg / ls["tg"],
                     lrss / 2**20, s["peak_rss_bytes"] / 2**20, s["peak_rss_bytes"] / lrss,
                     100 * share), flush=True)
            if args.depth:
                ld, _ = llama(args, path, env, 0, args.tg, args.depth)
                sm = strata(args, path, 0, args.tg, args.depth)
                sd = strata(args, path, 0, args.tg, args.depth, "disk")
                print("| %s | %s | depth %d tg: llama.cpp %.1f, Strata full KV %.1f (%.2fx), "
                      "Strata disk KV %.1f (%.2fx of full KV, peak RSS %.0f MiB) |||||||||"
                      % (shape, typ, args.depth, ld["tg"], sm["tg_tokens_per_second"],
                         sm["tg_tokens_per_second"] / ld["tg"], sd["tg_tokens_per_second"],
                         sd["tg_tokens_per_second"] / sm["tg_tokens_per_second"],
                         sd["peak_rss_bytes"] / 2**20), flush=True)
            if not args.keep:
                for f in (path, os.path.splitext(path)[0] + ".adapters"):
                    if os.path.exists(f):
                        os.remove(f)


if __name__ == "__main__":
    main()
