#!/usr/bin/env bash
# Cross-builds the kernels and their tests for aarch64 (Debian's g++-aarch64-linux-gnu) and
# runs them under qemu-user twice: on a CPU with the dot-product extension (qemu's "max",
# the SDOT matmul) and on a Cortex-A53 (plain NEON, the HWCAP fallback). Exits non-zero on
# any build or test failure.
#
# Usage: scripts/test_aarch64.sh [build-dir]   (default: build-aarch64, wiped first)
# Needs: g++-aarch64-linux-gnu, qemu-user, libgtest-dev (sources in /usr/src/googletest).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-aarch64}"
jobs="${STRATA_JOBS:-2}"

for tool in aarch64-linux-gnu-g++ qemu-aarch64 cmake ninja; do
  command -v "$tool" >/dev/null || { echo "test_aarch64: $tool not found" >&2; exit 2; }
done

rm -rf "$build"
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" \
  -DSTRATA_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target kernels_tests -j "$jobs"

# qemu runs ~50x slower than native: the tests shrink their sweeps in quick mode.
export STRATA_KERNEL_TESTS_QUICK=1
status=0
for cpu in max cortex-a53; do
  echo "== kernels_tests on qemu-aarch64 -cpu $cpu"
  if ! qemu-aarch64 -cpu "$cpu" -L /usr/aarch64-linux-gnu "$build/tests/kernels/kernels_tests" \
      --gtest_brief=1; then
    echo "test_aarch64: kernels_tests failed on -cpu $cpu" >&2
    status=1
  fi
done
exit $status
