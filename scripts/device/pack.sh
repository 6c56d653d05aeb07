#!/usr/bin/env bash
# Packs what the GPU checks need for a lent device machine (see /work/.library/device), which
# receives the working tree plus at most 64 MiB of carried, git-ignored paths per call and
# keeps its files only while warm (about 30 s between calls). The model alone is 98 MB and
# the binaries need this machine's ICU, so the pack is three carries, sent by three calls in
# quick succession:
#
#   scripts/device/pack.sh                      # here, after building build/ in Release
#   run: bash .dev/a/unpack.sh                  carry [".dev/a"]
#   run: bash .dev/b/unpack.sh                  carry [".dev/b"]
#   run: bash .dev/c/unpack.sh && bash .dev/c/gpu_checks.sh    carry [".dev/c"]
#
# .dev/ is added to .git/info/exclude. The parts land in /root/dev on the device machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${STRATA_TEST_MODEL:-${STRATA_HOME:-$HOME/.cache/strata}/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${BUILD:-$root/build}
cd "$root"
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
rm -rf .dev && mkdir -p .dev/a .dev/b .dev/c/bin .dev/c/lib
size=$(stat -c %s "$model")
part() { dd if="$model" of="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
part .dev/a/model.0 0 28000000
part .dev/b/model.1 28000000 35000000
part .dev/c/model.2 63000000
cat .dev/a/model.0 .dev/b/model.1 .dev/c/model.2 | cmp -s - "$model" ||
  { echo "pack.sh: the model's parts do not add up to $model" >&2; exit 1; }
# Shared libraries the device image lacks (its ICU is another version, liburing is absent).
for lib in libicuuc.so.72 libicudata.so.72; do cp -L "/lib/x86_64-linux-gnu/$lib" .dev/a/; done
cp -L /lib/x86_64-linux-gnu/liburing.so.2 .dev/c/lib/
cp "$build/bin/strata" "$build/tests/cuda/cuda_tests" "$build/bench/search/bench_beam_search" \
  .dev/c/bin/
cp "$root/../shared/data/tinyshakespeare.txt" .dev/c/
cp "$root/scripts/device/gpu_checks.sh" .dev/c/
cat >.dev/unpack.sh <<UNPACK
#!/usr/bin/env bash
# Runs on the device machine: gathers the carried parts in /root/dev.
set -euo pipefail
d=/root/dev
mkdir -p \$d/lib
for part in .dev/a .dev/b .dev/c; do
  [ -d \$part ] || continue
  cp -r \$part/. \$d/
done
mv -f \$d/lib*.so.* \$d/lib/ 2>/dev/null || true
if [ -f \$d/model.0 ] && [ -f \$d/model.1 ] && [ -f \$d/model.2 ]; then
  cat \$d/model.0 \$d/model.1 \$d/model.2 >\$d/model.gguf
  [ \$(stat -c %s \$d/model.gguf) = $size ] || { echo "model incomplete" >&2; exit 1; }
fi
ls -la \$d
UNPACK
for p in a b c; do cp .dev/unpack.sh .dev/$p/unpack.sh; done
du -sh .dev/a .dev/b .dev/c
