#!/usr/bin/env bash
# Sanitizer builds: ASan+UBSan over the unit tests, TSan over the threaded parts (thread
# pool, engine batching, storage, disk KV prediction, beam scheduling, the server's
# scheduler). The real-model integration tests are left to the Release run
# (scripts/test.sh): under ASan they take ten times longer and exercise the same code paths
# as the synthetic-model tests.
# Usage: scripts/sanitize.sh [asan|tsan|all]   (default all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
which="${1:-all}"

run() {
  local name=$1 flags=$2 regex=$3
  local build="$root/build-$name"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTRATA_SANITIZE="$flags" -DSTRATA_BUILD_BENCH=OFF >/dev/null
  cmake --build "$build" -j"$jobs"
  ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900 -LE real_model \
    ${regex:+-R "$regex"}
}

case "$which" in
  asan|all) run asan address,undefined "" ;;&
  tsan|all) run tsan thread "ThreadPool|Forward|Storage|Store|Backend|Batch|Beam|Search|Concurren|DiskKv|GroupPredictor|ServeScheduler" ;;
  asan|tsan|all) ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
