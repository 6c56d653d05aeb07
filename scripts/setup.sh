#!/usr/bin/env bash
# One step from a fresh Debian 12 machine to a working `strata`: packages, a Release build
# in build/, and the default model in $STRATA_HOME (default ~/.cache/strata).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)"
"$root/scripts/fetch_model.sh" >/dev/null
echo "setup: built $root/build/bin/strata; model in ${STRATA_HOME:-$HOME/.cache/strata}" >&2
