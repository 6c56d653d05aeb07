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
#   gpu_checks.sh profile  what bounds a decode step, without the peer or the default model:
#                          the tests that need no real model, strata bench on the 1B and 8B
#                          shapes, Nsight Compute's memory and warp-state sections for the
#                          8B decode's kernels and every kernel's duration, a timeline where
#                          the image has Nsight Systems, the disk policy's host time on the 1B
#                          shape
#   gpu_checks.sh search   beam search on the GPU with and without speculative beam
#                          extension, slow tier in pinned host RAM and on the block store,
#                          after `tests` left the default model
#   gpu_checks.sh memcheck the disk policy's decode on the SmolLM2-135M shape at depth 8192
#                          plain, without launch overlap, and under compute-sanitizer
#   gpu_checks.sh disk     the disk policy alone, after `tests` left the default model: on it
#                          at depth 8192 (batch 1 and 8), on the 1B shape at 8192 and 32768
#   gpu_checks.sh rows     the GEMV's launch shapes (STRATA_CUDA_GEMV_ROWS, _PREFETCH) against
#                          llama-bench on shaped models, one sequence and eight; the tests
#                          that need no real model first
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

# calibrate NAME MODEL: the disk policy's adapters for MODEL from a short calibration (shaped
# models have random weights: only the speed of what follows means anything).
calibrate() {
  run "calibrate.$1" 60 ./bin/strata calibrate -m "$2" --text "$src/tuner/data/calibration.txt" \
    --tokens 1024 --window 1024 --ratios 4,8,16,32 -t "$(nproc)"
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
      for spec in llama-3.2-1b:q4_0 llama-3.2-1b:q4_k llama-3.1-8b:q4_0; do
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
  for i in $(seq 60); do [ -f models/llama-3.1-8b.q4_0.gguf ] && break; sleep 1; done
  ls -la models | tee -a "$log"
  files=("$d/model.gguf")
  for m in llama-3.2-1b.q4_0 llama-3.2-1b.q4_k llama-3.1-8b.q4_0; do
    [ -f "models/$m.gguf" ] && files+=("$d/models/$m.gguf")
  done
  # 1. Speed against llama.cpp on the same files, same GPU, interleaved.
  for f in "${files[@]}"; do
    n=$(basename "$f" .gguf)
    run "llama.$n" 240 ./llama-bench -m "$f" -p 512 -n 128 -r 3 -ngl 99 -o jsonl
    run "strata.$n" 240 ./bin/strata bench -m "$f" --device cuda --pp 512 --tg 128 --reps 3 \
      --json
  done
  # Launch overlap (kernels/cuda/launch.cuh) and the resident GEMV grid each turned off, and
  # both (the launches as they were before either).
  for f in "$d/model.gguf" "$d/models/llama-3.2-1b.q4_0.gguf" "$d/models/llama-3.1-8b.q4_0.gguf"; do
    n=$(basename "$f" .gguf)
    [ -f "$f" ] || continue
    run "strata-nopdl.$n" 120 env STRATA_CUDA_PDL=0 STRATA_CUDA_GEMV_RESIDENT=0 ./bin/strata \
      bench -m "$f" --device cuda --pp 512 --tg 128 --reps 3 --json
    run "strata-pdl-only.$n" 120 env STRATA_CUDA_GEMV_RESIDENT=0 ./bin/strata bench -m "$f" \
      --device cuda --pp 0 --tg 128 --reps 3 --json
    run "strata-resident-only.$n" 120 env STRATA_CUDA_PDL=0 ./bin/strata bench -m "$f" \
      --device cuda --pp 0 --tg 128 --reps 3 --json
  done
  # The weights read in place from the file (an integrated GPU's mode) on the 1B shape.
  run "strata-mapped.llama-3.2-1b.q4_0" 120 ./bin/strata bench \
    -m models/llama-3.2-1b.q4_0.gguf --device cuda --gpu-weights mapped --pp 512 --tg 128 \
    --reps 1 --json
  # 2. The disk policy on the 1B shape (adapters from a short calibration: the weights are
  #    random, so only the speed means anything).
  l1b=models/llama-3.2-1b.q4_0.gguf
  if [ -f $l1b ]; then
    calibrate llama-3.2-1b $l1b
    disk_runs l1b $l1b 8192 1 cpu
    disk_runs l1b $l1b 8192 8
    disk_runs l1b $l1b 32768 1
    # What the disk under the store gives a reader that bypasses the page cache (1 GiB).
    dd if=/dev/urandom of="$d/kv/probe" bs=4M count=256 oflag=direct status=none
    run "disk-read" 30 dd if="$d/kv/probe" of=/dev/null bs=4M iflag=direct
    rm -f "$d/kv/probe"
  fi
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
  ;;
profile)
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv | tee "$log"
  echo "nsys: ${nsys:-none}; ncu: ${ncu:-none}" | tee -a "$log"
  l1b=models/llama-3.2-1b.q4_0.gguf
  l8b=models/llama-3.1-8b.q4_0.gguf
  ./bin/make_shaped_model --shape llama-3.2-1b --type q4_0 -o $l1b >/dev/null
  ./bin/make_shaped_model --shape llama-3.1-8b --type q4_0 -o $l8b.part >/dev/null &&
    mv $l8b.part $l8b &
  # The 1B shape while the 8B file is written: speed (prefill goes through cuBLAS), the disk
  # policy's host time.
  run "strata.llama-3.2-1b.q4_0" 90 ./bin/strata bench -m $l1b --device cuda --pp 512 --tg 128 \
    --reps 3 --json
  calibrate llama-3.2-1b $l1b
  disk_runs l1b $l1b 8192 1
  wait
  run "strata.llama-3.1-8b.q4_0" 90 ./bin/strata bench -m $l8b --device cuda --pp 512 --tg 128 \
    --reps 3 --json
  printf 'gpu:\n  graphs: false\n' >"$d/nograph.yaml"
  run "strata-nograph.llama-3.1-8b.q4_0" 60 ./bin/strata bench -m $l8b --device cuda \
    --config "$d/nograph.yaml" --pp 0 --tg 32 --reps 1 --json
  if [ -n "$nsys" ]; then
    for m in $l1b $l8b; do
      n=$(basename $m .gguf)
      timeout 60 "$nsys" profile -t cuda --cuda-graph-trace=node -f true -o "$d/tl.$n" \
        ./bin/strata bench -m $m --device cuda --pp 0 --tg 16 --reps 1 >"$d/tl.$n.log" 2>&1
      timeout 60 "$nsys" stats -r cuda_gpu_trace,cuda_gpu_kern_sum -f csv -o "$out/tl.$n" \
        "$d/tl.$n.nsys-rep" >>"$d/tl.$n.log" 2>&1
      echo "== nsys $n rc=$?" | tee -a "$log"
      tail -3 "$d/tl.$n.log" >>"$log"
    done
  fi
  if [ -n "$ncu" ]; then
    # Four layers of one decode token (past the warm-up pass's kernels), caches flushed per
    # kernel as a model larger than L2 sees them.
    timeout 120 "$ncu" --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --csv \
      --clock-control none -s 340 -c 40 ./bin/strata bench -m $l8b --device cuda --pp 0 \
      --tg 2 --reps 1 >"$out/ncu.sections.l8b.csv" 2>"$d/ncu.sections.log"
    echo "== ncu sections rc=$?" | tee -a "$log"
    tail -3 "$d/ncu.sections.log" >>"$log"
    if [ -z "$nsys" ]; then
      # Every kernel's duration of one 1B decode token, caches as a replay leaves them.
      timeout 60 "$ncu" --metrics gpu__time_duration.sum --csv --clock-control none \
        --cache-control none -s 170 -c 170 ./bin/strata bench -m $l1b --device cuda --pp 0 \
        --tg 2 --reps 1 >"$out/ncu.time.l1b.csv" 2>"$d/ncu.time.log"
      echo "== ncu durations rc=$?" | tee -a "$log"
    fi
  fi
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
  ;;
