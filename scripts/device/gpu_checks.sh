#!/usr/bin/env bash
# The GPU checks and benchmarks, run on a separate GPU machine after scripts/device/pack.sh's
# parts were unpacked in /root/dev (see pack.sh for the three commands). Every step has its own
# time limit and goes on after a failure; logs and JSON lines go to $OUT.
#
#   gpu_checks.sh probe    what the machine is: GPU, driver, CPU, disk, libraries
#   gpu_checks.sh tests    the CUDA tests (kernels, forward, captured decode, mapped weights,
#                          the disk policy on the GPU, the real model); the disk policy on
#                          the default model at depth 8192; starts writing the shaped models
#                          in the background for `bench`
#   gpu_checks.sh bench    strata bench against llama-bench on the same files, interleaved,
#                          GPU memory of each by nvidia-smi; the disk policy on the 1B shape
#   gpu_checks.sh speed    quick's tests and speed comparison only, and a prefill profile
#   gpu_checks.sh quick    one command without the default model (binaries and llama-bench
#                          only): the tests that need no real model, the speed comparison on
#                          shaped models (SmolLM2's shape included), full KV and the disk
#                          policy at depth on the 1B shape
set -uo pipefail
mode=${1:?probe, tests or bench}
d=/root/dev
out=${OUT:-/tmp/out}
src=$(pwd)
mkdir -p "$out" "$d/kv" "$d/models"
cd "$d"

# CUDA's libraries from the image (the toolkit or the Python wheels), then ours; looked up
# once per machine.
if [ ! -f "$d/libdirs" ]; then
  for l in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
    find /usr/local /usr/lib /opt -name "$l" 2>/dev/null | head -1 | xargs -r dirname
  done | sort -u | tr '\n' ':' >"$d/libdirs"
fi
export LD_LIBRARY_PATH="$d/lib:$(cat "$d/libdirs")${LD_LIBRARY_PATH:-}"

log=$out/$mode.log
jl=$out/$mode.jsonl
: >"$jl"
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
# run NAME LIMIT CMD...: runs CMD with nvidia-smi sampling the GPU's memory every 100 ms;
# appends {"name", "rc", "gpu_peak_mib", "gpu_idle_mib", "output"} to bench.jsonl.
run() {
  local name=$1 limit=$2
  shift 2
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$d/mem.$name" &
  local mp=$!
  local t0=$(date +%s%N)
  timeout "$limit" "$@" >"$d/out.$name" 2>&1
  local rc=$?
  kill $mp 2>/dev/null
  wait $mp 2>/dev/null
  local peak=$(sort -n "$d/mem.$name" | tail -1)
  local secs=$((($(date +%s%N) - t0) / 1000000))
  python3 - "$name" "$rc" "${peak:-0}" "$base" "$secs" "$d/out.$name" >>"$jl" <<'PY'
import json, sys
name, rc, peak, base, ms, path = sys.argv[1:]
print(json.dumps({"name": name, "rc": int(rc), "gpu_peak_mib": int(peak), "gpu_idle_mib": int(base),
                "seconds": int(ms) / 1000, "output": open(path, errors="replace").read()[-6000:]}))
PY
  echo "== $name rc=$rc peak=${peak}MiB (idle ${base}MiB) ${secs}ms" | tee -a "$log"
  tail -4 "$d/out.$name" | tee -a "$log"
}

# The disk policy at 1/13 of the cache against full KV in GPU memory, and against the disk
# policy on the CPU (all cores), decoding at depth: disk_runs NAME MODEL DEPTH SEQS [cpu].
disk=(--kv disk --kv-dir "$d/kv")
disk_runs() {
  local name=$1 m=$2 depth=$3 seqs=$4 cpu=${5:-}
  run "gpu-memory.$name.d$depth.b$seqs" 200 ./bin/strata bench -m "$m" --device cuda \
    -d "$depth" --pp 0 --tg 64 --reps 1 --seqs "$seqs" --json
  run "gpu-disk.$name.d$depth.b$seqs" 240 ./bin/strata bench -m "$m" --device cuda "${disk[@]}" \
    -d "$depth" --pp 0 --tg 64 --reps 1 --seqs "$seqs" --json
  if [ -n "$cpu" ]; then
    run "cpu-disk.$name.d$depth.b$seqs" 200 ./bin/strata bench -m "$m" -t "$(nproc)" \
      "${disk[@]}" -d "$depth" --pp 0 --tg 64 --reps 1 --seqs "$seqs" --json
  fi
}

