#!/usr/bin/env bash
# The test suite, as CI runs it: packages, model, formatting of the tracked sources
# (.clang-format), Release build with tests, no cycle between the libraries, every test
# (unit, real-model integration on the default model and on llama-quantize's mixes of it,
# the C program against the C API, the CLI's bad-input cases), a short libFuzzer run of the
# GGUF reader and the tokenizer, and the kernels built for aarch64 and run under qemu.
# Exits non-zero on the first failing stage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
stage() { printf '\n==== %s\n' "$*"; }

stage "dependencies and model"
"$root/scripts/install_deps.sh"
"$root/scripts/fetch_model.sh"
# llama-quantize's mixes of the model, for the real-file test (builds llama-quantize once).
quant_dir=$("$root/scripts/make_quant_files.sh")
export STRATA_TEST_QUANT_DIR="$quant_dir"

stage "formatting (clang-format --dry-run -Werror; fix with clang-format -i FILE)"
(cd "$root" && git ls-files -z '*.cc' '*.h' '*.cu' '*.c' | xargs -0 clang-format --dry-run -Werror)

stage "build (Release, warnings as errors)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$jobs"

stage "layering (no cycle between the project's libraries, from cmake --graphviz)"
mkdir -p "$root/build/graph"
cmake --graphviz="$root/build/graph/strata.dot" "$root/build" >/dev/null
python3 "$root/scripts/check_layering.py" "$root/build/graph/strata.dot" | tail -1

stage "tests"
ctest --test-dir "$root/build" --output-on-failure -j"$jobs" --timeout 900

stage "fuzz smoke (GGUF reader, tokenizer)"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}" "$root/scripts/fuzz_smoke.sh"

stage "aarch64 kernels under qemu"
"$root/scripts/test_aarch64.sh"

printf '\nall test stages passed\n'