disk)
  disk_runs smollm2 model.gguf 8192 1 cpu
  l1b=models/llama-3.2-1b.q4_0.gguf
  [ -f $l1b ] || ./bin/make_shaped_model --shape llama-3.2-1b --type q4_0 -o $l1b >/dev/null
  calibrate llama-3.2-1b $l1b
  disk_runs l1b $l1b 8192 1 cpu
  disk_runs l1b $l1b 32768 1
  disk_runs smollm2 model.gguf 8192 8
  disk_runs l1b $l1b 8192 8
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
  ;;
search)
  # Test-time scaling on the GPU, after `tests` left the default model: the balanced schedule
  # with and without speculative beam extension (16, 32 and 64 beams, steps ending at a blank
  # line, fast tier 25% of what the search needs), the slow tier in pinned host RAM and then
  # on the block store. On the GPU a decode pass costs about the same for one token as for a
  # group, so the slots of beams that ended their step are free compute for speculation.
  # The prompt: the start of tuner/data/calibration.txt, which is tinyshakespeare's start, as in
  # the CPU tables of docs/experiments/beam-search.md.
  sargs=(-m model.gguf --cuda 0 --text "$src/tuner/data/calibration.txt" --beams 16,32,64
    --steps 64 --step-delimiter $'\n\n' --schedules d --speculate 0.5 --gen 256)
  run "search.host" 420 ./bin/bench_beam_search "${sargs[@]}" --json "$out/search.host.json"
  run "search.disk" 420 ./bin/bench_beam_search "${sargs[@]}" --cuda-slow-disk --slow-dir "$d/kv" \
    --beams 32 --json "$out/search.disk.json"
  ;;
