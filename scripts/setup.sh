#!/usr/bin/env bash
# One step from a fresh Debian 12 machine to a working `strata`: packages, a Release build
# in build/, the default model in $STRATA_HOME (default ~/.cache/strata) and its key
# adapters for the disk KV policy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)"
model=$("$root/scripts/fetch_model.sh")
# Key adapters for `--kv disk`, made once from the calibration excerpt (about a minute).
adapters="${model%.gguf}.adapters"
# Version 3 added each layer's attention profile; an older file is kept beside the new one.
version=0
[ -f "$adapters" ] && version=$(od -An -tu4 -j8 -N4 "$adapters" | tr -d ' ')
if [ "$version" -lt 3 ]; then
  [ -f "$adapters" ] && mv "$adapters" "$adapters.v$version"
  "$root/build/bin/strata" calibrate -m "$model" --text "$root/tuner/data/calibration.txt" \
    --text-fraction 1 --ratios 8,16,32 -o "$adapters" >&2
fi
echo "setup: built $root/build/bin/strata; model and adapters in ${model%/*}" >&2