# profile NAME CMD...: GPU time per kernel of CMD into $out/prof.NAME.csv, by Nsight Systems
# where the image has it, else by Nsight Compute (one metric, the kernel's duration).
nsys=$(ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
ncu=$(ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute*/ncu 2>/dev/null | head -1)
profile() {
  local name=$1
  shift
  if [ -n "$nsys" ]; then
    timeout 90 "$nsys" profile -t cuda --cuda-graph-trace=node -f true -o "$d/prof.$name" \
      "$@" >"$d/prof.$name.log" 2>&1
    timeout 60 "$nsys" stats -r cuda_gpu_kern_sum -f csv -o "$out/prof.$name" \
      "$d/prof.$name.nsys-rep" >>"$d/prof.$name.log" 2>&1
  elif [ -n "$ncu" ]; then
    timeout 100 "$ncu" --metrics gpu__time_duration.sum --csv --clock-control none -c 3000 \
      "$@" >"$out/prof.$name.csv" 2>"$d/prof.$name.log"
  else
    echo "profile $name: neither nsys nor ncu on this machine" | tee -a "$log"
  fi
  echo "== profile $name rc=$? ($nsys$ncu)" | tee -a "$log"
  tail -3 "$d/prof.$name.log" >>"$log" 2>/dev/null
}

case $mode in
probe)
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem \
      --format=csv
    nproc
    grep -m1 'model name' /proc/cpuinfo
    grep -m1 -o 'avx512[a-z]*' /proc/cpuinfo | head -3
    free -g
    df -h "$d"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    uname -r
  } 2>&1 | tee "$out/probe.txt"
  ;;
