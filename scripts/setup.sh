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
# Version 3 added each layer's attention profile, and the default key summary (sigma 4)
# needs ratio 4; a file without either is kept beside the new one.
version=0
has_ratio4=0
if [ -f "$adapters" ]; then
  version=$(od -An -tu4 -j8 -N4 "$adapters" | tr -d ' ')
  # Header: magic, version, identity, n_layer, n_head_kv, head_dim, tokens (40 bytes), the
  # note (u32 length + bytes), the set count, then (ratio, rank, has B) per set.
  note=$(od -An -tu4 -j40 -N4 "$adapters" | tr -d ' ')
  sets=$(od -An -tu4 -j$((44 + note)) -N4 "$adapters" | tr -d ' ')
  for ((i = 0; i < ${sets:-0}; i++)); do
    if [ "$(od -An -tu4 -j$((48 + note + 12 * i)) -N4 "$adapters" | tr -d ' ')" = 4 ]; then
      has_ratio4=1
    fi
  done
fi
if [ "$version" -lt 3 ] || [ "$has_ratio4" = 0 ]; then
  if [ -f "$adapters" ]; then
    keep="$adapters.v$version"
    n=1
    while [ -e "$keep" ]; do keep="$adapters.v$version.$((n++))"; done
    mv "$adapters" "$keep"
  fi
  "$root/build/bin/strata" calibrate -m "$model" --text "$root/tuner/data/calibration.txt" \
    --text-fraction 1 --ratios 4,8,16,32 -o "$adapters" >&2
fi
echo "setup: built $root/build/bin/strata; model and adapters in ${model%/*}" >&2
