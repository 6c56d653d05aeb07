#!/usr/bin/env bash
# Writes the default model requantized by llama.cpp's own llama-quantize into the mixes that
# published files use (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS, IQ4_NL, and a Q2_K file whose
# ffn_down really is Q2_K), for tests/engine/quant_files_test.cc: the tensor-type mixes come
# from llama.cpp's presets, not from Strata's own writer, so they test what users download.
#
#   scripts/make_quant_files.sh            # prints the directory of the files
#   STRATA_TEST_QUANT_DIR=$(scripts/make_quant_files.sh) build/tests/engine/engine_quant_files_tests
#
# llama-quantize is built once (about 5 minutes on 2 cores) from the llama.cpp tree vendored
# in the llama-cpp-python source package on PyPI (fetched with pip), the same version as the
# llama.cpp that docs/experiments compares speed against, static and without -march=native:
# only its quantization (portable C) is used. LLAMA_QUANTIZE=PATH uses an existing binary
# instead.
# Files go to $STRATA_HOME/quant (default ~/.cache/strata/quant); existing ones are kept,
# new ones appear only once written whole. Needs the default model (scripts/fetch_model.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
home="${STRATA_HOME:-$HOME/.cache/strata}"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
out="$home/quant"
model=$("$root/scripts/fetch_model.sh")

quantize="${LLAMA_QUANTIZE:-}"
if [ -z "$quantize" ]; then
  tools="$home/llama-quantize-$version"
  quantize="$tools/build/bin/llama-quantize"
  if [ ! -x "$quantize" ]; then
    mkdir -p "$tools"
    if [ ! -d "$tools/src" ]; then
      tmp=$(mktemp -d "$home/.sdist.XXXXXX")
      python3 -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$tmp" >&2
      tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
      mv "$tmp"/llama_cpp_python-*/ "$tools/src"
      rm -rf "$tmp"
    fi
    echo "make_quant_files: building llama-quantize $version (once)" >&2
    log="$tools/build.log"
    if ! { cmake -S "$tools/src/vendor/llama.cpp" -B "$tools/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF &&
      cmake --build "$tools/build" -j"$(nproc)" --target llama-quantize; } >"$log" 2>&1; then
      printf 'make_quant_files: building llama-quantize failed (log: %s):\n' "$log" >&2
      tail -40 "$log" >&2
      exit 1
    fi
  fi
fi

mkdir -p "$out"
# quant NAME [llama-quantize options] TYPE: writes $out/SmolLM2-135M-Instruct.NAME.gguf.
quant() {
  local name=$1
  shift
  local dest="$out/SmolLM2-135M-Instruct.$name.gguf"
  [ -s "$dest" ] && return 0
  local tmp="$dest.tmp" log
  if ! log=$("$quantize" --allow-requantize "${@:1:$#-1}" "$model" "$tmp" "${!#}" 2>&1); then
    rm -f "$tmp"
    printf 'make_quant_files: llama-quantize failed for %s:\n%s\n' "$name" "${log: -2000}" >&2
    exit 1
  fi
  mv "$tmp" "$dest"
}
for t in Q4_K_M Q5_K_M Q3_K_M Q2_K IQ4_XS IQ4_NL; do quant "$t" "$t"; done
# The Q2_K preset keeps ffn_down in Q3_K; this one forces Q2_K everywhere but the embedding.
quant Q2_K-ffn --pure --token-embedding-type q8_0 Q2_K
echo "$out"
