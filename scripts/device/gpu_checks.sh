#!/usr/bin/env bash
# Runs on a lent GPU machine after scripts/device/pack.sh's parts were unpacked in /root/dev:
# the CUDA tests with the real model, then beam search at 32 beams with both of a GPU's slow
# tiers. Logs and JSON go to $OUT (what the device tool brings back).
set -uo pipefail
d=/root/dev
out=${OUT:-/tmp/out}
mkdir -p "$out" "$d/slow"
export LD_LIBRARY_PATH=$d/lib
cd "$d"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
STRATA_TEST_MODEL=$d/model.gguf timeout 300 ./bin/cuda_tests 2>&1 | tee "$out/cuda_tests.log" | tail -20
for tier in host disk; do
  extra=()
  [ $tier = disk ] && extra=(--cuda-slow-disk --slow-dir "$d/slow")
  timeout 240 ./bin/bench_beam_search -m model.gguf --text tinyshakespeare.txt --beams 32 \
    --steps 32 --gen 512 --threads 16 --cuda 0 "${extra[@]}" --json "$out/beam_$tier.json" \
    2>&1 | tee "$out/beam_$tier.log" | tail -25
done