memcheck)
  # gpu_checks.sh memcheck [MODEL]: MODEL (with its adapters beside it) instead of the shape.
  m=${2:-models/smollm2-135m.q4_1.gguf}
  if [ -z "${2:-}" ]; then
    ./bin/make_shaped_model --shape smollm2-135m --type q4_1 -o $m >/dev/null
    calibrate smollm2 $m
  fi
  run "gpu-disk.smollm2-shape.d8192.b1" 60 ./bin/strata bench -m $m --device cuda "${disk[@]}" \
    -d 8192 --pp 0 --tg 64 --reps 1 --json
  run "gpu-disk-nopdl.smollm2-shape.d8192.b1" 60 env STRATA_CUDA_PDL=0 \
    STRATA_CUDA_GEMV_RESIDENT=0 ./bin/strata bench -m $m --device cuda "${disk[@]}" -d 8192 \
    --pp 0 --tg 64 --reps 1 --json
  san=$(ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
    2>/dev/null | head -1)
  if [ -n "$san" ]; then
    run "memcheck.smollm2-shape.d8192" 150 "$san" --tool memcheck --print-limit 20 ./bin/strata \
      bench -m $m --device cuda "${disk[@]}" -d 8192 --pp 0 --tg 64 --reps 1
    tail -60 "$d/out.memcheck.smollm2-shape.d8192" >"$out/memcheck.txt"
  else
    echo "no compute-sanitizer on this machine" | tee -a "$log"
  fi
  python3 "$src/scripts/device/summarize.py" "$jl" | tee "$out/summary.md"
  ;;
rows)
  models="smollm2-135m.q4_1 llama-3.2-1b.q4_0 llama-3.2-1b.q4_k llama-3.1-8b.q4_0"
  for m in $models; do
    ./bin/make_shaped_model --shape ${m%.*} --type ${m##*.} -o models/$m.gguf >/dev/null &
  done
  {
    timeout 150 ./bin/cuda_tests --gtest_filter=-CudaRealModelTest.* 2>&1 | tail -60
    echo "cuda_tests exit ${PIPESTATUS[0]}"
  } 2>&1 | tee "$out/cuda_tests.log"
  wait
  for m in $models; do
    run "llama.$m" 90 ./llama-bench -m "models/$m.gguf" -p 512 -n 128 -r 3 -ngl 99 -o jsonl
    run "strata.$m" 90 ./bin/strata bench -m "models/$m.gguf" --device cuda --pp 512 --tg 128 \
      --reps 3 --json
    for v in ROWS=1 ROWS=4 PREFETCH=0 PREFETCH=2048 PREFETCH=l2; do
      run "strata-${v,,}.$m" 60 env STRATA_CUDA_GEMV_$v ./bin/strata bench \
        -m "models/$m.gguf" --device cuda --pp 0 --tg 128 --reps 3 --json
    done
  done
  for m in llama-3.2-1b.q4_0 llama-3.1-8b.q4_0; do
    for v in ROWS=2 ROWS=4 PREFETCH=0 PREFETCH=l2; do
      run "strata-${v,,}-b8.$m" 60 env STRATA_CUDA_GEMV_$v ./bin/strata bench \
        -m "models/$m.gguf" --device cuda --pp 0 --tg 64 --seqs 8 --reps 2 --json
    done
  done
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
  calibrate llama-3.2-1b $l1b
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
