#!/usr/bin/env python3
"""Tables from gpu_checks.sh's JSON lines: strata against llama.cpp per model (pp512, tg128,
GPU memory by nvidia-smi), and the disk policy against full KV in GPU memory and against the
disk policy on the CPU. Usage: summarize.py RUNS.jsonl"""
import json
import sys


def strata(rec):
    out = rec["output"]
    try:
        j = json.loads(out[out.index("{"):out.rindex("}") + 1])
        return j
    except ValueError:
        return None


def llama(rec):
    pp = tg = None
    for line in rec["output"].splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except ValueError:
            continue
        # The median of the repetitions, as strata bench reports: llama-bench's mean includes
        # a first repetition that can run at half speed while the GPU warms up.
        ts = sorted(j.get("samples_ts") or [j.get("avg_ts")])
        med = ts[len(ts) // 2] if len(ts) % 2 else (ts[len(ts) // 2 - 1] + ts[len(ts) // 2]) / 2
        if j.get("n_prompt", 0) > 0 and j.get("n_gen", 0) == 0:
            pp = med
        if j.get("n_gen", 0) > 0 and j.get("n_prompt", 0) == 0:
            tg = med
    return pp, tg


def main():
    recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    by = {r["name"]: r for r in recs}
    for r in recs:
        if r["rc"] != 0:
            print(f"FAILED {r['name']} (exit {r['rc']}): {r['output'][-800:]}\n")
    models = [n[len("strata."):] for n in by if n.startswith("strata.")]
    if models:
        print("| model | llama.cpp pp512 | strata pp512 | ratio | llama.cpp tg128 | strata tg128 "
              "| ratio | GPU MiB llama.cpp | GPU MiB strata | ratio | strata pp512, tg128 without "
              "launch overlap |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for m in models:
            s = strata(by["strata." + m])
            n = by.get("strata-nopdl." + m)
            n = n and strata(n)
            l = by.get("llama." + m)
            lpp, ltg = llama(l) if l else (None, None)
            spp = s and s.get("pp_tokens_per_second")
            stg = s and s.get("tg_tokens_per_second")
            lm = l and l["gpu_peak_mib"] - l["gpu_idle_mib"]
            sm = by["strata." + m]["gpu_peak_mib"] - by["strata." + m]["gpu_idle_mib"]
            f = lambda a, b: f"{a / b:.2f}" if a and b else "-"
            g = lambda v: f"{v:.1f}" if v else "-"
            npp = n and n.get("pp_tokens_per_second")
            ntg = n and n.get("tg_tokens_per_second")
            print(f"| {m} | {g(lpp)} | {g(spp)} | {f(spp, lpp)} | {g(ltg)} | {g(stg)} | "
                  f"{f(stg, ltg)} | {lm or '-'} | {sm} | {f(sm, lm)} | {g(npp)}, {g(ntg)} |")
        print()
    # The same bench with one launch feature off (names strata-VARIANT.MODEL).
    variants = [n for n in by if n.startswith("strata-") and "." in n]
    if variants:
        print("| run | pp512 | tg128 |\n|---|---|---|")
        for n in variants:
            j = strata(by[n])
            g = lambda v: f"{v:.1f}" if v else "-"
            print(f"| {n} | {g(j and j.get('pp_tokens_per_second'))} | "
                  f"{g(j and j.get('tg_tokens_per_second'))} |")
        print()
    disk = [n for n in by if n.startswith("gpu-disk.")]
    if disk:
        print("| run | GPU full KV tg | GPU disk tg | disk/full | CPU disk tg | GPU disk/CPU disk "
              "| GPU disk: GB read, I/O wait s | GPU disk, ms a step: prediction, I/O wait, rest "
              "of the policy, GPU and waits |")
        print("|---|---|---|---|---|---|---|---|")
        for n in disk:
            key = n[len("gpu-disk."):]
            gd = strata(by[n])
            gm = by.get("gpu-memory." + key)
            cd = by.get("cpu-disk." + key)
            gm = gm and strata(gm)
            cd = cd and strata(cd)
            t = lambda j: j.get("tg_tokens_per_second") if j else None
            f = lambda a, b: f"{a / b:.2f}" if a and b else "-"
            g = lambda v: f"{v:.1f}" if v else "-"
            io = (f"{gd.get('kv_bytes_read', 0) / 1e9:.2f}, {gd.get('kv_io_wait_seconds', 0):.2f}"
                  if gd else "-")
            parts = "-"
            if gd and gd.get("tg_seconds_by_part"):
                p = gd["tg_seconds_by_part"]
                # Decode steps (a step serves every sequence of the batch).
                steps = (gd.get("tg", 0) * gd.get("reps", 1)) or 1
                ms = lambda v: f"{1000 * v / steps:.2f}"
                rest = p["kv"] - p.get("kv_predict", 0) - p.get("kv_io_wait", 0)
                parts = (f"{ms(p.get('kv_predict', 0))}, {ms(p.get('kv_io_wait', 0))}, {ms(rest)}, "
                         f"{ms(p['other'])}")
            print(f"| {key} | {g(t(gm))} | {g(t(gd))} | {f(t(gd), t(gm))} | {g(t(cd))} | "
                  f"{f(t(gd), t(cd))} | {io} | {parts} |")
        print()
    for n, r in by.items():
        if n.startswith(("run.", "calibrate.", "disk-read")):
            print(f"{n} (exit {r['rc']}, {r['seconds']:.1f} s):\n{r['output'][-1500:]}\n")


if __name__ == "__main__":
    main()