tests)
  {
    ldd bin/strata | grep -E 'not found|cublas|icu' || true
    # Shaped models for `bench`, written while the tests run (the session leader survives the
    # end of this command; the files are ready by the next command).
    setsid nohup bash -c "
      for spec in llama-3.2-1b:q4_0 llama-3.2-1b:q4_k llama-3.1-8b:q4_0 llama-3.1-8b:q4_k; do
        ./bin/make_shaped_model --shape \${spec%%:*} --type \${spec##*:} \
          -o models/\${spec%%:*}.\${spec##*:}.gguf.part &&
          mv models/\${spec%%:*}.\${spec##*:}.gguf.part models/\${spec%%:*}.\${spec##*:}.gguf
      done" >"$d/models/make.log" 2>&1 </dev/null &
    STRATA_TEST_MODEL=$d/model.gguf timeout 300 ./bin/cuda_tests 2>&1 | tail -150
    echo "cuda_tests exit ${PIPESTATUS[0]}"
  } 2>&1 | tee "$out/cuda_tests.log"
  disk_runs smollm2 model.gguf 8192 1 cpu
  disk_runs smollm2 model.gguf 8192 8
  # The README's main job on the GPU.
  run "run.gpu-disk" 60 ./bin/strata run -m model.gguf --device cuda "${disk[@]}" \
    -p "The history of the printing press" -n 64 --stats
  ls -la models | tee -a "$log"
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/tests_summary.md"
  ;;
bench)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$log"
  cat models/make.log >>"$log" 2>/dev/null
  for i in $(seq 60); do [ -f models/llama-3.1-8b.q4_k.gguf ] && break; sleep 1; done
  ls -la models | tee -a "$log"
  files=("$d/model.gguf")
  for m in llama-3.2-1b.q4_0 llama-3.2-1b.q4_k llama-3.1-8b.q4_0 llama-3.1-8b.q4_k; do
    [ -f "models/$m.gguf" ] && files+=("$d/models/$m.gguf")
  done
  # 1. Speed against llama.cpp on the same files, same GPU, interleaved.
  for f in "${files[@]}"; do
    n=$(basename "$f" .gguf)
    run "llama.$n" 240 ./llama-bench -m "$f" -p 512 -n 128 -r 3 -ngl 99 -o jsonl
    run "strata.$n" 240 ./bin/strata bench -m "$f" --device cuda --pp 512 --tg 128 --reps 3 \
      --json
  done
  # The weights read in place from the file (an integrated GPU's mode) on the 1B shape.
  run "strata-mapped.llama-3.2-1b.q4_0" 120 ./bin/strata bench \
    -m models/llama-3.2-1b.q4_0.gguf --device cuda --gpu-weights mapped --pp 512 --tg 128 \
    --reps 1 --json
  # 2. The disk policy on the 1B shape (adapters from a short calibration: the weights are
  #    random, so only the speed means anything).
  l1b=models/llama-3.2-1b.q4_0.gguf
  if [ -f $l1b ]; then
    run "calibrate.llama-3.2-1b" 120 ./bin/strata calibrate -m $l1b \
      --text "$src/tuner/data/calibration.txt" --tokens 2048 --window 2048 --ratios 4,8,16,32 \
      -t "$(nproc)"
    disk_runs l1b $l1b 8192 1 cpu
    disk_runs l1b $l1b 8192 8
    disk_runs l1b $l1b 32768 1
  fi
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
  ;;
quick | speed)
  for spec in smollm2-135m:q4_1 llama-3.2-1b:q4_0 llama-3.1-8b:q4_0; do
    ./bin/make_shaped_model --shape ${spec%%:*} --type ${spec##*:} \
      -o models/${spec%%:*}.${spec##*:}.gguf >/dev/null &
  done
  {
    timeout 200 ./bin/cuda_tests --gtest_filter=-CudaRealModelTest.* 2>&1 | tail -80
    echo "cuda_tests exit ${PIPESTATUS[0]}"
  } 2>&1 | tee "$out/cuda_tests.log"
  wait
  for m in smollm2-135m.q4_1 llama-3.2-1b.q4_0 llama-3.1-8b.q4_0; do
    run "llama.$m" 120 ./llama-bench -m "models/$m.gguf" -p 512 -n 128 -r 3 -ngl 99 -o jsonl
    run "strata.$m" 120 ./bin/strata bench -m "models/$m.gguf" --device cuda --pp 512 --tg 128 \
      --reps 3 --json
  done
  l1b=models/llama-3.2-1b.q4_0.gguf
  if [ "$mode" = speed ]; then
    profile pp.strata.l1b ./bin/strata bench -m $l1b --device cuda --pp 512 --tg 0 --reps 1
    python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
    exit 0
  fi
  run "gpu-memory.smollm2.d8192.b1" 60 ./bin/strata bench -m models/smollm2-135m.q4_1.gguf \
    --device cuda -d 8192 --pp 0 --tg 64 --reps 1 --json
  run "calibrate.llama-3.2-1b" 60 ./bin/strata calibrate -m $l1b \
    --text "$src/tuner/data/calibration.txt" --tokens 1024 --window 1024 --ratios 4,8,16,32 \
    -t "$(nproc)"
  disk_runs l1b $l1b 8192 1
  run "gpu-memory.l1b.d8192.b8" 60 ./bin/strata bench -m $l1b --device cuda -d 8192 \
    --pp 0 --tg 64 --reps 1 --seqs 8 --json
  run "gpu-memory.l1b.d32768.b1" 100 ./bin/strata bench -m $l1b --device cuda -d 32768 \
    --pp 0 --tg 64 --reps 1 --json
  disk_runs l1b $l1b 8192 8
  run "cpu-disk.l1b.d8192.b1" 100 ./bin/strata bench -m $l1b -t "$(nproc)" "${disk[@]}" \
    -d 8192 --pp 0 --tg 64 --reps 1 --json
  # Where the time goes, per kernel, for both engines: prefill on the 1B shape, decode on the
  # 8B shape.
  profile pp.strata.l1b ./bin/strata bench -m $l1b --device cuda --pp 512 --tg 0 --reps 1
  profile pp.llama.l1b ./llama-bench -m $l1b -p 512 -n 0 -r 1 -ngl 99
  l8b=models/llama-3.1-8b.q4_0.gguf
  profile tg.strata.l8b ./bin/strata bench -m $l8b --device cuda --pp 0 --tg 4 --reps 1
  profile tg.llama.l8b ./llama-bench -m $l8b -p 0 -n 4 -r 1 -ngl 99
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
  ;;
esac
