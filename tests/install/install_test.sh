#!/usr/bin/env bash
# install_test.sh BUILD_DIR THIS_DIR CC [SANITIZERS]: `cmake --install` into a fresh prefix,
# then build and run tests/install/consumer.c against it through find_package(strata) and
# pkg-config (with -fsanitize=SANITIZERS when the library was built with them).
set -euo pipefail
build=$1 here=$2 cc=$3 san=${4:-}
san_flags=""
[ -z "$san" ] || san_flags="-fsanitize=$san"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/strata/strata.h"

mkdir -p "$tmp/app"
cp "$here/consumer.c" "$tmp/app/"
cat >"$tmp/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(strata REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE strata::strata)
CM
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_FLAGS="$san_flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$san_flags" >/dev/null
cmake --build "$tmp/app/build" >/dev/null
"$tmp/app/build/consumer"

pc=$(find "$tmp/prefix" -name strata.pc)
export PKG_CONFIG_PATH="${pc%/*}"
flags=$(pkg-config --cflags --libs strata)
case "$flags" in *"$tmp/prefix"*) ;; *) echo "pkg-config flags miss the prefix: $flags" >&2; exit 1 ;; esac
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Werror -pedantic $san_flags "$tmp/app/consumer.c" -o "$tmp/app/consumer_pc" $flags
LD_LIBRARY_PATH="$(pkg-config --variable=libdir strata)" "$tmp/app/consumer_pc"
echo "install_test: find_package and pkg-config consumers built and ran"
