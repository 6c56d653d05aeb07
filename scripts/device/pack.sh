#!/usr/bin/env bash
# Packs what scripts/device/gpu_checks.sh needs on a separate GPU machine that receives the
# working tree plus at most 64 MiB of other, git-ignored files per command and keeps them only
# briefly between commands. Four parts, each sent along with one command run there in quick
# succession; the parts land in /root/dev there:
#
#   scripts/device/pack.sh          # here, after a Release build in build/ and, for the
#                                   # comparison, PEER_BENCH=path/to/llama-bench (CUDA build)
#   .dev/bin: the binaries and the shared libraries the GPU machine's image lacks (this
#             machine's ICU, liburing, yaml-cpp, LAPACK), with the default model's adapters
#             (the beam search's prompt is the working tree's tuner/data/calibration.txt)
#   .dev/a, .dev/b: the default model in two pieces (98 MB)
#   .dev/c: the peer's llama-bench (without PEER_BENCH, no part c)
#
#   with .dev/bin and .dev/unpack.sh: bash .dev/unpack.sh bin && scripts/device/gpu_checks.sh profile
#   with .dev/a: bash .dev/unpack.sh a
#   with .dev/b, .dev/bin: bash .dev/unpack.sh b bin && scripts/device/gpu_checks.sh tests
#   with .dev/c: bash .dev/unpack.sh c && scripts/device/gpu_checks.sh bench
#   then, with nothing carried: scripts/device/gpu_checks.sh search
#
# .dev/ is in .git/info/exclude.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${STRATA_TEST_MODEL:-${STRATA_HOME:-$HOME/.cache/strata}/SmolLM2-135M-Instruct.Q4_1.gguf}
adapters=${model%.gguf}.adapters
build=${BUILD:-$root/build}
peer=${PEER_BENCH:-}
cd "$root"
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
rm -rf .dev && mkdir -p .dev/a .dev/b .dev/bin
[ -f "$adapters" ] || { echo "pack.sh: $adapters is missing (scripts/setup.sh makes it)" >&2; exit 1; }
size=$(stat -c %s "$model")
half=58000000
dd if="$model" of=.dev/a/model.0 bs=1M iflag=count_bytes count="$half" status=none
dd if="$model" of=.dev/b/model.1 bs=1M iflag=skip_bytes skip="$half" status=none
cat .dev/a/model.0 .dev/b/model.1 | cmp -s - "$model" ||
  { echo "pack.sh: the model's pieces do not add up to $model" >&2; exit 1; }
# Binaries and the libraries they need beyond glibc, libstdc++ and CUDA's own.
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/bin/strata" "$build/tests/cuda/cuda_tests" "$build/bench/models/make_shaped_model" \
  "$build/bench/search/bench_beam_search" "$stage/bin/"
strip "$stage/bin/"*
for l in $(ldd "$stage/bin/"* | awk '/=>/ {print $3}' | sort -u); do
  case $(basename "$l") in
    libc.so* | libm.so* | libstdc++* | libgcc_s* | librt* | libpthread* | libdl* | libcublas* | \
      libcudart* | libcuda.so*) ;;
    *) cp -L "$l" "$stage/lib/" ;;
  esac
done
cp "$adapters" "$stage/model.adapters"
tar -C "$stage" -cf - bin lib model.adapters | xz -9e -T0 >.dev/bin/strata.tar.xz
rm -rf "$stage"
if [ -n "$peer" ]; then
  mkdir -p .dev/c
  strip -o .dev/c/llama-bench "$peer"
  xz -T0 -6 -f .dev/c/llama-bench
fi
cat >.dev/unpack.sh <<UNPACK
#!/usr/bin/env bash
# Runs on the device machine: gathers the carried parts named in /root/dev.
set -euo pipefail
d=/root/dev
mkdir -p \$d
for part in "\$@"; do cp -r .dev/\$part/. \$d/; done
cd \$d
if [ -f strata.tar.xz ]; then tar -xJf strata.tar.xz && rm strata.tar.xz; fi
if [ -f llama-bench.xz ]; then xz -d -f llama-bench.xz && chmod +x llama-bench; fi
if [ -f model.0 ] && [ -f model.1 ]; then
  cat model.0 model.1 >model.gguf && rm model.0 model.1
  [ \$(stat -c %s model.gguf) = $size ] || { echo "model incomplete" >&2; exit 1; }
fi
ls -la \$d
UNPACK
du -sh .dev/*/
